"""`Cache`: the path of one request through the layers, top-down, in one place.

    complete(request, upstream):
      1. parse: validate the body, split off the `infercache` directives   (request.py)
      2. policy: a sampled request without a seed → upstream, `uncacheable` (policy.py)
      3. `no-cache` → skip the lookup, call upstream, refresh the entry, `bypass`
      4. exact lookup: key, version view, entry, freshness                 (exact.py)
         hit → the stored answer, `exact`, with its age
      5. `only-if-cached` and no hit → NotCachedError
      6. miss → one upstream call per key in this process (single-flight); waiters get the
         leader's answer. The answer is stored only if complete and not `no-store`.
    The engine's KV prefix reuse sits underneath, inside the upstream.

The upstream is any function from a chat-completions body (directives stripped) to a response
body: an HTTP client, an in-process engine, a test double. Its exceptions propagate unchanged and
nothing is stored. A store failure is never the caller's problem: a counted miss.

`complete` and `acomplete` share every step but the upstream call and the coalescing.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from infercache.clock import Clock, SystemClock
from infercache.errors import InvalidRequestError, NotCachedError
from infercache.exact import ExactCache, Lookup
from infercache.metrics import Metrics, MissReason
from infercache.policy import usage_tokens
from infercache.request import ChatRequest, parse_request
from infercache.settings import Settings
from infercache.singleflight import AsyncSingleFlight, SingleFlight
from infercache.stores import Backend, open_store

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


@dataclass(frozen=True, slots=True)
class _Fetched:
    response: Response
    upstream_s: float


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
        self._flights: SingleFlight[_Fetched] = SingleFlight()
        self._aflights: AsyncSingleFlight[_Fetched] = AsyncSingleFlight()

    # -- the request path --

    def complete(self, request: dict[str, Any], upstream: Upstream) -> Completion:
        req, cacheable = self._admit(request)
        if not cacheable:
            return self._uncacheable(self._call_upstream(req, upstream))
        lookup = self._lookup(req)
        if lookup.entry is not None:
            return self._serve_hit(lookup)
        if req.directives.cache_control.only_if_cached:
            self._exact_metrics.miss(lookup.miss_reason or MissReason.ABSENT)
            raise NotCachedError("no fresh cached answer (only-if-cached)")
        if req.directives.cache_control.no_cache:
            fetched = self._fetch(req, lookup, upstream)
            return Completion(fetched.response, Layer.BYPASS, key=lookup.key)
        fetched, shared = self._flights.do(
            lookup.key, lambda: self._fetch(req, lookup, upstream)
        )
        return self._after_miss(lookup, fetched, shared)

    async def acomplete(self, request: dict[str, Any], upstream: AsyncUpstream) -> Completion:
        req, cacheable = self._admit(request)
        if not cacheable:
            return self._uncacheable(await self._acall_upstream(req, upstream))
        lookup = self._lookup(req)
        if lookup.entry is not None:
            return self._serve_hit(lookup)
        if req.directives.cache_control.only_if_cached:
            self._exact_metrics.miss(lookup.miss_reason or MissReason.ABSENT)
            raise NotCachedError("no fresh cached answer (only-if-cached)")
        if req.directives.cache_control.no_cache:
            fetched = await self._afetch(req, lookup, upstream)
            return Completion(fetched.response, Layer.BYPASS, key=lookup.key)

        async def leader() -> _Fetched:
            return await self._afetch(req, lookup, upstream)

        fetched, shared = await self._aflights.do(lookup.key, leader)
        return self._after_miss(lookup, fetched, shared)

    # -- steps shared by complete and acomplete --

    def _admit(self, request: dict[str, Any]) -> tuple[ChatRequest, bool]:
        """Parse and validate; also say whether the policy lets the request be cached."""
        req = parse_request(request)
        cc = req.directives.cache_control
        if cc.no_cache and cc.only_if_cached:
            raise InvalidRequestError(
                "cache_control no-cache and only-if-cached contradict each other",
                param="infercache.cache_control",
            )
        why_not = self.policy.uncacheable_reason(req)
        if why_not is not None:
            if cc.only_if_cached:
                self._exact_metrics.miss(MissReason.UNCACHEABLE)
                raise NotCachedError(f"request is not cacheable: {why_not}")
            self._exact_metrics.miss(MissReason.UNCACHEABLE)
            return req, False
        return req, True

    def _uncacheable(self, fetched: _Fetched) -> Completion:
        self._exact_metrics.prompt_tokens(usage_tokens(fetched.response)[0])
        return Completion(fetched.response, Layer.UNCACHEABLE)

    def _lookup(self, req: ChatRequest) -> Lookup:
        no_cache = req.directives.cache_control.no_cache
        lookup = self.exact.lookup(req, read_entry=not no_cache)
        if no_cache:
            self._exact_metrics.miss(MissReason.BYPASSED)
        return lookup

    def _serve_hit(self, lookup: Lookup) -> Completion:
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
        response: Response = json.loads(entry.response)
        return Completion(response, Layer.EXACT, age_s=self.exact.age_s(entry), key=lookup.key)

    def _after_miss(self, lookup: Lookup, fetched: _Fetched, shared: bool) -> Completion:
        if shared:
            # A waiter: its identical twin's upstream call answered it.
            prompt_tokens, completion_tokens = usage_tokens(fetched.response)
            model = str(fetched.response.get("model", ""))
            self._exact_metrics.hit(
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                upstream_s=fetched.upstream_s,
                money_usd=self.metrics.prices.cost_usd(model, prompt_tokens, completion_tokens),
            )
            self._exact_metrics.count("coalesced")
            return Completion(
                fetched.response, Layer.EXACT, age_s=0.0, key=lookup.key, coalesced=True
            )
        self._exact_metrics.miss(lookup.miss_reason or MissReason.ABSENT)
        return Completion(fetched.response, Layer.MISS, key=lookup.key)

    def _fetch(self, req: ChatRequest, lookup: Lookup, upstream: Upstream) -> _Fetched:
        fetched = self._call_upstream(req, upstream)
        self._store(req, lookup, fetched)
        return fetched

    def _call_upstream(self, req: ChatRequest, upstream: Upstream) -> _Fetched:
        started = self.clock.monotonic_s()
        response = upstream(dict(req.body))
        return _Fetched(response, self.clock.monotonic_s() - started)

    async def _afetch(
        self, req: ChatRequest, lookup: Lookup, upstream: AsyncUpstream
    ) -> _Fetched:
        fetched = await self._acall_upstream(req, upstream)
        self._store(req, lookup, fetched)
        return fetched

    async def _acall_upstream(self, req: ChatRequest, upstream: AsyncUpstream) -> _Fetched:
        started = self.clock.monotonic_s()
        response = await upstream(dict(req.body))
        return _Fetched(response, self.clock.monotonic_s() - started)

    def _store(self, req: ChatRequest, lookup: Lookup, fetched: _Fetched) -> None:
        prompt_tokens, _ = usage_tokens(fetched.response)
        self._exact_metrics.prompt_tokens(prompt_tokens)
        if not req.directives.cache_control.no_store:
            self.exact.store(lookup, req, fetched.response, upstream_s=fetched.upstream_s)

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
