"""`EmbeddingMiss`: the inputs of one embeddings request that no entry answered, as a lease of the
one miss protocol (miss_flight.py), so identical batches in flight make one upstream call.

    lookup = embeddings.begin(body)                    each input looked up (embedding_cache.py)
    EmbeddingMiss(embeddings, lookup)
      flight_key   sha256 over the missing inputs' keys in order (the upstream body is a
                   function of them) and the version view the lookup read, so an answer
                   fetched before a model swap or an invalidation never answers a request
                   looked up after it; None with `no-cache` or an unreadable store
      answer       checks the upstream's answer (a malformed one fails every reader) and
                   splits its tokens and seconds among the inputs (embedding_request.py)
      close        the leader's: each fetched vector stored under the lookup's view
      close_shared a waiter's: the leader's vectors for its own inputs, counted `coalesced`
      reply        the answer for every input, in request order, with usage
Misses are counted per input at lookup, so a close without an answer counts nothing more.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from infercache.completion import Completion, Layer, Response
from infercache.embeddings.embedding_request import (
    CachedVector,
    EmbeddingLookup,
    EmbeddingResult,
    fetched_vectors,
)
from infercache.errors import StoreError
from infercache.keys import canonical_json
from infercache.miss_flight import ChunkSink, Fetched

FLIGHT_KEY_PREFIX = "ief1:"

CachedVectors = Mapping[str, CachedVector]


class EmbeddingRecords(Protocol):
    """What closing an EmbeddingMiss does in the EmbeddingCache that looked it up."""

    def record(self, lookup: EmbeddingLookup, vectors: CachedVectors) -> int: ...

    def shared(self, lookup: EmbeddingLookup, vectors: CachedVectors) -> None: ...

    def merged(
        self, lookup: EmbeddingLookup, vectors: CachedVectors, response: Response, stored: int
    ) -> EmbeddingResult: ...

    def store_failed(self, op: str, exc: StoreError) -> None: ...


class EmbeddingMiss:
    """The missing inputs of one lookup: a `miss_flight.MissLease`, closed exactly once."""

    __slots__ = ("_closed", "_lock", "_records", "_stored", "_vectors", "flight_key", "lookup")

    def __init__(self, records: EmbeddingRecords, lookup: EmbeddingLookup) -> None:
        self.lookup = lookup
        self.flight_key = _flight_key(lookup)
        self._records = records
        self._vectors: CachedVectors = {}
        self._stored = 0
        self._lock = threading.Lock()
        self._closed = False

    def answer(self, response: Response, upstream_s: float) -> Completion:
        self._vectors = fetched_vectors(self.lookup, response, upstream_s)  # UpstreamError
        return Completion(response, Layer.MISS, upstream_s=upstream_s)

    def reply(self, fetched: Completion) -> EmbeddingResult:
        return self._records.merged(self.lookup, self._vectors, fetched.response, self._stored)

    def close(self, response: Response | None, *, upstream_s: float = 0.0) -> bool:
        if not self._claim():
            return False
        if response is not None:
            self._stored = self._records.record(self.lookup, self._vectors)
        return True

    def close_shared(self, leader: Completion | None) -> EmbeddingResult | None:
        if not self._claim() or leader is None:
            return None
        vectors = fetched_vectors(self.lookup, leader.response, leader.upstream_s or 0.0)
        self._records.shared(self.lookup, vectors)
        return self._records.merged(self.lookup, vectors, leader.response, 0)

    def store_failed(self, exc: StoreError) -> None:
        self._records.store_failed("store", exc)

    def _claim(self) -> bool:
        with self._lock:
            first, self._closed = not self._closed, True
            return first


def _flight_key(lookup: EmbeddingLookup) -> str | None:
    view = lookup.view
    if view is None or lookup.request.directives.cache_control.no_cache:
        return None
    keys = [lookup.request.keys[pos] for pos in lookup.missing]
    scoped = canonical_json([view.model_version, list(view.tags), keys])
    return FLIGHT_KEY_PREFIX + hashlib.sha256(scoped).hexdigest()


# -- the upstream as a function of the body to send (the library; the gateway's embedder) --


class EmbeddingFunction:
    """A blocking embeddings upstream as the protocol's Source."""

    def __init__(self, fn: Callable[[dict[str, Any]], Response]) -> None:
        self._fn = fn

    def fetch(self, lease: EmbeddingMiss, sink: ChunkSink) -> Fetched:
        return Fetched(self._fn(_sent(lease)))


class AsyncEmbeddingFunction:
    """A coroutine embeddings upstream as the protocol's Source."""

    def __init__(self, fn: Callable[[dict[str, Any]], Awaitable[Response]]) -> None:
        self._fn = fn

    async def fetch(self, lease: EmbeddingMiss, sink: ChunkSink) -> Fetched:
        return Fetched(await self._fn(_sent(lease)))

    def observe(self, lease: EmbeddingMiss, response: Response) -> None:
        return None


def _sent(lease: EmbeddingMiss) -> dict[str, Any]:
    sent = lease.lookup.upstream_body
    assert sent is not None  # a lease is made only when inputs are missing
    return sent
