"""Each replica's own load, read from its Prometheus `/metrics` in the background.

One asyncio task per replica that can report (`MetricsSource`: an HTTP upstream) reads its
`/metrics` every `load_poll_s` (RouterConfig) and hands the router what it found
(`PrefixRouter.report_load`); nothing of this runs on a request's path. The series read:

    vLLM      vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc
              (a fraction despite its name; vllm:gpu_cache_usage_perc before v0.10)
    SGLang    sglang:num_queue_reqs, sglang:num_running_reqs, sglang:token_usage
    built-in  the engine's queue and running gauges (`ENGINE_WAITING`, `ENGINE_RUNNING`: the
              names its server exports, kept here only), and whether it has a shared KV tier
              (`SHARED_KV`, the series with `tier="shared"`: the router counts a prefix in that
              tier as warm on the replica)

Several series of one name (one per model or data-parallel rank) are summed (requests) or
maxed (KV usage). A page with no waiting series is no report. A read that fails (unreachable,
an error status, a page that does not parse) reports "unknown" and the next read waits twice
as long, up to `MAX_BACKOFF_S`: a server without `/metrics` (a provider) is asked rarely. A
failed read never ejects a replica; only a failed request does (router.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from prometheus_client.parser import text_string_to_metric_families

from infercache.errors import InfercacheError
from infercache.gateway.router import PrefixRouter, ReplicaLoad

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 60.0


# The built-in engine's gauges, as its server exports them (metrics.py, prometheus.py).
ENGINE_WAITING = "infercache_engine_requests_waiting"
ENGINE_RUNNING = "infercache_engine_requests_running"

SHARED_KV = "infercache_kv_tier_enabled"

WAITING = frozenset({"vllm:num_requests_waiting", "sglang:num_queue_reqs", ENGINE_WAITING})
RUNNING = frozenset({"vllm:num_requests_running", "sglang:num_running_reqs", ENGINE_RUNNING})
KV_USAGE = frozenset(
    {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"}
)


def parse_load(text: str) -> ReplicaLoad | None:
    """The load a `/metrics` page reports; None when it has no waiting series. Raises
    ValueError on a page that is not Prometheus text."""
    waiting: float | None = None
    running: float | None = None
    kv_usage: float | None = None
    shared_kv = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = float(sample.value)
            if math.isnan(value):
                continue
            if sample.name in WAITING:
                waiting = (waiting or 0.0) + value
            elif sample.name in RUNNING:
                running = (running or 0.0) + value
            elif sample.name in KV_USAGE:
                kv_usage = value if kv_usage is None else max(kv_usage, value)
            elif sample.name == SHARED_KV and sample.labels.get("tier") == "shared":
                shared_kv = value > 0
    if waiting is None:
        return None
    return ReplicaLoad(waiting=waiting, running=running, kv_usage=kv_usage, shared_kv=shared_kv)


@runtime_checkable
class MetricsSource(Protocol):
    """A replica that serves a Prometheus `/metrics` page (upstream.HTTPUpstream)."""

    async def metrics_text(self) -> str: ...


class LoadPoller:
    """Reads every reporting replica's load into `router`, one task per replica."""

    def __init__(
        self,
        router: PrefixRouter[Any],
        replicas: Sequence[object],
        *,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._router = router
        self._sources = {
            i: r for i, r in enumerate(replicas) if isinstance(r, MetricsSource)
        }  # only several replicas need a choice made between them
        if len(replicas) < 2:
            self._sources = {}
        self._sleep = sleep
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def polled(self) -> list[int]:
        return sorted(self._sources)

    def start(self) -> None:
        """Start polling on the running loop (once; the gateway's start-up calls it)."""
        if self._tasks:
            return
        self._tasks = [asyncio.ensure_future(self._poll_forever(i)) for i in sorted(self._sources)]

    async def poll_once(self, index: int) -> bool:
        """Read replica `index`'s load into the router; whether the read succeeded."""
        source = self._sources[index]
        try:
            load = parse_load(await source.metrics_text())
        except (InfercacheError, ValueError, UnicodeDecodeError) as exc:
            log.debug("replica %d load unknown: %s", index, exc)
            self._router.report_load(index, None)
            return False
        self._router.report_load(index, load)
        return True

    async def _poll_forever(self, index: int) -> None:
        every_s = self._router.config.load_poll_s
        wait_s = every_s
        while True:
            ok = await self.poll_once(index)
            wait_s = every_s if ok else min(wait_s * 2, MAX_BACKOFF_S)
            await self._sleep(wait_s)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
