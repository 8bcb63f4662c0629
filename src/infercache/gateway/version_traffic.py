"""Each live model version's traffic (issue 29 item 6): requests, hits and entries stored.

    infercache_version_requests_total{model, version}        requests looked up under it
    infercache_version_hits_total{model, version}            of them, answered by a cache layer
    infercache_version_entries_stored_total{model, version}  answers it produced that were
                                                             stored (complete, allowed)

`/stats` shows the same per version with its share of the model's requests and its hit rate
(`snapshot`). A request is counted under the version it was looked up under (its replica's,
versions.py); unversioned requests are not counted here (traffic.py counts every request).
Bounded: at most `max_series` (model, version) pairs, the first ones seen (versions come from
the upstreams, models from callers); later pairs are counted under none. Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

HIT_LAYERS = ("exact-hit", "semantic-hit")


class VersionTraffic(Collector):
    def __init__(self, max_series: int = 256) -> None:
        self._lock = threading.Lock()
        self._max = max_series
        self._counts: dict[tuple[str, str], list[int]] = {}  # requests, hits, stored

    def _series(self, model: str, version: str) -> list[int] | None:
        counts = self._counts.get((model, version))
        if counts is None and len(self._counts) < self._max:
            counts = self._counts[(model, version)] = [0, 0, 0]
        return counts

    def request(self, model: object, version: str | None, layer: str) -> None:
        """One request looked up under `version`, answered by `layer` (x-infercache)."""
        if version is None or not isinstance(model, str):
            return
        with self._lock:
            counts = self._series(model, version)
            if counts is not None:
                counts[0] += 1
                counts[1] += layer in HIT_LAYERS

    def stored(self, model: str, version: str | None) -> None:
        if version is None:
            return
        with self._lock:
            counts = self._series(model, version)
            if counts is not None:
                counts[2] += 1

    def snapshot(self) -> dict[str, dict[str, dict[str, Any]]]:
        """model → version → requests, hits, hit rate, share of the model's requests, stored."""
        with self._lock:
            counts = {k: list(v) for k, v in self._counts.items()}
        totals: dict[str, int] = {}
        for (model, _), (requests, _, _) in counts.items():
            totals[model] = totals.get(model, 0) + requests
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for (model, version), (requests, hits, stored) in sorted(counts.items()):
            out.setdefault(model, {})[version] = {
                "requests": requests,
                "hits": hits,
                "hit_rate": round(hits / requests, 4) if requests else None,
                "traffic_share": round(requests / totals[model], 4) if totals[model] else None,
                "entries_stored": stored,
            }
        return out

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts = sorted((k, list(v)) for k, v in self._counts.items())
        docs = (
            ("infercache_version_requests", "Requests looked up under a model version"),
            ("infercache_version_hits", "Requests under a model version a cache layer answered"),
            (
                "infercache_version_entries_stored",
                "Answers a model version produced that were stored",
            ),
        )
        for i, (name, doc) in enumerate(docs):
            family = CounterMetricFamily(name, doc, labels=["model", "version"])
            for (model, version), values in counts:
                family.add_metric([model, version], float(values[i]))
            yield family
