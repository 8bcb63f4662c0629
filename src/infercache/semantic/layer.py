"""The semantic layer: answer a request with the stored answer of a near-duplicate in its scope.

Lookup (after an exact miss), `lookup`:
  1. `scope.query_of`: the request's exact scope (everything but the last user message, with
     the model version token and tag generations) and the text compared by meaning. A request
     whose last message is not user text is outside the layer (counted `not_applicable`).
  2. Embed the text (an embedder failure is a counted `embedder_error` miss).
  3. `registry.ScopedIndexes.search`: the scope's `k` nearest vectors (cosine similarity in
     [-1, 1]); the nearest one's similarity goes into a histogram, hit or miss.
  4. Walk the candidates from the most similar: `decision.accept` (threshold, then guards —
     the same rule `infercache tune` calibrates) must accept, and the candidate's exact entry
     must be fresh for this request (`ExactCache.fresh_entry`: TTL, model version, tag
     generations, max-age). A candidate whose entry is gone (expired, evicted, invalidated) is
     dropped from the index on the spot, so the index never serves what the store would not.
Store (after the exact layer stored an answer), `store`: the `records.SemanticRecord` (scope,
text, vector) goes to the same backend under `sem:{exact key}` with the exact entry's expiry,
so a restart rebuilds every index from the store (`rebuild`); the vector joins its scope's index.

Live verification (verify.py) samples hits; its verdicts feed `verify.LiveThreshold`, which
tightens the threshold when the false-hit rate is above target with 95% confidence and keeps
the new value in the store's meta across restarts.

Indexes are per process: another process's new records are seen after its restart. Thread-safe
(the registry and the live threshold each hold a lock).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from infercache.clock import Clock
from infercache.errors import EmbedderError, InfercacheError, StoreError
from infercache.exact import ExactCache
from infercache.metrics import MissReason, PriceTable, StrategyMetrics
from infercache.request import ChatRequest
from infercache.semantic.decision import Reason, accept
from infercache.semantic.embedder import Embedder
from infercache.semantic.growing_index import GrowingIndex
from infercache.semantic.guards import Guard
from infercache.semantic.index import IndexFactory
from infercache.semantic.records import (
    RECORD_PREFIX,
    SemanticRecord,
    decode_record,
    encode_record,
    record_key,
)
from infercache.semantic.registry import Candidate, IndexedItem, ScopedIndexes
from infercache.semantic.scope import Query, query_of
from infercache.semantic.verify import FalseHitMonitor, LiveThreshold, Tightened, Verifier
from infercache.stores.base import Backend, Entry
from infercache.versions import VersionView

log = logging.getLogger(__name__)

SIMILARITY_BUCKETS = (*(round(0.05 * i, 2) for i in range(-4, 20)), 0.97, 0.99)
_REFUSED = {
    Reason.BELOW_THRESHOLD: MissReason.BELOW_THRESHOLD,
    Reason.GUARD: MissReason.GUARD_REJECTED,
}


@dataclass(frozen=True, slots=True)
class SemanticConfig:
    threshold: float  # cosine similarity in [-1, 1], from `infercache tune`; never a default
    k: int = 4  # neighbours examined per lookup
    max_vectors: int = 1_000_000  # in-process index bound (oldest dropped first)
    store_hits_as_exact: bool = False  # also store a semantic hit under the new wording's key

    def __post_init__(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold is a cosine similarity in [-1, 1], got {self.threshold}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")


class Probe(NamedTuple):
    """What a lookup computed, reused when the answer is stored (the embedding is the costly
    part; the scope is recomputed then, since the answer may be stored under a newer view)."""

    query: Query
    vector: npt.NDArray[np.float32]


class SemanticHit(NamedTuple):
    entry: Entry
    key: str  # the exact key of the near-duplicate whose answer is served
    similarity: float


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
        self.guards = tuple(guards)
        self.metrics = metrics
        self._prices = prices
        self._clock = clock
        self.indexes = ScopedIndexes(
            embedder.dim, index_factory or GrowingIndex, max_vectors=config.max_vectors
        )
        monitor: FalseHitMonitor | None = verifier.monitor if verifier is not None else None
        self.live_threshold = LiveThreshold(
            backend,
            configured=config.threshold,
            embedder_name=embedder.name,
            metrics=metrics,
            monitor=monitor,
        )
        self.verifier = verifier
        if verifier is not None:
            verifier.attach(self.live_threshold.on_verdict)

    @property
    def threshold(self) -> float:
        return self.live_threshold.value

    def tighten(self, event: Tightened) -> None:
        self.live_threshold.tighten(event)

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
            probe = Probe(query, self._embed(query.text))
        except EmbedderError as exc:
            self.metrics.miss(MissReason.EMBEDDER_ERROR)
            log.warning("semantic lookup skipped: %s", exc.message)
            return None, None
        candidates = self.indexes.search(query.scope, probe.vector, self.config.k)
        if candidates:
            self.metrics.observe("nn_similarity", candidates[0].similarity, SIMILARITY_BUCKETS)
        hit, reason = self._first_acceptable(query, view, request, candidates)
        self.metrics.overhead(self._clock.monotonic_s() - started)
        if hit is None:
            self.metrics.miss(reason)
            return None, probe
        e = hit.entry
        self.metrics.hit(
            prompt_tokens=e.prompt_tokens,
            completion_tokens=e.completion_tokens,
            upstream_s=e.upstream_s,
            money_usd=self._prices.cost_usd(e.model, e.prompt_tokens, e.completion_tokens),
        )
        return hit, probe

    def _first_acceptable(
        self,
        query: Query,
        view: VersionView,
        request: ChatRequest,
        candidates: list[Candidate],
    ) -> tuple[SemanticHit | None, MissReason]:
        """The first candidate (most similar first) that the rule accepts and whose entry is
        fresh; else None and why the best one was refused."""
        reason = MissReason.ABSENT
        threshold = self.threshold
        for similarity, vid, item in candidates:
            decision = accept(similarity, query.text, item.text, threshold, self.guards)
            if not decision.accepted:
                if reason is MissReason.ABSENT:
                    reason = _REFUSED[decision.reason]
                if decision.reason is Reason.BELOW_THRESHOLD:
                    break  # candidates come most similar first: the rest are lower still
                continue
            try:
                entry = self.exact.fresh_entry(item.key, view, request.directives.max_age_s)
            except StoreError as exc:
                self.metrics.count("store_errors")
                log.warning("semantic candidate unreadable, serving without it: %s", exc)
                return None, MissReason.STORE_ERROR
            if entry is None:
                self.indexes.forget(vid)  # expired, evicted or invalidated in the store
                continue
            return SemanticHit(entry, item.key, similarity), reason
        return None, reason

    # -- store --

    def store(self, request: ChatRequest, view: VersionView, key: str, probe: Probe | None) -> None:
        """Index the answer just stored under exact `key` with `view` (and persist its vector)."""
        query = query_of(request, view, self.exact.ignorable_fields)
        if query is None:
            return
        try:
            same_text = probe is not None and probe.query.text == query.text
            vector = probe.vector if probe is not None and same_text else self._embed(query.text)
        except EmbedderError as exc:
            log.warning("semantic record not stored: %s", exc.message)
            return
        record = SemanticRecord(query.scope, query.text, key, self.embedder.name, vector)
        try:
            answer = self.backend.get(key)
            if answer is None:
                return
            self.backend.put(record_key(key), encode_record(record, answer))
        except StoreError as exc:
            self.metrics.count("store_errors")
            log.warning("semantic record not stored: %s", exc)
            return
        size = self.indexes.add(IndexedItem(query.scope, key, query.text), vector)
        self.metrics.gauge("vectors", size)

    def rebuild(self) -> int:
        """Load every live record of this embedder from the store; return how many."""
        now_s = self._clock.now_s()
        items: list[IndexedItem] = []
        vectors: list[npt.NDArray[np.float32]] = []
        for name, entry in self.backend.scan(RECORD_PREFIX):
            if entry.expires_at_s <= now_s:
                continue
            try:
                record = decode_record(entry)
            except ValueError as exc:
                log.warning("skipping the unreadable semantic record %s: %s", name, exc)
                continue
            if record.embedder != self.embedder.name or len(record.vector) != self.embedder.dim:
                continue  # vectors of another model are not comparable
            items.append(IndexedItem(record.scope, record.key, record.text))
            vectors.append(record.vector)
        if items:
            self.indexes.add_many(items, np.stack(vectors))
        self.metrics.gauge("vectors", len(self.indexes))
        return len(items)

    def _embed(self, text: str) -> npt.NDArray[np.float32]:
        """One text's vector; any failure of the embedder becomes `EmbedderError` (counted)."""
        try:
            vector: npt.NDArray[np.float32] = self.embedder.embed([text])[0]
        except InfercacheError as exc:  # a remote embedder down, say
            self.metrics.count("embedder_errors")
            raise EmbedderError(f"the embedder failed: {exc.message}") from exc
        return vector

    # -- live verification --

    def verify(
        self,
        body: Mapping[str, Any],
        cached: Mapping[str, Any],
        similarity: float,
        fetch: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> None:
        """Maybe check this hit against a fresh upstream answer, in the background."""
        if self.verifier is not None and self.verifier.maybe_verify(
            body, cached, similarity, fetch
        ):
            self.metrics.count("verifications_scheduled")
