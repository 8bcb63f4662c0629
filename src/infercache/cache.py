"""`Cache`: the path of one request through the layers, top-down, in one place.

    begin(body) → Completion (a layer answered) | Miss (fetch it):
      1. parse: validate the body, split off the `infercache` directives   (request.py)
      2. policy: a sampled request without a seed → Miss `uncacheable`       (policy.py)
      3. `no-cache` → skip the lookup → Miss `bypass` (its answer refreshes the entry)
      4. exact lookup: key, version view, entry, freshness                 (exact.py)
         hit → the stored answer, `exact`, with its age
      5. semantic lookup, when enabled: a near-duplicate in the same exact scope whose answer
         is fresh and passes threshold and guards                        (semantic/layer.py)
         hit → its answer, `semantic`, with age and similarity; maybe verified in background
      6. `only-if-cached` and no hit → NotCachedError
    then the caller fetches the Miss upstream — identical misses in flight in this process
    share one call (single-flight) and the waiters count as hits — and calls
    finish(miss, response): count it; store it only if complete and not `no-store` (and index
    it for the semantic layer)
    abandon(miss): the upstream failed or the stream was cut; count it, store nothing.
    The engine's KV prefix reuse sits underneath, inside the upstream.

`complete` (threads) and `acomplete` (asyncio) are begin → fetch → finish with coalescing; the
gateway runs the same steps around its streaming upstream calls.

The upstream is any function from a chat-completions body (directives stripped) to a response
body: an HTTP client, an in-process engine, a test double. Its exceptions propagate unchanged and
nothing is stored. A store failure is never the caller's problem: a counted miss.

`complete` and `acomplete` share every step but the upstream call and the coalescing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from infercache.clock import Clock, SystemClock
from infercache.errors import InvalidRequestError, NotCachedError, StoreError
from infercache.exact import ExactCache, Lookup
from infercache.metrics import Metrics, MissReason
from infercache.policy import usage_tokens
from infercache.request import ChatRequest, parse_request
from infercache.semantic.embedder import Embedder
from infercache.semantic.guards import Guard
from infercache.semantic.index import IndexFactory
from infercache.semantic.layer import (
    Probe,
    SemanticConfig,
    SemanticHit,
    SemanticLayer,
)
from infercache.semantic.verify import Verifier
from infercache.settings import Settings
from infercache.singleflight import AsyncSingleFlight, SingleFlight
from infercache.stores import Backend, open_store

log = logging.getLogger(__name__)

Response = dict[str, Any]
Upstream = Callable[[dict[str, Any]], Response]
AsyncUpstream = Callable[[dict[str, Any]], Awaitable[Response]]


class Layer(StrEnum):
    EXACT = "exact"
    SEMANTIC = "semantic"
    MISS = "miss"
    BYPASS = "bypass"
    UNCACHEABLE = "uncacheable"


@dataclass(frozen=True, slots=True)
class Completion:
    response: Response
    layer: Layer
    age_s: float | None = None  # how old the served entry is (hits only)
    key: str | None = None
    coalesced: bool = False  # served the answer of an identical request in flight
    upstream_s: float | None = None  # how long the upstream took (answers fetched now)
    similarity: float | None = None  # cosine similarity in [-1, 1] of a semantic hit


@dataclass(frozen=True, slots=True)
class Miss:
    """A request no cache layer answered: the caller fetches it upstream, then `finish`es it
    (or `abandon`s it if the upstream failed or the stream was cut)."""

    request: ChatRequest
    layer: Layer  # MISS, BYPASS or UNCACHEABLE
    lookup: Lookup | None  # None when the request is not cacheable
    probe: Probe | None = None  # the semantic lookup's embedding, reused to index the answer

    @property
    def flight_key(self) -> str | None:
        """Identical in-flight misses share one upstream call under this key (None: never)."""
        return self.lookup.key if self.layer is Layer.MISS and self.lookup is not None else None


class Cache:
    """Thread-safe; one instance per process is enough. Build with `Cache(settings)`, or pass a
    backend, clock and metrics to share them (tests, the gateway)."""

    def __init__(
        self,
        settings: Settings,
        *,
        backend: Backend | None = None,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.metrics = metrics if metrics is not None else Metrics(settings.prices)
        self.backend = (
            backend
            if backend is not None
            else open_store(
                settings.resolved_store_url,
                clock=self.clock,
                max_bytes=settings.max_store_bytes,
            )
        )
        self.policy = settings.policy()
        self._exact_metrics = self.metrics.strategy("exact")
        self.exact = ExactCache(
            self.backend,
            policy=self.policy,
            clock=self.clock,
            metrics=self._exact_metrics,
            ignorable_fields=settings.ignorable_fields,
        )
        self._flights: SingleFlight[Completion] = SingleFlight()
        self._aflights: AsyncSingleFlight[Completion] = AsyncSingleFlight()
        self.semantic: SemanticLayer | None = None

    def enable_semantic(
        self,
        embedder: Embedder,
        *,
        config: SemanticConfig,
        guards: Sequence[Guard],
        index_factory: IndexFactory | None = None,
        verifier: Verifier | None = None,
    ) -> SemanticLayer:
        """Turn the semantic layer on (off by default: it carries a risk the exact layer does
        not), rebuilding its indexes from the store."""
        layer = SemanticLayer(
            self.backend,
            self.exact,
            embedder,
            config=config,
            guards=guards,
            metrics=self.metrics.strategy("semantic"),
            prices=self.metrics.prices,
            clock=self.clock,
            index_factory=index_factory,
            verifier=verifier,
        )
        try:
            layer.rebuild()
        except StoreError as exc:
            log.warning("semantic index starts empty, the store is unreadable: %s", exc)
        self.semantic = layer
        return layer

    # -- the request path, for library callers --

    def complete(self, request: dict[str, Any], upstream: Upstream) -> Completion:
        outcome = self.begin(request, verify=upstream)
        if isinstance(outcome, Completion):
            return outcome
        miss = outcome

        def fetch() -> Completion:
            started = self.clock.monotonic_s()
            response = upstream(dict(miss.request.body))
            return self.finish(miss, response, upstream_s=self.clock.monotonic_s() - started)

        try:
            done, shared = self._flights.do_or_run(miss.flight_key, fetch)
        except Exception:
            self.abandon(miss)
            raise
        return self.shared(miss, done) if shared else done

    async def acomplete(self, request: dict[str, Any], upstream: AsyncUpstream) -> Completion:
        outcome = self.begin(request)
        if isinstance(outcome, Completion):
            return outcome
        miss = outcome

        async def fetch() -> Completion:
            started = self.clock.monotonic_s()
            response = await upstream(dict(miss.request.body))
            return self.finish(miss, response, upstream_s=self.clock.monotonic_s() - started)

        try:
            done, shared = await self._aflights.do_or_run(miss.flight_key, fetch)
        except Exception:
            self.abandon(miss)
            raise
        return self.shared(miss, done) if shared else done

    # -- the steps, shared by complete, acomplete and the gateway's streaming path --

    def begin(
        self,
        body: dict[str, Any],
        *,
        tenant: str | None = None,
        verify: Upstream | None = None,
    ) -> Completion | Miss:
        """Parse, apply the policy, look the request up in each layer, top-down.

        Returns the answer when a layer has it, else the `Miss` to fetch. `tenant`, when given
        (an authenticated caller), overrides any tenant claimed in the body. `verify`: how to
        fetch a fresh answer when live verification samples a semantic hit (run in the
        background, never on this call's path).
        """
        req = parse_request(body, tenant=tenant)
        cc = req.directives.cache_control
        if cc.no_cache and cc.only_if_cached:
            raise InvalidRequestError(
                "cache_control no-cache and only-if-cached contradict each other",
                param="infercache.cache_control",
            )
        why_not = self.policy.uncacheable_reason(req)
        if why_not is not None:
            self._exact_metrics.miss(MissReason.UNCACHEABLE)
            if cc.only_if_cached:
                raise NotCachedError(f"request is not cacheable: {why_not}")
            return Miss(req, Layer.UNCACHEABLE, None)
        if cc.no_cache:
            self._exact_metrics.miss(MissReason.BYPASSED)
            return Miss(req, Layer.BYPASS, self.exact.lookup(req, read_entry=False))
        lookup = self.exact.lookup(req)
        if lookup.entry is not None:
            return self._exact_hit(lookup)
        probe = None
        if self.semantic is not None and lookup.view is not None:
            hit, probe = self.semantic.lookup(req, lookup.view)
            if hit is not None:
                self._exact_metrics.miss(lookup.miss_reason or MissReason.ABSENT)
                return self._semantic_hit(req, lookup, hit, verify)
        if cc.only_if_cached:
            self._exact_metrics.miss(lookup.miss_reason or MissReason.ABSENT)
            raise NotCachedError("no fresh cached answer (only-if-cached)")
        return Miss(req, Layer.MISS, lookup, probe)

    def finish(
        self,
        miss: Miss,
        response: Response,
        *,
        upstream_s: float,
        produced_by: str | None = None,
    ) -> Completion:
        """The upstream answered `miss`: count it, store it if allowed, return it.
        `produced_by`: the model version the upstream says produced it (see ExactCache.store).
        """
        self._exact_metrics.prompt_tokens(usage_tokens(response)[0])
        if miss.layer is Layer.MISS:
            assert miss.lookup is not None
            self._exact_metrics.miss(miss.lookup.miss_reason or MissReason.ABSENT)
        lookup = miss.lookup
        if lookup is not None and not miss.request.directives.cache_control.no_store:
            stored_under = self.exact.store(
                lookup, miss.request, response, upstream_s=upstream_s, produced_by=produced_by
            )
            if stored_under is not None and self.semantic is not None:
                self.semantic.store(miss.request, stored_under, lookup.key, miss.probe)
        return Completion(
            response,
            miss.layer,
            key=miss.lookup.key if miss.lookup else None,
            upstream_s=upstream_s,
        )

    def abandon(self, miss: Miss) -> None:
        """The upstream failed or the stream was cut: count the miss, store nothing."""
        if miss.layer is Layer.MISS:
            assert miss.lookup is not None
            self._exact_metrics.miss(miss.lookup.miss_reason or MissReason.ABSENT)

    def shared(self, miss: Miss, leader: Completion) -> Completion:
        """`miss` waited on an identical request in flight and got its answer: a hit."""
        prompt_tokens, completion_tokens = usage_tokens(leader.response)
        self._exact_metrics.hit(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            upstream_s=leader.upstream_s or 0.0,
            money_usd=self.metrics.prices.cost_usd(
                miss.request.model, prompt_tokens, completion_tokens
            ),
        )
        self._exact_metrics.count("coalesced")
        return Completion(leader.response, Layer.EXACT, age_s=0.0, key=leader.key, coalesced=True)

    def _semantic_hit(
        self, req: ChatRequest, lookup: Lookup, hit: SemanticHit, verify: Upstream | None
    ) -> Completion:
        assert self.semantic is not None
        response: Response = orjson.loads(hit.entry.response)
        if verify is not None:
            self.semantic.verify(req.body, response, hit.similarity, verify)
        if self.semantic.config.store_hits_as_exact:
            self.exact.store(lookup, req, response, upstream_s=hit.entry.upstream_s)
        return Completion(
            response,
            Layer.SEMANTIC,
            age_s=self.exact.age_s(hit.entry),
            key=hit.key,
            similarity=hit.similarity,
        )

    def _exact_hit(self, lookup: Lookup) -> Completion:
        entry = lookup.entry
        assert entry is not None
        self._exact_metrics.hit(
            prompt_tokens=entry.prompt_tokens,
            completion_tokens=entry.completion_tokens,
            upstream_s=entry.upstream_s,
            money_usd=self.metrics.prices.cost_usd(
                entry.model, entry.prompt_tokens, entry.completion_tokens
            ),
        )
        response: Response = orjson.loads(entry.response)
        return Completion(response, Layer.EXACT, age_s=self.exact.age_s(entry), key=lookup.key)

    # -- administration --

    def set_model_version(self, model: str, version: str) -> bool:
        """Make `version` current for `model`; every older entry becomes unreachable at once."""
        changed = self.exact.versions.set_model_version(model, version)
        if changed:
            self._exact_metrics.count("model_version_changes")
        return changed

    def model_version(self, model: str) -> str | None:
        return self.exact.versions.model_version(model)

    def invalidate(self, tags: Iterable[str]) -> int:
        """Make every entry depending on any of `tags` unreachable; return tags bumped."""
        n = self.exact.versions.invalidate(tags)
        self._exact_metrics.count("invalidated_tags", n)
        return n

    def stats(self) -> dict[str, Any]:
        return self.metrics.snapshot()

    def close(self) -> None:
        self.backend.close()
