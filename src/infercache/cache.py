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
    A `Miss` is a lease its owner closes exactly once (a second close does nothing):
      miss.close(response): fetched: count it; store it only if complete and not `no-store`
                            (and index it for the semantic layer)
      miss.close(None):     the upstream failed or the stream was cut: count it, store nothing
      miss.close_shared(leader | None): an identical request in flight fetched it (flight.py):
                            a coalesced hit, or a miss when that call failed
    The engine's KV prefix reuse sits underneath, inside the upstream.
Every answer a cache entry holds is remembered by response id and tenant (served_answers.py),
so `report_wrong(response_id)` can retire the entry that served it, at once, and charge the
complaint to the layer that answered: a semantic hit's complaint feeds that answer's
statistics and the layer's threshold or calibration (SemanticLayer.report_wrong); an exact
hit's or a fetched answer's only retires the entry (and its semantic record, so no paraphrase
is served it either): the upstream answered that very question, no cache decision was wrong.

`complete` (threads) and `acomplete` (asyncio) are begin → lead or join the flight for the key
→ fetch → close, on the same coalescing primitive (flight.py) the gateway uses around its
streaming upstream calls.

The upstream is any function from a chat-completions body (directives stripped) to a response
body: an HTTP client, an in-process engine, a test double. Its exceptions propagate unchanged and
nothing is stored. A store failure is never the caller's problem: a counted miss.

`complete` and `acomplete` share every step but the upstream call itself.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from enum import StrEnum
from typing import Any, NamedTuple, TypeVar

import orjson

from infercache.clock import Clock, SystemClock
from infercache.errors import InvalidRequestError, NotCachedError, StoreError
from infercache.exact import ExactCache, Lookup
from infercache.flight import Flight, FlightTable
from infercache.metrics import Metrics, MissReason
from infercache.policy import usage_tokens
from infercache.request import ChatRequest, Endpoint, parse_request
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
from infercache.served_answers import (
    SemanticServing,
    ServedAnswers,
    ServedBy,
    retire_reported,
)
from infercache.settings import Settings
from infercache.stores import Backend, open_store
from infercache.stores.memory import MemoryStore

log = logging.getLogger(__name__)

T = TypeVar("T")

Response = dict[str, Any]
# What the library calls on a miss: a chat-completions body in, a response body out.
ChatFn = Callable[[dict[str, Any]], Response]
AsyncChatFn = Callable[[dict[str, Any]], Awaitable[Response]]


class Layer(StrEnum):
    EXACT = "exact"
    SEMANTIC = "semantic"
    MISS = "miss"
    BYPASS = "bypass"
    UNCACHEABLE = "uncacheable"


class Completion(NamedTuple):  # a NamedTuple, not a frozen dataclass: built on every hit
    response: Response
    layer: Layer
    age_s: float | None = None  # how old the served entry is (hits only)
    key: str | None = None
    coalesced: bool = False  # served the answer of an identical request in flight
    upstream_s: float | None = None  # how long the upstream took (answers fetched now)
    similarity: float | None = None  # cosine similarity in [-1, 1] of a semantic hit
    raw: bytes | None = None  # `response` as JSON, as the store holds it (hits): replayed as is


class Miss:
    """A request no cache layer answered: a lease on its lookup that its owner closes exactly
    once, with the fetched response (`close`), the answer of an identical request in flight
    (`close_shared`), or None when there is no answer. Later closes do nothing and return None.
    """

    __slots__ = ("_cache", "_closed", "_lock", "layer", "lookup", "probe", "request")

    def __init__(
        self,
        cache: Cache,
        request: ChatRequest,
        layer: Layer,
        lookup: Lookup | None,
        probe: Probe | None = None,
    ) -> None:
        self.request = request
        self.layer = layer  # MISS, BYPASS or UNCACHEABLE
        self.lookup = lookup  # None when the request is not cacheable
        self.probe = probe  # the semantic lookup's embedding, reused to index the answer
        self._cache = cache
        self._lock = threading.Lock()
        self._closed = False

    @property
    def flight_key(self) -> str | None:
        """Identical in-flight misses share one upstream call under this key (None: never)."""
        return self.lookup.key if self.layer is Layer.MISS and self.lookup is not None else None

    @property
    def closed(self) -> bool:
        return self._closed

    def answer(self, response: Response, upstream_s: float) -> Completion:
        """The Completion this Miss's fetched `response` is served as (nothing counted or
        stored: that is `close`)."""
        key = self.lookup.key if self.lookup is not None else None
        return Completion(response, self.layer, key=key, upstream_s=upstream_s)

    def _claim(self) -> bool:
        with self._lock:
            first, self._closed = not self._closed, True
            return first

    def close(
        self,
        response: Response | None,
        *,
        upstream_s: float = 0.0,
        produced_by: str | None = None,
    ) -> Completion | None:
        """The upstream answered (`response`) or did not (None). `produced_by`: the model
        version the upstream says produced it (see ExactCache.store)."""
        if not self._claim():
            return None
        if response is None:
            self._cache._abandon(self)
            return None
        return self._cache._finish(self, response, upstream_s, produced_by)

    def close_shared(self, leader: Completion | None) -> Completion | None:
        """An identical request in flight fetched `leader` for this one (None: it failed)."""
        if not self._claim():
            return None
        if leader is None:
            self._cache._abandon(self)
            return None
        return self._cache._shared(self, leader)


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
        self.flights: FlightTable[Completion] = FlightTable()
        self.semantic: SemanticLayer | None = None
        self.served = ServedAnswers(
            max_answers=settings.feedback_max_answers,
            ttl_s=settings.feedback_ttl_s,
            clock=self.clock,
        )

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

    def complete(self, request: dict[str, Any], upstream: ChatFn) -> Completion:
        outcome = self.begin(request, verify=upstream)
        if isinstance(outcome, Completion):
            return outcome
        miss = outcome
        flight, leader = self.flights.lead_or_join(miss.flight_key)
        if not leader:
            return self._join(miss, flight.wait)
        done: Completion | None = None
        error: BaseException | None = None
        try:
            started = self.clock.monotonic_s()
            response = upstream(dict(miss.request.body))
            done = miss.close(response, upstream_s=self.clock.monotonic_s() - started)
            return _closed(done)
        except BaseException as exc:
            error = exc
            raise
        finally:
            miss.close(None)  # no-op unless the upstream (or the close) raised
            flight.settle(done, error)

    async def acomplete(self, request: dict[str, Any], upstream: AsyncChatFn) -> Completion:
        """`complete` for asyncio: the same layers, live verification included (its fetch runs
        `upstream` on this loop from the verifier's thread), with the store and the embedder
        kept off the event loop."""
        loop = asyncio.get_running_loop()

        async def call(body: dict[str, Any]) -> Response:
            return await upstream(body)

        def verify(body: dict[str, Any]) -> Response:
            return asyncio.run_coroutine_threadsafe(call(body), loop).result()

        outcome = await self._off_loop(self.begin, request, verify=verify)
        if isinstance(outcome, Completion):
            return outcome
        miss = outcome
        flight, leader = self.flights.lead_or_join(miss.flight_key)
        if not leader:
            try:
                return _closed(miss.close_shared(await flight.result()))
            finally:
                miss.close_shared(None)  # no-op unless the flight failed or we were cancelled
        # The fetch runs as its own task: a caller that is cancelled (a client hanging up)
        # cancels only its own wait, never the call the others are waiting on.
        task = asyncio.ensure_future(self._afetch(miss, flight, upstream))
        task.add_done_callback(_retrieve)
        return await asyncio.shield(task)

    async def _afetch(
        self, miss: Miss, flight: Flight[Completion], upstream: AsyncChatFn
    ) -> Completion:
        done: Completion | None = None
        error: BaseException | None = None
        try:
            started = self.clock.monotonic_s()
            response = await upstream(dict(miss.request.body))
            upstream_s = self.clock.monotonic_s() - started
            done = await self._off_loop(miss.close, response, upstream_s=upstream_s)
            return _closed(done)
        except BaseException as exc:
            error = exc
            raise
        finally:
            miss.close(None)
            flight.settle(done, error)

    async def _off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn` in a thread when it may block (store I/O, embedding); inline when the
        store is this process's memory and no embedder runs."""
        if self.semantic is None and isinstance(self.backend, MemoryStore):
            return fn(*args, **kwargs)
        return await asyncio.to_thread(fn, *args, **kwargs)

    def _join(self, miss: Miss, wait: Callable[[], Completion]) -> Completion:
        """Wait for an identical request's answer: a coalesced hit (or its error)."""
        try:
            return _closed(miss.close_shared(wait()))
        finally:
            miss.close_shared(None)

    # -- the steps, shared by complete, acomplete and the gateway's streaming path --

    def begin(
        self,
        body: dict[str, Any],
        *,
        tenant: str | None = None,
        verify: ChatFn | None = None,
        endpoint: Endpoint = Endpoint.CHAT,
    ) -> Completion | Miss:
        """Parse, apply the policy, look the request up in each layer, top-down.

        Returns the answer when a layer has it, else the `Miss` to fetch. `tenant`, when given
        (an authenticated caller), overrides any tenant claimed in the body. `verify`: how to
        fetch a fresh answer when live verification samples a semantic hit (run in the
        background, never on this call's path).
        """
        req = parse_request(body, tenant=tenant, endpoint=endpoint)
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
            return Miss(self, req, Layer.UNCACHEABLE, None)
        if cc.no_cache:
            # Read first: a read that gives way (StoreWouldBlockError) is retried, counted once.
            refresh = self.exact.lookup(req, read_entry=False)
            self._exact_metrics.miss(MissReason.BYPASSED)
            return Miss(self, req, Layer.BYPASS, refresh)
        lookup = self.exact.lookup(req)
        if lookup.entry is not None:
            return self._exact_hit(req, lookup)
        probe = None
        if self.semantic is not None and lookup.view is not None and endpoint is Endpoint.CHAT:
            hit, probe = self.semantic.lookup(req, lookup.view)
            if hit is not None:
                self._exact_metrics.miss(lookup.miss_reason or MissReason.ABSENT)
                return self._semantic_hit(req, lookup, hit, verify)
        if cc.only_if_cached:
            self._exact_metrics.miss(lookup.miss_reason or MissReason.ABSENT)
            raise NotCachedError("no fresh cached answer (only-if-cached)")
        return Miss(self, req, Layer.MISS, lookup, probe)

    def finish(self, miss: Miss, response: Response, *, upstream_s: float) -> Completion:
        """`miss.close(response)` for callers that replay a log (the analyzer)."""
        return _closed(miss.close(response, upstream_s=upstream_s))

    # -- closing a Miss (called by Miss.close and Miss.close_shared, once per Miss) --

    def _finish(
        self, miss: Miss, response: Response, upstream_s: float, produced_by: str | None
    ) -> Completion:
        prompt_tokens = usage_tokens(response)[0]
        self._exact_metrics.prompt_tokens(prompt_tokens)
        if miss.probe is not None and self.semantic is not None:
            self.semantic.metrics.prompt_tokens(prompt_tokens)  # the semantic layer looked too
        lookup = miss.lookup
        if miss.layer is Layer.MISS and lookup is not None:
            self._exact_metrics.miss(lookup.miss_reason or MissReason.ABSENT)
        if lookup is not None and not miss.request.directives.cache_control.no_store:
            stored_under = self.exact.store(
                lookup, miss.request, response, upstream_s=upstream_s, produced_by=produced_by
            )
            if stored_under is not None and self.semantic is not None:
                self.semantic.store(miss.request, stored_under, lookup.key, miss.probe)
            if stored_under is not None:
                self._remember(miss.request, response, ServedBy.FETCHED, (lookup.key,))
        return miss.answer(response, upstream_s)

    def _abandon(self, miss: Miss) -> None:
        if miss.layer is Layer.MISS and miss.lookup is not None:
            self._exact_metrics.miss(miss.lookup.miss_reason or MissReason.ABSENT)

    def _shared(self, miss: Miss, leader: Completion) -> Completion:
        prompt_tokens, completion_tokens = usage_tokens(leader.response)
        self._exact_metrics.prompt_tokens(prompt_tokens)
        if miss.probe is not None and self.semantic is not None:
            self.semantic.metrics.prompt_tokens(prompt_tokens)
        self._exact_metrics.hit(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            upstream_s=leader.upstream_s or 0.0,
            money_usd=self.metrics.prices.cost_usd(
                miss.request.model, prompt_tokens, completion_tokens
            ),
        )
        self._exact_metrics.count("coalesced")
        if leader.key is not None:
            self._remember(miss.request, leader.response, ServedBy.FETCHED, (leader.key,))
        return Completion(leader.response, Layer.EXACT, age_s=0.0, key=leader.key, coalesced=True)

    def _semantic_hit(
        self, req: ChatRequest, lookup: Lookup, hit: SemanticHit, verify: ChatFn | None
    ) -> Completion:
        assert self.semantic is not None
        response: Response = orjson.loads(hit.entry.response)
        for metrics in (self._exact_metrics, self.semantic.metrics):  # both looked it up
            metrics.prompt_tokens(hit.entry.prompt_tokens)
        if verify is not None:
            self.semantic.verify(hit, req.body, response, verify)
        keys: tuple[str, ...] = (hit.key,)
        if self.semantic.config.store_hits_as_exact:
            self.exact.store(lookup, req, response, upstream_s=hit.entry.upstream_s)
            keys = (hit.key, lookup.key)
        serving = SemanticServing(hit.key, hit.score, hit.group)
        self._remember(req, response, ServedBy.SEMANTIC, keys, serving)
        return Completion(
            response,
            Layer.SEMANTIC,
            age_s=self.exact.age_s(hit.entry),
            key=hit.key,
            similarity=hit.similarity,
        )

    def _exact_hit(self, req: ChatRequest, lookup: Lookup) -> Completion:
        entry = lookup.entry
        assert entry is not None
        self._exact_metrics.hit(
            prompt_tokens=entry.prompt_tokens,
            completion_tokens=entry.completion_tokens,
            upstream_s=entry.upstream_s,
            money_usd=self.metrics.prices.cost_usd(
                entry.model, entry.prompt_tokens, entry.completion_tokens
            ),
            seen_prompt_tokens=entry.prompt_tokens,
        )
        response: Response = orjson.loads(entry.response)
        self._remember(req, response, ServedBy.EXACT, (lookup.key,))
        return Completion(
            response, Layer.EXACT, age_s=self.exact.age_s(entry), key=lookup.key, raw=entry.response
        )

    def _remember(
        self,
        req: ChatRequest,
        response: Response,
        layer: ServedBy,
        keys: tuple[str, ...],
        semantic: SemanticServing | None = None,
    ) -> None:
        tenant = req.directives.tenant
        self.served.remember(tenant, response.get("id"), layer, keys, semantic)

    # -- complaints --

    def report_wrong(self, response_id: str, *, tenant: str = "") -> bool:
        """An answer this cache served to `tenant` (the request's `infercache.tenant`; the
        gateway passes the authenticated one) was wrong. Retires at once every entry that held
        it (never served again), charges the complaint to the layer that answered (module
        docstring) and returns True; False when no answer with this id was served to this
        tenant recently (`feedback_max_answers`, `feedback_ttl_s`). A repeated report is
        accepted and changes nothing more."""
        found = self.served.take(tenant, response_id)
        if found is None:
            return False
        record, first = found
        if first:
            retire_reported(
                record,
                response_id,
                backend=self.backend,
                semantic=self.semantic,
                exact_metrics=self._exact_metrics,
            )
        return True

    # -- administration --

    def set_model_version(self, model: str, version: str) -> bool:
        """Make `version` current for `model`; every older entry becomes unreachable at once."""
        changed = self.exact.versions.set_model_version(model, version)
        if changed:
            self._exact_metrics.count("model_version_changes")
        return changed

    def model_version(self, model: str) -> str | None:
        return self.exact.versions.model_version(model)

    def invalidate(self, tags: str | Iterable[str]) -> int:
        """Make every entry depending on `tags` (one tag, or an iterable of tags) unreachable;
        return how many distinct tags were bumped. A string is one tag, never its characters."""
        n = self.exact.versions.invalidate([tags] if isinstance(tags, str) else tags)
        self._exact_metrics.count("invalidated_tags", n)
        return n

    def stats(self) -> dict[str, Any]:
        return self.metrics.snapshot()

    def close(self) -> None:
        if self.semantic is not None:
            self.semantic.close()  # its replica sync's thread, before the store it reads
        self.backend.close()


def _retrieve(task: asyncio.Future[Completion]) -> None:
    """Mark a fetch's exception retrieved: its caller may have been cancelled meanwhile, and
    the error already reached every waiter through the flight."""
    if not task.cancelled():
        task.exception()


def _closed(done: Completion | None) -> Completion:
    """The Completion a first close returned (a Miss is closed once, by its owner)."""
    if done is None:
        raise RuntimeError("a Miss was closed twice")
    return done
