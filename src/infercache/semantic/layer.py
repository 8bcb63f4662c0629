"""The semantic layer: answer a request with the stored answer of a near-duplicate in its scope.

Lookup (after an exact miss), `lookup`:
  1. `scope.query_of`: the request's exact scope (everything but the last user message, with
     the model version token and tag generations) and the text compared by meaning. A request
     whose last message is not user text is outside the layer (counted `not_applicable`).
  2. Embed the text (an embedder failure is a counted `embedder_error` miss).
  3. `registry.ScopedIndexes.search`: the scope's k nearest vectors (cosine similarity in
     [-1, 1]); the nearest one's similarity goes into a histogram, hit or miss.
  4. `matcher.scores`: one decision score per candidate (the cosine itself, or a fitted
     matcher's probability). The global threshold is the configured one (tightened by live
     verification, verify.LiveThreshold) or, in shadow mode, the live operating point
     (shadow.LiveCalibration; none yet = shadow); each candidate's answer group may move it
     (answer_stats.py).
  5. Try the candidates in `decision.ranked` order: `decision.accept` (its threshold, then the
     guards) must take it, and its exact entry must be live (`ExactCache.live_entry`: TTL,
     model version, tag generations) and no older than the request's max-age. A candidate
     whose entry is gone is dropped from the index on the spot; one merely older than this
     request's max-age stays for the others. The first such is the hit.
     In shadow (no operating point) nothing is served: the best candidate is only noted.
Store (after the exact layer stored an answer), `store`: the record is persisted
(persistence.py: `sem:{exact key}`, expiring with the entry, shared with the other replicas
through a feed on Redis) and the vector joins its scope's index. If the lookup noted a
candidate, its stored answer is judged against this fresh one in the background
(verification.py), and the verdict feeds the answer's statistics and the live calibration.
Verification (`verify`) re-asks a sample of hits upstream in the background, judged at the
`SemanticHit`'s own score and answer group; a complaint (`report_wrong`) retires the entry that
served a wrong answer. Every verdict goes to `outcomes.Outcomes`, which keeps the global
threshold and the per-answer statistics.

`rebuild` fills the indexes from the store's records (a restart); `refresh_key` applies one
replica's add. Correctness never rests on the feed: every candidate is checked against the store
on read. Thread-safe (the registry, statistics and calibrations each hold a lock; a rebuild
that replaces the indexes swaps in a complete new registry).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from infercache.clock import Clock
from infercache.errors import EmbedderError, InfercacheError, StoreError
from infercache.exact import ExactCache
from infercache.metrics import MissReason, PriceTable, StrategyMetrics
from infercache.request import ChatRequest
from infercache.semantic.answer_stats import GroupKey
from infercache.semantic.decision import Reason, accept, ranked
from infercache.semantic.embedder import Embedder
from infercache.semantic.growing_index import GrowingIndex
from infercache.semantic.guards import Guard
from infercache.semantic.index import IndexFactory
from infercache.semantic.layer_config import SemanticConfig, ShadowConfig
from infercache.semantic.lookup_result import Noted, Probe, SemanticHit
from infercache.semantic.matcher import Matcher, NearbyAnswer
from infercache.semantic.outcomes import Outcomes
from infercache.semantic.persistence import Records
from infercache.semantic.registry import Candidate, ScopedIndexes
from infercache.semantic.scope import Query, query_of
from infercache.semantic.shadow_fit import shadow_fit_for
from infercache.semantic.verification import Verification
from infercache.semantic.verify import Fetch, Tightened, Verifier
from infercache.stores.base import Backend, Entry
from infercache.stores.feed import Feed, FeedKind
from infercache.versions import VersionView

__all__ = ["Probe", "SemanticConfig", "SemanticHit", "SemanticLayer", "ShadowConfig"]

log = logging.getLogger(__name__)

SIMILARITY_BUCKETS = (*(round(0.05 * i, 2) for i in range(-4, 20)), 0.97, 0.99)
_REFUSED = {
    Reason.BELOW_THRESHOLD: MissReason.BELOW_THRESHOLD,
    Reason.GUARD: MissReason.GUARD_REJECTED,
}


class _Choice(NamedTuple):
    hit: SemanticHit | None
    reason: MissReason
    noted: Noted | None


class SemanticLayer:
    def __init__(
        self,
        backend: Backend,
        exact: ExactCache,
        embedder: Embedder,
        *,
        config: SemanticConfig,
        guards: Sequence[Guard],
        metrics: StrategyMetrics,
        prices: PriceTable,
        clock: Clock,
        index_factory: IndexFactory | None = None,
        verifier: Verifier | None = None,
    ) -> None:
        if config.shadow is not None and verifier is None:
            raise ValueError("shadow mode needs a verifier (its judge labels the pairs)")
        self.backend = backend
        self.exact = exact
        self.embedder = embedder
        self.config = config
        self.matcher = config.matcher
        self.guards = tuple(guards)
        self.metrics = metrics
        self._prices = prices
        self._clock = clock
        self.verifier = verifier
        self._index_factory = index_factory or GrowingIndex
        self.indexes = self._new_indexes()
        self.rebuilds = 0  # completed `rebuild`s (0: the index has never been read from store)
        self.records = Records(
            backend, embedder_name=embedder.name, dim=embedder.dim, metrics=metrics, clock=clock
        )
        self._on_close: list[Callable[[], None]] = []
        self.outcomes = Outcomes(
            backend,
            config=config,
            embedder_name=embedder.name,
            metrics=metrics,
            monitor=verifier.monitor if verifier is not None else None,
        )
        self._scoring = threading.Lock()
        self.shadow_fit = shadow_fit_for(
            config.shadow, verifier, on_switch=self._switch_matcher, current=lambda: self.matcher
        )
        if self.shadow_fit is not None:
            self.on_close(self.shadow_fit.close)  # its worker process
        self.verification = Verification(
            verifier, self.outcomes, metrics, matcher=lambda: self.matcher, learn=self.shadow_fit
        )
        self._k = max(config.k, self.matcher.k or 0)

    def _switch_matcher(self, matcher: Matcher, pairs: list[tuple[float, bool]]) -> None:
        """Serve with `matcher` from now on, the live calibration rescored on its scale and the
        per-answer statistics (on the old scale) forgotten; a lookup sees both or neither."""
        with self._scoring:
            self.matcher = matcher
            if self.outcomes.calibration is not None:
                self.outcomes.calibration.reset(pairs, f"{matcher.name}:{self.embedder.name}")
            if self.outcomes.answer_stats is not None:
                self.outcomes.answer_stats.clear()
        self.metrics.count("shadow_refit_switches")

    def _new_indexes(self) -> ScopedIndexes:
        return ScopedIndexes(
            self.embedder.dim, self._index_factory, max_vectors=self.config.max_vectors
        )

    @property
    def threshold(self) -> float | None:
        """The global threshold served at now (None: in shadow, nothing is served)."""
        return self.outcomes.threshold

    @property
    def feed(self) -> Feed | None:
        """Where adds and removals are published to other replicas (replica_sync.py)."""
        return self.records.feed

    @feed.setter
    def feed(self, feed: Feed | None) -> None:
        self.records.feed = feed

    @property
    def published(self) -> str | None:
        """The feed position of the last event this layer published."""
        return self.records.published

    def tighten(self, event: Tightened) -> None:
        self.outcomes.tighten(event)

    # -- lookup --

    def lookup(
        self, request: ChatRequest, view: VersionView
    ) -> tuple[SemanticHit | None, Probe | None]:
        query = query_of(request, view, self.exact.ignorable_fields)
        if query is None:
            self.metrics.count("not_applicable")
            return None, None
        started = self._clock.monotonic_s()
        try:
            vector = self._embed(query.text)
        except EmbedderError as exc:
            self.metrics.miss(MissReason.EMBEDDER_ERROR)
            log.warning("semantic lookup skipped: %s", exc.message)
            return None, None
        candidates = self.indexes.search(query.scope, vector, self._k)
        if candidates:
            self.metrics.observe("nn_similarity", candidates[0].similarity, SIMILARITY_BUCKETS)
        with self._scoring:  # a shadow refit switches matcher and threshold together
            matcher, base = self.matcher, self.threshold
        choice = self._choose(query, view, request, candidates, matcher, base)
        self.metrics.overhead(self._clock.monotonic_s() - started)
        probe = Probe(query, vector, choice.noted)
        self.outcomes.note_lookup()
        if base is None:
            self.metrics.count("shadow_lookups")
            return None, probe
        if choice.hit is None:
            self.metrics.miss(choice.reason)
            return None, probe
        e = choice.hit.entry
        self.metrics.hit(
            prompt_tokens=e.prompt_tokens,
            completion_tokens=e.completion_tokens,
            upstream_s=e.upstream_s,
            money_usd=self._prices.cost_usd(e.model, e.prompt_tokens, e.completion_tokens),
        )
        return choice.hit, probe

    def _choose(
        self,
        query: Query,
        view: VersionView,
        request: ChatRequest,
        candidates: list[Candidate],
        matcher: Matcher,
        base: float | None,
    ) -> _Choice:
        """The hit (the first candidate, in ranked order, that its threshold and the guards
        accept and whose entry is fresh), why there is none, and the candidate to judge."""
        count = self.indexes.answer_count
        neighbours = [
            NearbyAnswer(c.similarity, c.item.answer, count(c.item.scope, c.item.answer))
            for c in candidates
        ]
        scores = matcher.scores(neighbours)
        reason = MissReason.ABSENT
        best: tuple[Candidate, float, GroupKey, int] | None = None  # best guard-passing one
        for j in ranked(scores, [n.similarity for n in neighbours]):
            candidate, score = candidates[j], scores[j]
            group = GroupKey(query.scope, candidate.item.answer or candidate.item.key)
            needed = score if base is None else self.outcomes.threshold_of(group, base)
            decision = accept(score, query.text, candidate.item.text, needed, self.guards)
            if reason is MissReason.ABSENT and not decision.accepted:
                reason = _REFUSED[decision.reason]
            if decision.reason is Reason.GUARD:
                continue
            if best is None:
                best = (candidate, score, group, j)
            if base is None or not decision.accepted:
                continue
            try:
                entry = self.exact.live_entry(candidate.item.key, view)
            except StoreError as exc:
                self.metrics.count("store_errors")
                log.warning("semantic candidate unreadable, serving without it: %s", exc)
                return _Choice(None, MissReason.STORE_ERROR, None)
            if entry is None:  # expired, evicted or invalidated: gone for every request
                self.indexes.forget(candidate.vid)
                best = None if best[0] is candidate else best
                continue
            if self.exact.too_old_for(entry, request.directives.max_age_s):
                if reason is MissReason.ABSENT:  # as the exact layer counts it
                    reason = MissReason.EXPIRED
                continue  # too old for this request only: it stays indexed for the others
            hit = SemanticHit(entry, candidate.item.key, candidate.similarity, score, group)
            return _Choice(hit, reason, None)
        return _Choice(None, reason, self._note(best, neighbours, view, request, base))

    def _fresh(self, candidate: Candidate, view: VersionView, request: ChatRequest) -> Entry | None:
        return self.exact.fresh_entry(candidate.item.key, view, request.directives.max_age_s)

    def _note(
        self,
        best: tuple[Candidate, float, GroupKey, int] | None,
        neighbours: list[NearbyAnswer],
        view: VersionView,
        request: ChatRequest,
        base: float | None,
    ) -> Noted | None:
        """The miss's best candidate with its stored answer, when it is worth judging: always
        in shadow; serving, when it scored near enough the threshold to move statistics."""
        if best is None or self.verifier is None:
            return None
        candidate, score, group, position = best
        if base is not None and (
            not self.outcomes.learns_from_misses or score < base - self.config.judge_margin
        ):
            return None
        try:
            entry = self._fresh(candidate, view, request)
        except StoreError as exc:
            self.metrics.count("store_errors")
            log.warning("semantic candidate unreadable, not judged: %s", exc)
            return None
        if entry is None:
            return None
        return Noted(candidate.item.key, score, group, entry.response, tuple(neighbours), position)

    # -- store --

    def store(self, request: ChatRequest, view: VersionView, key: str, probe: Probe | None) -> None:
        """Index the answer just stored under exact `key` with `view` (and persist its vector);
        judge the candidate the lookup noted against it."""
        query = query_of(request, view, self.exact.ignorable_fields)
        if query is None:
            return
        try:
            same_text = probe is not None and probe.query.text == query.text
            vector = probe.vector if probe is not None and same_text else self._embed(query.text)
        except EmbedderError as exc:
            log.warning("semantic record not stored: %s", exc.message)
            return
        try:
            written = self.records.write(query, key, vector)
        except StoreError as exc:
            self.metrics.count("store_errors")
            log.warning("semantic record not stored: %s", exc)
            return
        if written is None:
            return
        item, answer = written
        self.metrics.gauge("vectors", self.indexes.add(item, vector))
        self.records.publish(FeedKind.ADD, key)
        if probe is not None and probe.noted is not None:
            self.verification.judge_noted(request.body, probe.noted, answer.response)

    def rebuild(self, *, replace: bool = False) -> int:
        """Load every live record of this embedder from the store; return how many.
        `replace`: into a new registry swapped in when complete (after a feed gap: what was
        deleted meanwhile goes too), else into the current one. Raises StoreError."""
        items, vectors = self.records.scan()
        indexes = self._new_indexes() if replace else self.indexes
        if items:
            indexes.add_many(items, np.stack(vectors))
        self.indexes = indexes
        self.rebuilds += 1
        self.metrics.gauge("vectors", len(self.indexes))
        return len(items)

    def refresh_key(self, key: str) -> bool:
        """Index the record of exact `key` as the store holds it now (another replica's add):
        nothing if it is indexed already, dropped if it is gone. Returns whether a vector is
        held for it. Raises StoreError."""
        found = self.records.read(key)
        if found is None:
            self.indexes.forget_key(key)
            return False
        if self.indexes.item_of_key(key) != found[0]:
            self.metrics.gauge("vectors", self.indexes.add(*found))
        return True

    def on_close(self, fn: Callable[[], None]) -> None:
        self._on_close.append(fn)

    def close(self) -> None:
        """Stop what runs beside the layer (a replica sync's thread), last attached first."""
        while self._on_close:
            self._on_close.pop()()

    def _embed(self, text: str) -> npt.NDArray[np.float32]:
        """One text's vector; any failure of the embedder becomes `EmbedderError` (counted)."""
        try:
            vector: npt.NDArray[np.float32] = self.embedder.embed([text])[0]
        except InfercacheError as exc:  # a remote embedder down, say
            self.metrics.count("embedder_errors")
            raise EmbedderError(f"the embedder failed: {exc.message}") from exc
        return vector

    # -- feedback: verification and complaints --

    def verify(
        self, hit: SemanticHit, body: Mapping[str, Any], cached: Mapping[str, Any], fetch: Fetch
    ) -> None:
        """Maybe check the served `hit` (its answer `cached`) upstream, in the background."""
        self.verification.verify(hit, body, cached, fetch)

    def report_wrong(self, key: str, *, score: float, group: GroupKey | None = None) -> bool:
        """A served semantic answer was reported wrong (`key`, `score`, `group`: the
        `SemanticHit` that served it). Retires that entry at once — its vector, its record and
        the exact entry — so it is never served again, records the complaint in its answer's
        statistics (that answer is never again served at that score) and counts it as a wrong
        verdict for the live threshold or calibration. Returns whether the entry was held."""
        item = self.indexes.item_of_key(key)
        if group is None and item is not None:
            group = GroupKey(item.scope, item.answer or key)
        held = self.indexes.forget_key(key)
        self.records.retire(key)
        self.metrics.gauge("vectors", len(self.indexes))
        self.verification.complaint(score, group)
        return held

    def state(self) -> dict[str, Any]:
        """The layer's mode, threshold and calibration, for `/stats`."""
        return {**self.outcomes.state(), "matcher": self.matcher.name}
