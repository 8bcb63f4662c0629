"""`Cache`: the path of one request through the layers, top-down, in one place.

    begin(body) → Completion (a layer answered) | Miss (fetch it):
      1. parse: validate the body, split off the `infercache` directives   (request.py)
      2. policy: a sampled request without a seed → Miss `uncacheable`       (policy.py)
      3. `no-cache` → skip the lookup → Miss `bypass` (its answer refreshes the entry)
      4. exact lookup: key, version view, entry, freshness                 (exact.py)
         hit → the stored answer, `exact`, with its age                 (layer_hits.py)
      5. semantic lookup, when enabled: a near-duplicate in the same exact scope whose answer
         is fresh and passes threshold and guards                        (semantic/layer.py)
         hit → its answer, `semantic`, with age and similarity; maybe verified in background
      6. `only-if-cached` and no hit → NotCachedError
    `version` (a routed replica's, or the caller's): several versions of one model live at
    once, each request looked up under the one that answers it (keys.py, versions.py); a
    retired version's entries are not served. `cached=False`: the version it goes to is not
    known right now (its replica is being read again): no layer is asked, nothing is stored.
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

from infercache.clock import Clock, SystemClock
from infercache.completion import Completion, Layer, Response
from infercache.errors import InvalidRequestError, NotCachedError, StoreError
from infercache.exact import ExactCache, Lookup
from infercache.flight import FlightTable
from infercache.function_source import AsyncFunctionSource, FunctionSource
from infercache.layer_hits import LayerHits
from infercache.metrics import Metrics, MissReason
from infercache.miss import Miss, MissLedger
from infercache.miss_flight import coalesce, coalesce_sync
from infercache.request import ChatRequest, Endpoint, parse_request
from infercache.semantic.embedder import Embedder
from infercache.semantic.guards import Guard
from infercache.semantic.index import IndexFactory
from infercache.semantic.layer import SemanticConfig, SemanticLayer
from infercache.semantic.verify import Verifier
from infercache.served_answers import ServedAnswers, retire_reported
from infercache.settings import Settings
from infercache.store_guard import StoreIO
from infercache.stores import Backend, open_store

log = logging.getLogger(__name__)

# The endpoints the semantic layer answers: a last user turn compared by meaning. Not legacy
# completions (no turns), nor Responses: a response's id names the one conversation a
# follow-up continues (gateway/response_conversations.py), so a paraphrase's answer would carry
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
        self.hits = LayerHits(self.exact, self._exact_metrics, self.metrics.prices, self.served)

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

    def complete(
        self, request: dict[str, Any], upstream: ChatFn, *, version: str | None = None
    ) -> Completion:
        """`request` answered from the cache or by `upstream`; `version`: the model version
        `upstream` serves, when several are live (module docstring)."""
        outcome = self.begin(request, verify=upstream, version=version)
        if isinstance(outcome, Completion):
            return outcome
        return coalesce_sync(outcome, self.flights, FunctionSource(upstream), self.clock).wait()

    async def acomplete(
        self, request: dict[str, Any], upstream: AsyncChatFn, *, version: str | None = None
    ) -> Completion:
        """`complete` for asyncio: the same layers, live verification included (its fetch runs
        `upstream` on this loop from the verifier's thread), with the store and the embedder
        kept off the event loop."""
        loop = asyncio.get_running_loop()

        async def call(body: dict[str, Any]) -> Response:
            return await upstream(body)

        def verify(body: dict[str, Any]) -> Response:
            return asyncio.run_coroutine_threadsafe(call(body), loop).result()

        outcome = await self.store_io.read(self.begin, request, verify=verify, version=version)
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
        version: str | None = None,
        cached: bool = True,
        follow_label: bool = False,
    ) -> Completion | Miss:
        """Parse, apply the policy, look the request up in each layer, top-down.

        Returns the answer when a layer has it, else the `Miss` to fetch. `tenant`, when given
        (an authenticated caller), overrides any tenant claimed in the body. `verify`: how to
        fetch a fresh answer when live verification samples a semantic hit (run in the
        background, never on this call's path). `beta`: a Messages client's `anthropic-beta`.
        `version`, `cached`: the module docstring. `follow_label` (an unversioned request whose
        caller does not know the version that answers it: a gateway that has not heard from the
        replica yet): on an exact miss, look it up again under the version the store names the
        model's (`_under_label`).
        """
        req = parse_request(body, tenant=tenant, endpoint=endpoint, beta=beta, version=version)
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
        if not cached:
            if cc.only_if_cached:
                raise NotCachedError("the model version this request goes to is not known now")
            self._exact_metrics.miss(MissReason.VERSION_UNKNOWN)
            return Miss(self.ledger, req, Layer.MISS, None)
        if cc.no_cache:
            # Read first: a read that gives way (StoreWouldBlockError) is retried, counted once.
            refresh = self.exact.lookup(req, read_entry=False)
            self._exact_metrics.miss(MissReason.BYPASSED)
            return Miss(self.ledger, req, Layer.BYPASS, refresh)
        lookup = self.exact.lookup(req)
        if lookup.entry is None and follow_label and req.version is None:
            req, lookup = self._under_label(req, lookup)
        if lookup.entry is not None:
            return self.hits.exact(req, lookup)
        probe = None
        view = lookup.view
        semantic = self.semantic if endpoint in _COMPARED else None
        if semantic is not None and view is not None and not view.retired:
            hit, probe = semantic.lookup(req, view)
            if hit is not None:
                self._exact_metrics.miss(lookup.miss_reason or MissReason.ABSENT)
                return self.hits.semantic(semantic, req, lookup, hit, verify)
        if cc.only_if_cached:
            self._exact_metrics.miss(lookup.miss_reason or MissReason.ABSENT)
            raise NotCachedError("no fresh cached answer (only-if-cached)")
        return Miss(self.ledger, req, Layer.MISS, lookup, probe)

    def _under_label(self, req: ChatRequest, lookup: Lookup) -> tuple[ChatRequest, Lookup]:
        """`req` under the version the store names its model's (`Versions.relabel`: what every
        replica serves, as another process saw it), when it names one; else as it was."""
        view = lookup.view
        label = view.model_version.partition(":")[2] if view is not None else ""
        if not label:
            return req, lookup
        scoped = req._replace(version=label)
        return scoped, self.exact.lookup(scoped)

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

    def retire_version(self, model: str, version: str) -> bool:
        """Stop serving the entries of one of several live versions of `model`, at once (O(1),
        for every process on the store); they are kept: `revive_version` serves those still
        fresh again (a rollback). True if it was live."""
        retired = self.exact.versions.retire_version(model, version)
        if retired:
            self._exact_metrics.count("versions_retired")
        return retired

    def revive_version(self, model: str, version: str) -> bool:
        """Serve a retired version's entries again, those still within their TTL; True if it
        was retired."""
        return self.exact.versions.revive_version(model, version)

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
