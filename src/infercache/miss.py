"""`Miss`: a chat request no cache layer answered — a lease on its lookup, closed exactly once.

cache.begin(body) → Miss(request, layer, lookup, probe)               (cache.py)
closed by the one miss protocol (miss_flight.py) and nothing else:
  close(response, upstream_s)               fetched: counted; stored only if complete and
                                            not `no-store` (and indexed for the semantic
                                            layer)
  close(None)                               no answer (the upstream failed, the stream was
                                            cut, every reader left): counted, nothing stored
  close_shared(leader | None)               an identical request in flight fetched it: a
                                            coalesced hit, or a miss when that call failed
A later close does nothing and returns None. What a close counts and stores is the
`MissLedger`'s, one per cache: the exact strategy's metrics (a coalesced answer is an exact
hit), the exact store and the semantic index, and the served answers a complaint retires.
"""

from __future__ import annotations

import threading

from infercache.completion import Completion, Layer, Response
from infercache.errors import StoreError
from infercache.exact import ExactCache, Lookup
from infercache.metrics import Metrics, MissReason
from infercache.policy import usage_tokens
from infercache.request import ChatRequest
from infercache.semantic.layer import Probe, SemanticLayer
from infercache.served_answers import ServedAnswers, ServedBy


class MissLedger:
    """What closing a Miss does in the cache that opened it: called by `Miss.close` and
    `close_shared`, once per Miss. `semantic` is the cache's layer once enabled."""

    def __init__(self, exact: ExactCache, metrics: Metrics, served: ServedAnswers) -> None:
        self.exact = exact
        self.semantic: SemanticLayer | None = None
        self._metrics = metrics.strategy("exact")
        self._prices = metrics.prices
        self._served = served

    def fetched(self, miss: Miss, response: Response, upstream_s: float) -> None:
        self._prompt_tokens(miss, usage_tokens(response)[0])
        lookup, req = miss.lookup, miss.request
        if miss.layer is Layer.MISS and lookup is not None:
            self._metrics.miss(lookup.miss_reason or MissReason.ABSENT)
        if lookup is not None and not req.directives.cache_control.no_store:
            stored_under = self.exact.store(lookup, req, response, upstream_s=upstream_s)
            if stored_under is not None and self.semantic is not None:
                self.semantic.store(req, stored_under, lookup.key, miss.probe)
            if stored_under is not None:
                keys = (lookup.key,)
                self._served.remember(
                    req.directives.tenant, response.get("id"), ServedBy.FETCHED, keys
                )

    def abandoned(self, miss: Miss) -> None:
        if miss.layer is Layer.MISS and miss.lookup is not None:
            self._metrics.miss(miss.lookup.miss_reason or MissReason.ABSENT)

    def shared(self, miss: Miss, leader: Completion) -> Completion:
        prompt_tokens, completion_tokens = usage_tokens(leader.response)
        self._prompt_tokens(miss, prompt_tokens)
        self._metrics.hit(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            upstream_s=leader.upstream_s or 0.0,
            money_usd=self._prices.cost_usd(miss.request.model, prompt_tokens, completion_tokens),
        )
        self._metrics.count("coalesced")
        if leader.key is not None:
            tenant, keys = miss.request.directives.tenant, (leader.key,)
            self._served.remember(tenant, leader.response.get("id"), ServedBy.FETCHED, keys)
        return Completion(leader.response, Layer.EXACT, age_s=0.0, key=leader.key, coalesced=True)

    def store_failed(self, exc: StoreError) -> None:
        self.exact.store_failed("store", exc)

    def _prompt_tokens(self, miss: Miss, prompt_tokens: int) -> None:
        self._metrics.prompt_tokens(prompt_tokens)
        if miss.probe is not None and self.semantic is not None:
            self.semantic.metrics.prompt_tokens(prompt_tokens)  # the semantic layer looked too


class Miss:
    """A request no cache layer answered: a lease on its lookup that its owner closes exactly
    once (module docstring). It is a `miss_flight.MissLease`."""

    __slots__ = ("_closed", "_ledger", "_lock", "layer", "lookup", "probe", "request")

    def __init__(
        self,
        ledger: MissLedger,
        request: ChatRequest,
        layer: Layer,
        lookup: Lookup | None,
        probe: Probe | None = None,
    ) -> None:
        self.request = request
        self.layer = layer  # MISS, BYPASS or UNCACHEABLE
        self.lookup = lookup  # None when the request is not cacheable
        self.probe = probe  # the semantic lookup's embedding, reused to index the answer
        self._ledger = ledger
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

    def reply(self, fetched: Completion) -> Completion:
        """What the leader's caller gets: the answer as fetched."""
        return fetched

    def store_failed(self, exc: StoreError) -> None:
        """What `close` stored was not committed: counted; the answer stands."""
        self._ledger.store_failed(exc)

    def _claim(self) -> bool:
        with self._lock:
            first, self._closed = not self._closed, True
            return first

    def close(self, response: Response | None, *, upstream_s: float = 0.0) -> bool:
        """The upstream answered (`response`) or did not (None); False when closed before."""
        if not self._claim():
            return False
        if response is None:
            self._ledger.abandoned(self)
        else:
            self._ledger.fetched(self, response, upstream_s)
        return True

    def close_shared(self, leader: Completion | None) -> Completion | None:
        """An identical request in flight fetched `leader` for this one (None: it failed)."""
        if not self._claim():
            return None
        if leader is None:
            self._ledger.abandoned(self)
            return None
        return self._ledger.shared(self, leader)
