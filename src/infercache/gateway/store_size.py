"""The store's size on `GET /metrics`, as gauges:

    infercache_store_entries      entries (exact answers, embeddings)
    infercache_store_bytes        bytes used (Redis: the server's used_memory)
    infercache_store_max_bytes    the configured bound (absent when the server bounds it)

A reading is reused for `max_age_s` (a Redis store counts its entries with a SCAN, too slow to
repeat on every scrape); an unreadable store exports no gauges and logs why. It reads the store:
`Metrics.to_prometheus` runs off the event loop (`gateway.store_io.off_loop`, store_guard.py).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from infercache.clock import Clock
from infercache.errors import InfercacheError
from infercache.stores import Backend, StoreStats
from infercache.urls import mask_credentials

log = logging.getLogger(__name__)


class StoreSize(Collector):
    def __init__(self, backend: Backend, clock: Clock, *, max_age_s: float = 30.0) -> None:
        self._backend = backend
        self._clock = clock
        self._max_age_s = max_age_s
        self._lock = threading.Lock()
        self._last: tuple[float, StoreStats] | None = None

    def _read(self) -> StoreStats | None:
        now = self._clock.monotonic_s()
        with self._lock:
            if self._last is not None and now - self._last[0] < self._max_age_s:
                return self._last[1]
        try:
            stats = self._backend.stats()
        except InfercacheError as exc:
            url = mask_credentials(self._backend.url)
            log.warning("metrics: store %s unreadable: %s", url, exc)
            return None
        with self._lock:
            self._last = (now, stats)
        return stats

    def collect(self) -> Iterator[Metric]:
        stats = self._read()
        if stats is None:
            return
        yield GaugeMetricFamily("infercache_store_entries", "Entries in the store", stats.entries)
        yield GaugeMetricFamily("infercache_store_bytes", "Bytes the store uses", stats.bytes)
        if stats.max_bytes is not None:
            yield GaugeMetricFamily(
                "infercache_store_max_bytes", "The store's configured bound", stats.max_bytes
            )
