"""`GET /stats`: the gateway's JSON snapshot — per strategy, the store, the upstreams (each with
its prompt cache's tokens, read share and net money: prefix_usage.py), prefix breakers seen in
live traffic (live_breakers.py), flights,
model versions (each change with its evidence, each model's fingerprints: versions.py),
the semantic layer's mode (shadow or calibrated: pairs judged, would-be hit rate, the current
false-hit bound, serving or not) and the complaints received per layer that answered.
It reads the store: call it off the event loop (`gateway.store_io.off_loop`, store_guard.py)."""

from __future__ import annotations

import logging
from typing import Any

from infercache.errors import InfercacheError
from infercache.gateway.service import Gateway
from infercache.store_guard import GuardedBackend
from infercache.stores.redis_cluster import RedisClusterStore
from infercache.urls import mask_credentials

log = logging.getLogger(__name__)


def gateway_stats(gateway: Gateway) -> dict[str, Any]:
    snapshot = gateway.cache.metrics.snapshot()
    out: dict[str, Any] = dict(snapshot)
    backend = gateway.cache.backend
    try:
        store = backend.stats()
        out["store"] = {
            "url": mask_credentials(backend.url),
            "entries": store.entries,
            "bytes": store.bytes,
            "max_bytes": store.max_bytes,
        }
    except InfercacheError as exc:
        out["store"] = {"url": mask_credentials(backend.url), "error": "the store is unreadable"}
        log.warning("stats: store %s unreadable: %s", mask_credentials(backend.url), exc)
    prompt_caches = gateway.prefix_usage.snapshot()
    out["upstreams"] = [
        {"name": u.name, "in_flight": n, "health": health}
        for u, n, health in zip(
            gateway.upstreams, gateway.router.in_flight(), gateway.router.health(), strict=True
        )
    ]
    for upstream in out["upstreams"]:
        figures = prompt_caches.get(upstream["name"])
        if figures is not None:  # its prompt cache, as its answers reported it
            upstream["prompt_cache"] = figures.to_json()
    out["prefix_breakers"] = gateway.replicas.breakers.lines()  # the analyzer's words
    out["model_swaps"] = gateway.tracker.swaps
    out["versions"] = gateway.tracker.snapshot()  # what counts as a change, with its evidence
    if isinstance(backend, GuardedBackend):
        out["store"]["guard"] = backend.health()
    inner = backend.inner if isinstance(backend, GuardedBackend) else backend
    if isinstance(inner, RedisClusterStore):  # per node: its breaker, calls skipped
        out["store"]["cluster"] = inner.health()
    semantic = gateway.cache.semantic
    out["semantic"] = semantic.state() if semantic is not None else None
    out["feedback"] = _feedback(gateway, snapshot["strategies"])
    out["flights"] = len(gateway.flights)
    out["waiting"] = gateway.flights.waiting()
    return out


def _feedback(gateway: Gateway, strategies: dict[str, Any]) -> dict[str, Any]:
    """Complaints (`POST /v1/feedback`) per layer that served the answer reported wrong."""

    def counted(strategy: str, name: str) -> int:
        return int(strategies.get(strategy, {}).get("counters", {}).get(name, 0))

    return {
        "remembered_answers": len(gateway.cache.served),
        "complaints": {
            "semantic": counted("semantic", "complaints"),
            "exact": counted("exact", "complaints"),
            "fetched": counted("exact", "complaints_on_fetched"),
        },
    }
