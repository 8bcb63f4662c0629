"""`EmbeddingCache`: embeddings cached per input, so a batch with k new inputs out of n sends
only those k upstream. The pure steps are in embedding_request.py; this file does the store I/O.

    begin(body, tenant) → EmbeddingLookup                                  (store reads)
      1. parse and key each input                      (embedding_request.parse_embedding_request)
      2. read the version view once (the model's version token, the tags' generations), then
         each distinct key; an entry serves when unexpired, younger than `max_age_s` and
         recorded under the current model version and tag generations (freshness.py, as for
         chat); a stale one is deleted (lazy reclamation)
      3. count a hit or a miss (with its reason) per input, under the strategy `embeddings`
      → lookup.upstream_body: only the distinct missing inputs (None: every input hit)
    fetch_missing(lookup, source) / afetch_missing → EmbeddingResult
      4. the missing inputs as a lease (embedding_miss.py) of the one miss protocol
         (miss_flight.py): identical batches in flight share one call of the caller's
         upstream (an HTTP client, the engine, a test double); the leader's answer is checked
         and each fetched input given its share of tokens and seconds
      5. the leader stores each fetched vector under the view read in step 2, so a model swap
         or an invalidation during the call leaves it unreachable (`record`); a waiter counts
         the inputs it was given `coalesced` (`shared`)
      6. merge: every input's vector in request order, with usage        (embedding_request.merge)
    create(body, fn) / acreate: begin → fetch_missing with a function as the upstream

Embeddings are deterministic, so every request is cacheable; `cache_control` works as for chat
(`no-cache` skips the reads, `no-store` the writes, `only-if-cached` raises NotCachedError when
any input is missing). Entries carry the TTL policy of the chat entries. A store failure is a
counted `store_error` miss, never the caller's problem. Thread-safe: no state beyond the
backend's and the flights in progress.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from infercache.completion import Completion
from infercache.embeddings.embedding_miss import (
    AsyncEmbeddingFunction,
    EmbeddingFunction,
    EmbeddingMiss,
)
from infercache.embeddings.embedding_request import (
    STRATEGY,
    CachedVector,
    EmbeddingLookup,
    EmbeddingRequest,
    EmbeddingResult,
    fetched_vectors,
    merge,
    parse_embedding_request,
)
from infercache.errors import NotCachedError, StoreError, StoreUnavailableError
from infercache.exact import StoreLayer
from infercache.flight import FlightTable
from infercache.freshness import stale_reason, too_old
from infercache.metrics import MissReason, PriceTable
from infercache.miss_flight import Source, SyncSource, coalesce, coalesce_sync
from infercache.store_guard import StoreIO
from infercache.stores.base import Entry
from infercache.versions import VersionView

if TYPE_CHECKING:
    from infercache.cache import Cache

log = logging.getLogger(__name__)


@dataclass(eq=False, repr=False)
class EmbeddingCache(StoreLayer):
    """Per-input embeddings on any backend, beside the chat entries (keys never collide:
    their prefixes differ). `EmbeddingCache.of(cache)` shares a `Cache`'s store, clock, TTL
    policy and metrics (strategy `embeddings`)."""

    _: KW_ONLY
    prices: PriceTable
    flights: FlightTable[Completion] = field(default_factory=FlightTable)
    store_io: StoreIO | None = None  # where store I/O runs; None: the backend's own
    io: StoreIO = field(init=False)  # `store_io`, or the backend's own

    def __post_init__(self) -> None:
        StoreLayer.__post_init__(self)
        self.io = self.store_io if self.store_io is not None else StoreIO(self.backend)

    @classmethod
    def of(cls, cache: Cache) -> EmbeddingCache:
        return cls(
            cache.backend,
            policy=cache.policy,
            clock=cache.clock,
            metrics=cache.metrics.strategy(STRATEGY),
            prices=cache.metrics.prices,
            ignorable_fields=cache.settings.ignorable_fields,
            flights=cache.flights,
            store_io=cache.store_io,
        )

    # -- the two steps around the upstream call --

    def begin(self, body: object, *, tenant: str | None = None) -> EmbeddingLookup:
        """Parse, then find each distinct input's fresh entry. Raises InvalidRequestError, and
        NotCachedError for `only-if-cached` with an input missing."""
        request = parse_embedding_request(body, tenant=tenant, ignorable=self.ignorable_fields)
        started = self.clock.monotonic_s()
        cc = request.directives.cache_control
        view, found, why = self._read(request, read_entries=not cc.no_cache)
        self.metrics.overhead(self.clock.monotonic_s() - started)
        first: dict[str, int] = {}
        for pos, key in enumerate(request.keys):
            first.setdefault(key, pos)
        missing = tuple(pos for key, pos in first.items() if key not in found)
        lookup = EmbeddingLookup(request, view, found, missing)
        self._count(lookup, why)
        if missing and cc.only_if_cached:
            raise NotCachedError(f"{len(missing)} embedding input(s) not cached (only-if-cached)")
        return lookup

    def finish(
        self, lookup: EmbeddingLookup, response: Mapping[str, Any] | None, *, upstream_s: float
    ) -> EmbeddingResult:
        """Merge the upstream's answer for `lookup.upstream_body` (None when there was
        nothing to fetch) with the hits, and store the fetched vectors (outside any flight)."""
        if response is None:
            if lookup.missing:
                raise ValueError("finish(None) with inputs missing: fetch upstream_body first")
            return self.merged(lookup, {}, {}, 0)
        vectors = fetched_vectors(lookup, response, upstream_s)
        return self.merged(lookup, vectors, response, self.record(lookup, vectors))

    def fetch_missing(self, lookup: EmbeddingLookup, source: SyncSource[Any]) -> EmbeddingResult:
        """The answer for every input, the missing ones fetched through the one miss protocol
        from this thread (module docstring)."""
        if lookup.upstream_body is None:
            return self.finish(lookup, None, upstream_s=0.0)
        miss = EmbeddingMiss(self, lookup)
        return coalesce_sync(miss, self.flights, source, self.clock).wait()

    async def afetch_missing(self, lookup: EmbeddingLookup, source: Source[Any]) -> EmbeddingResult:
        """`fetch_missing` on an event loop; the store writes where `store_io` says."""
        if lookup.upstream_body is None:
            return self.finish(lookup, None, upstream_s=0.0)
        miss = EmbeddingMiss(self, lookup)
        return await coalesce(miss, self.flights, source, self.io, self.clock).answer()

    # -- conveniences for library callers --

    def create(
        self,
        body: dict[str, Any],
        upstream: Callable[[dict[str, Any]], dict[str, Any]],
        *,
        tenant: str | None = None,
    ) -> EmbeddingResult:
        return self.fetch_missing(self.begin(body, tenant=tenant), EmbeddingFunction(upstream))

    async def acreate(
        self,
        body: dict[str, Any],
        upstream: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
        *,
        tenant: str | None = None,
    ) -> EmbeddingResult:
        """`create` for asyncio; the store I/O where `store_io` says (store_guard.py)."""
        lookup = await self.io.read(self.begin, body, tenant=tenant)
        return await self.afetch_missing(lookup, AsyncEmbeddingFunction(upstream))

    # -- what closing an EmbeddingMiss does (embedding_miss.EmbeddingRecords) --

    def record(self, lookup: EmbeddingLookup, vectors: Mapping[str, CachedVector]) -> int:
        """Count the fetched inputs' tokens and store their vectors; how many were stored."""
        self._prompt_tokens(lookup, vectors)
        if lookup.view is None or lookup.request.directives.cache_control.no_store:
            return 0
        return self._store(lookup, vectors)

    def shared(self, lookup: EmbeddingLookup, vectors: Mapping[str, CachedVector]) -> None:
        """Another request in flight fetched these inputs for this one."""
        self._prompt_tokens(lookup, vectors)
        self.metrics.count("coalesced", len(vectors))

    def merged(
        self,
        lookup: EmbeddingLookup,
        vectors: Mapping[str, CachedVector],
        response: Mapping[str, Any],
        stored: int,
    ) -> EmbeddingResult:
        model = response.get("model")
        answer = merge(lookup, vectors, model if isinstance(model, str) else None)
        return EmbeddingResult(answer, lookup.hits, len(vectors), stored)

    def _prompt_tokens(self, lookup: EmbeddingLookup, vectors: Mapping[str, CachedVector]) -> None:
        positions = Counter(lookup.request.keys)
        for key, vector in vectors.items():
            self.metrics.prompt_tokens(vector.prompt_tokens * positions[key])

    # -- store I/O --

    def _read(
        self, request: EmbeddingRequest, *, read_entries: bool
    ) -> tuple[VersionView | None, dict[str, CachedVector], dict[str, MissReason]]:
        """(the view, the fresh entries by key, why each other key missed)."""
        found: dict[str, CachedVector] = {}
        why: dict[str, MissReason] = {}
        try:
            view = self.versions.view(request.model, request.directives.tags)
            now_s, max_age_s = self.clock.now_s(), request.directives.max_age_s
            for key in dict.fromkeys(request.keys):
                entry = self.backend.get(key) if read_entries else None
                if entry is None:
                    why[key] = MissReason.ABSENT if read_entries else MissReason.BYPASSED
                elif (stale := stale_reason(entry, view, now_s)) is not None:
                    why[key] = stale
                    self._delete(key)  # gone for every request: lazy reclamation
                elif too_old(entry, now_s, max_age_s):
                    why[key] = MissReason.EXPIRED  # fresh for others, too old for this caller
                else:
                    found[key] = self._vector(entry)
        except StoreError as exc:
            self.store_failed("lookup", exc)
            unavailable = isinstance(exc, StoreUnavailableError)
            reason = MissReason.STORE_UNAVAILABLE if unavailable else MissReason.STORE_ERROR
            return None, {}, dict.fromkeys(request.keys, reason)
        return view, found, why

    def _delete(self, key: str) -> None:
        try:
            self.backend.delete(key)
        except StoreError as exc:
            self.store_failed("delete", exc)

    def _vector(self, entry: Entry) -> CachedVector:
        try:
            stored = orjson.loads(entry.response)
            embedding, model = stored["embedding"], str(stored["model"])
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise StoreError(f"undecodable embedding entry: {exc}") from exc
        return CachedVector(
            embedding=embedding,
            model=model,
            prompt_tokens=entry.prompt_tokens,
            upstream_s=entry.upstream_s,
            age_s=max(0.0, self.clock.now_s() - entry.created_at_s),
        )

    def _store(self, lookup: EmbeddingLookup, fetched: Mapping[str, CachedVector]) -> int:
        assert lookup.view is not None
        started = self.clock.monotonic_s()
        d = lookup.request.directives
        ttl_s = min(d.ttl_s if d.ttl_s is not None else self.policy.default_ttl_s,
                    self.policy.max_ttl_s)  # fmt: skip
        now_s = self.clock.now_s()
        stored = 0
        try:
            for key, vector in fetched.items():
                body = {"embedding": vector.embedding, "model": vector.model}
                entry = Entry(
                    response=orjson.dumps(body),
                    model=lookup.request.model,
                    model_version=lookup.view.model_version,
                    tags=lookup.view.tags,
                    created_at_s=now_s,
                    expires_at_s=now_s + ttl_s,
                    upstream_s=vector.upstream_s,
                    prompt_tokens=vector.prompt_tokens,
                    completion_tokens=0,
                )
                self.backend.put(key, entry)
                stored += 1
        except StoreError as exc:
            self.store_failed("store", exc)
        finally:
            self.metrics.overhead(self.clock.monotonic_s() - started)
        self.metrics.count("stored", stored)
        return stored

    def _count(self, lookup: EmbeddingLookup, why: Mapping[str, MissReason]) -> None:
        model = lookup.request.model
        for key in lookup.request.keys:
            hit = lookup.found.get(key)
            if hit is None:
                self.metrics.miss(why[key])
                continue
            self.metrics.prompt_tokens(hit.prompt_tokens)
            self.metrics.hit(
                prompt_tokens=hit.prompt_tokens,
                completion_tokens=0,
                upstream_s=hit.upstream_s,
                money_usd=self.prices.cost_usd(model, hit.prompt_tokens, 0),
            )

    def store_failed(self, op: str, exc: StoreError) -> None:
        if isinstance(exc, StoreUnavailableError):
            self.metrics.count("store_unavailable")
            log.debug("embedding store skipped on %s: %s", op, exc)
            return
        self.metrics.count("store_errors")
        log.warning("embedding store failed on %s, serving without it: %s", op, exc)
