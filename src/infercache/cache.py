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
    A `Miss` (miss.py) is a lease the one miss protocol (miss_flight.py) closes exactly once:
      fetched:  count it; store it only if complete and not `no-store` (and index it for the
                semantic layer)                                       (miss.py, MissLedger)
      abandoned: the upstream failed or the stream was cut: count it, store nothing
      shared:   an identical request in flight fetched it: a coalesced hit
    The engine's KV prefix reuse sits underneath, inside the upstream.
Every answer a cache entry holds is remembered by response id and tenant (served_answers.py),
so `report_wrong(response_id)` can retire the entry that served it, at once, and charge the
complaint to the layer that answered: a semantic hit's complaint feeds that answer's
statistics and the layer's threshold or calibration (SemanticLayer.report_wrong); an exact
hit's or a fetched answer's only retires the entry (and its semantic record, so no paraphrase
is served it either): the upstream answered that very question, no cache decision was wrong.

`complete` (threads) and `acomplete` (asyncio) are begin → the miss protocol with the caller's
function as the upstream, as the gateway and the wrapped `openai` client are with theirs. In
`acomplete`, store I/O runs where store_guard.py's `StoreIO` says (`store_io`).

The upstream is any function from a chat-completions body (directives stripped) to a response
body: an HTTP client, an in-process engine, a test double. Its exceptions propagate unchanged and
nothing is stored. A store failure is never the caller's problem: a counted miss.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import orjson

from infercache.clock import Clock, SystemClock
from infercache.completion import Completion, Layer, Response
from infercache.errors import InvalidRequestError, NotCachedError, StoreError
from infercache.exact import ExactCache, Lookup
from infercache.flight import FlightTable
from infercache.function_source import AsyncFunctionSource, FunctionSource
from infercache.metrics import Metrics, MissReason
from infercache.miss import Miss, MissLedger
from infercache.miss_flight import close_fetched, coalesce, coalesce_sync
from infercache.request import ChatRequest, Endpoint, parse_request
from infercache.semantic.embedder import Embedder
from infercache.semantic.guards import Guard
from infercache.semantic.index import IndexFactory
from infercache.semantic.layer import (
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
from infercache.store_guard import StoreIO
from infercache.stores import Backend, open_store

log = logging.getLogger(__name__)

# The endpoints the semantic layer answers: a last user turn compared by meaning. Not legacy
# completions (no turns), nor Responses: a response's id names the one conversation a
# follow-up continues (responses/conversations.py), so a paraphrase's answer would carry
# another conversation's id.
_COMPARED = (Endpoint.CHAT, Endpoint.MESSAGES)

# What the library calls on a miss: a chat-completions body in, a response body out.
ChatFn = Callable[[dict[str, Any]], Response]
AsyncChatFn = Callable[[dict[str, Any]], Awaitable[Response]]


class Cache:
    """Thread-safe; one instance per process is enough. Build with `Cache(settings)`, or pass a
    backend, clock and metrics to share them (tests, the gateway). `store_workers`: a thread
    pool of that many for store I/O off the event loop (None: asyncio's default executor)."""

    def __init__(
        self,
        settings: Settings,
        *,
        backend: Backend | None = None,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        store_workers: int | None = None,
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
        self.store_io = StoreIO(self.backend, workers=store_workers)  # store_guard.py
        self.semantic: SemanticLayer | None = None
        self.served = ServedAnswers(
            max_answers=settings.feedback_max_answers,
            ttl_s=settings.feedback_ttl_s,
            clock=self.clock,
        )
        self.ledger = MissLedger(self.exact, self.metrics, self.served)  # what a close does

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
        self.semantic = self.ledger.semantic = layer
        self.store_io.inline = False  # lookups and stores now embed: never on an event loop
        return layer

    # -- the request path, for library callers --

    def complete(self, request: dict[str, Any], upstream: ChatFn) -> Completion:
        outcome = self.begin(request, verify=upstream)
        if isinstance(outcome, Completion):
            return outcome
        return coalesce_sync(outcome, self.flights, FunctionSource(upstream), self.clock).wait()

    async def acomplete(self, request: dict[str, Any], upstream: AsyncChatFn) -> Completion:
        """`complete` for asyncio: the same layers, live verification included (its fetch runs
        `upstream` on this loop from the verifier's thread), with the store and the embedder
        kept off the event loop."""
        loop = asyncio.get_running_loop()

        async def call(body: dict[str, Any]) -> Response:
            return await upstream(body)

        def verify(body: dict[str, Any]) -> Response:
            return asyncio.run_coroutine_threadsafe(call(body), loop).result()

        outcome = await self.store_io.read(self.begin, request, verify=verify)
        if isinstance(outcome, Completion):
            return outcome
        source = AsyncFunctionSource(upstream)
        flight = coalesce(outcome, self.flights, source, self.store_io, self.clock)
        return await flight.answer()

    # -- the steps, shared by every caller --

    def begin(
        self,
        body: dict[str, Any],
        *,
        tenant: str | None = None,
        verify: ChatFn | None = None,
        endpoint: Endpoint = Endpoint.CHAT,
        beta: str | None = None,
    ) -> Completion | Miss:
        """Parse, apply the policy, look the request up in each layer, top-down.

        Returns the answer when a layer has it, else the `Miss` to fetch. `tenant`, when given
        (an authenticated caller), overrides any tenant claimed in the body. `verify`: how to
        fetch a fresh answer when live verification samples a semantic hit (run in the
        background, never on this call's path). `beta`: a Messages client's `anthropic-beta`.
        """
        req = parse_request(body, tenant=tenant, endpoint=endpoint, beta=beta)
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
            return Miss(self.ledger, req, Layer.UNCACHEABLE, None)
        if cc.no_cache:
            # Read first: a read that gives way (StoreWouldBlockError) is retried, counted once.
            refresh = self.exact.lookup(req, read_entry=False)
            self._exact_metrics.miss(MissReason.BYPASSED)
            return Miss(self.ledger, req, Layer.BYPASS, refresh)
        lookup = self.exact.lookup(req)
        if lookup.entry is not None:
            return self._exact_hit(req, lookup)
        probe = None
        if self.semantic is not None and lookup.view is not None and endpoint in _COMPARED:
            hit, probe = self.semantic.lookup(req, lookup.view)
            if hit is not None:
                self._exact_metrics.miss(lookup.miss_reason or MissReason.ABSENT)
                return self._semantic_hit(req, lookup, hit, verify)
        if cc.only_if_cached:
            self._exact_metrics.miss(lookup.miss_reason or MissReason.ABSENT)
            raise NotCachedError("no fresh cached answer (only-if-cached)")
        return Miss(self.ledger, req, Layer.MISS, lookup, probe)

    def finish(self, miss: Miss, response: Response, *, upstream_s: float) -> Completion:
        """Close `miss` with `response`, for callers that replay a log (the analyzer)."""
        return close_fetched(miss, response, upstream_s)

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
        self.served.remember(
            req.directives.tenant, response.get("id"), ServedBy.SEMANTIC, keys, serving
        )
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
        self.served.remember(
            req.directives.tenant, response.get("id"), ServedBy.EXACT, (lookup.key,)
        )
        return Completion(
            response, Layer.EXACT, age_s=self.exact.age_s(entry), key=lookup.key, raw=entry.response
        )

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
        self.store_io.close()
