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
Store (after the exact layer stored an answer), `store`: the `records.SemanticRecord` (scope,
text, answer digest, vector) goes to the same backend under `sem:{exact key}` with the exact
entry's expiry (a restart rebuilds every index from it, `rebuild`); the vector joins its
scope's index. If the lookup noted a candidate, the judge compares its stored answer with this
fresh one in the background, and the verdict feeds the answer's statistics and the live
calibration (`_judged`).
Verification (`verify`) re-asks a sample of hits upstream in the background; a complaint
(`report_wrong`) retires the entry that served a wrong answer. Every verdict goes to
`outcomes.Outcomes`, which keeps the global threshold and the per-answer statistics.

Indexes are per process. On a Redis store the replicas share them through a feed
(replica_sync.py): `store` publishes `ADD {key}` once its record is written and `report_wrong`
publishes `REMOVE {key}`, best effort (a failed publish is counted as `feed_errors` and logged;
the entry still reaches the others at their next rebuild), and every replica follows the feed.
Without a feed (memory, SQLite) another process's new records are seen after its restart.
Correctness never rests on the feed: every candidate is checked against the store on read.
Thread-safe (the registry, statistics and calibrations each hold a lock; a rebuild that replaces
the indexes swaps in a complete new registry).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import orjson

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
from infercache.semantic.matcher import NearbyAnswer
from infercache.semantic.outcomes import Outcomes
from infercache.semantic.records import (
    RECORD_PREFIX,
    SemanticRecord,
    answer_digest,
    decode_record,
    encode_record,
    record_key,
)
from infercache.semantic.registry import Candidate, IndexedItem, ScopedIndexes
from infercache.semantic.scope import Query, query_of
from infercache.semantic.verify import Fetch, Tightened, Verifier
from infercache.stores.base import Backend, Entry
from infercache.stores.feed import Feed, FeedEvent, FeedKind
from infercache.versions import VersionView

__all__ = ["Probe", "SemanticConfig", "SemanticHit", "SemanticLayer", "ShadowConfig"]

log = logging.getLogger(__name__)

SIMILARITY_BUCKETS = (*(round(0.05 * i, 2) for i in range(-4, 20)), 0.97, 0.99)
_REFUSED = {
    Reason.BELOW_THRESHOLD: MissReason.BELOW_THRESHOLD,
    Reason.GUARD: MissReason.GUARD_REJECTED,
}


class Noted(NamedTuple):
    """A miss's best candidate, to be judged against the fresh answer when it arrives."""

    key: str
    score: float
    group: GroupKey
    cached: bytes  # the candidate's stored response body


class Probe(NamedTuple):
    """What a lookup computed, reused when the answer is stored (the embedding is the costly
    part; the scope is recomputed then, since the answer may be stored under a newer view)."""

    query: Query
    vector: npt.NDArray[np.float32]
    noted: Noted | None = None


class SemanticHit(NamedTuple):
    entry: Entry
    key: str  # the exact key of the near-duplicate whose answer is served
    similarity: float  # cosine similarity in [-1, 1] (what `x-infercache-similarity` shows)
    score: float = float("nan")  # the matcher's decision score the threshold was applied to
    group: GroupKey | None = None  # the answer group whose statistics the hit belongs to


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
        self.feed: Feed | None = None  # where adds and removals are published (replica_sync)
        self.published: str | None = None  # the position of the last event published
        self._on_close: list[Callable[[], None]] = []
        if config.shadow is not None and verifier is None:
            raise ValueError("shadow mode needs a verifier (its judge labels the pairs)")
        self.outcomes = Outcomes(
            backend,
            config=config,
            embedder_name=embedder.name,
            metrics=metrics,
            monitor=verifier.monitor if verifier is not None else None,
        )
        self._k = max(config.k, self.matcher.k or 0)
        self._last_hit = threading.local()  # for `verify`, called right after `lookup`

    def _new_indexes(self) -> ScopedIndexes:
        return ScopedIndexes(
            self.embedder.dim, self._index_factory, max_vectors=self.config.max_vectors
        )

    @property
    def threshold(self) -> float | None:
        """The global threshold served at now (None: in shadow, nothing is served)."""
        return self.outcomes.threshold

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
        base = self.threshold
        choice = self._choose(query, view, request, candidates, base)
        self.metrics.overhead(self._clock.monotonic_s() - started)
        probe = Probe(query, vector, choice.noted)
        self._last_hit.value = choice.hit
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
        base: float | None,
    ) -> _Choice:
        """The hit (the first candidate, in ranked order, that its threshold and the guards
        accept and whose entry is fresh), why there is none, and the candidate to judge."""
        neighbours = [NearbyAnswer(c.similarity, c.item.answer) for c in candidates]
        scores = self.matcher.scores(neighbours)
        reason = MissReason.ABSENT
        best: tuple[Candidate, float, GroupKey] | None = None  # best guard-passing candidate
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
                best = (candidate, score, group)
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
        return _Choice(None, reason, self._note(best, view, request, base))

    def _fresh(self, candidate: Candidate, view: VersionView, request: ChatRequest) -> Entry | None:
        return self.exact.fresh_entry(candidate.item.key, view, request.directives.max_age_s)

    def _note(
        self,
        best: tuple[Candidate, float, GroupKey] | None,
        view: VersionView,
        request: ChatRequest,
        base: float | None,
    ) -> Noted | None:
        """The miss's best candidate with its stored answer, when it is worth judging: always
        in shadow; serving, when it scored near enough the threshold to move statistics."""
        if best is None or self.verifier is None:
            return None
        candidate, score, group = best
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
        return Noted(candidate.item.key, score, group, entry.response)

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
            answer = self.backend.get(key)
            if answer is None:
                return
            digest = answer_digest(answer.response)
            record = SemanticRecord(
                query.scope, query.text, key, self.embedder.name, vector, digest
            )
            self.backend.put(record_key(key), encode_record(record, answer))
        except StoreError as exc:
            self.metrics.count("store_errors")
            log.warning("semantic record not stored: %s", exc)
            return
        size = self.indexes.add(IndexedItem(query.scope, key, query.text, digest), vector)
        self.metrics.gauge("vectors", size)
        self._publish(FeedKind.ADD, key)
        if probe is not None and probe.noted is not None and self.verifier is not None:
            noted = probe.noted
            self.verifier.judge_later(
                request.body,
                orjson.loads(noted.cached),
                orjson.loads(answer.response),
                lambda wrong: self.outcomes.judged(noted.score, noted.group, wrong, hit=False),
            )

    def rebuild(self, *, replace: bool = False) -> int:
        """Load every live record of this embedder from the store; return how many.
        `replace`: into a new registry swapped in when complete (after a feed gap: what was
        deleted meanwhile goes too), else into the current one. Raises StoreError."""
        now_s = self._clock.now_s()
        items: list[IndexedItem] = []
        vectors: list[npt.NDArray[np.float32]] = []
        for name, entry in self.backend.scan(RECORD_PREFIX):
            indexable = self.indexable(name, entry, now_s)
            if indexable is not None:
                items.append(indexable[0])
                vectors.append(indexable[1])
        indexes = self._new_indexes() if replace else self.indexes
        if items:
            indexes.add_many(items, np.stack(vectors))
        self.indexes = indexes
        self.rebuilds += 1
        self.metrics.gauge("vectors", len(self.indexes))
        return len(items)

    def indexable(
        self, name: str, entry: Entry, now_s: float
    ) -> tuple[IndexedItem, npt.NDArray[np.float32]] | None:
        """The item and vector the record `entry` (stored under `name`) stands for; None if
        it expired, is unreadable or holds another model's vector (not comparable)."""
        if entry.expires_at_s <= now_s:
            return None
        try:
            record = decode_record(entry)
        except ValueError as exc:
            log.warning("skipping the unreadable semantic record %s: %s", name, exc)
            return None
        if record.embedder != self.embedder.name or len(record.vector) != self.embedder.dim:
            return None
        return IndexedItem(record.scope, record.key, record.text, record.answer), record.vector

    def refresh_key(self, key: str) -> bool:
        """Index the record of exact `key` as the store holds it now (another replica's add):
        nothing if it is indexed already, dropped if it is gone. Returns whether a vector is
        held for it. Raises StoreError."""
        name = record_key(key)
        entry = self.backend.get(name)
        found = None if entry is None else self.indexable(name, entry, self._clock.now_s())
        if found is None:
            self.indexes.forget_key(key)
            return False
        if self.indexes.item_of_key(key) != found[0]:
            self.metrics.gauge("vectors", self.indexes.add(*found))
        return True

    def _publish(self, kind: FeedKind, key: str) -> None:
        """Tell the other replicas (best effort: the store is the truth, they rebuild from it)."""
        if self.feed is None:
            return
        try:
            self.published = self.feed.publish(FeedEvent(kind, key))
            self.metrics.count("feed_published")
        except StoreError as exc:
            self.metrics.count("feed_errors")
            log.warning("semantic %s of %s not shared with other replicas: %s", kind, key, exc)

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

    # -- feedback: verification, judgments, complaints --

    def verify(
        self,
        body: Mapping[str, Any],
        cached: Mapping[str, Any],
        similarity: float,
        fetch: Fetch,
    ) -> None:
        """Maybe check the hit this thread's last `lookup` served, in the background."""
        hit: SemanticHit | None = getattr(self._last_hit, "value", None)
        if hit is None or hit.similarity != similarity:
            hit = None  # not the hit just looked up: judge it at its similarity, no group
        score = hit.score if hit is not None else similarity
        group = hit.group if hit is not None else None
        if self.verifier is not None and self.verifier.sampled():
            self.metrics.count("verifications_scheduled")
            self.verifier.judge_later(
                body,
                cached,
                fetch,
                lambda wrong: self.outcomes.judged(score, group, wrong, hit=True),
            )

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
        try:
            self.backend.delete(record_key(key))
            self.backend.delete(key)
        except StoreError as exc:
            self.metrics.count("store_errors")
            log.warning("could not delete the entry reported wrong: %s", exc)
        self._publish(FeedKind.REMOVE, key)  # even undeleted: the others stop serving it
        self.metrics.gauge("vectors", len(self.indexes))
        self.outcomes.complaint(score, group)
        return held

    def state(self) -> dict[str, Any]:
        """The layer's mode, threshold and calibration, for `/stats`."""
        return {**self.outcomes.state(), "matcher": self.matcher.name}
