"""`GET /healthz` (and `/health`): is the gateway alive, and is its cache store answering?

    {"status": "ok"}                                    the store answered a read just now
    {"status": "degraded", "store": "unreachable",      it did not (or its breaker is open):
     "detail": "..."}                                   requests are served, nothing is cached

Always HTTP 200: a degraded gateway still answers every request (a failing store never fails
one), so a liveness probe must not restart it; a readiness check that wants caching reads
`status`. The probe is one read of one meta value through the guarded store, off the event
loop and within the store budget (store_guard.py); while the breaker is open it costs nothing
and says degraded. The store's own error text is not shown (it may name internal hosts).
"""

from __future__ import annotations

from typing import Any

from infercache.errors import StoreError
from infercache.gateway.service import Gateway
from infercache.stores.base import EPOCH_META


async def health(gateway: Gateway) -> dict[str, Any]:
    """The body of `/healthz`, from one read of the store."""
    try:
        await gateway.store_io.off_loop(gateway.cache.backend.read_meta, [EPOCH_META])
    except StoreError:
        return {
            "status": "degraded",
            "store": "unreachable",
            "detail": "the cache store does not answer: requests are served, nothing is cached",
        }
    return {"status": "ok"}
