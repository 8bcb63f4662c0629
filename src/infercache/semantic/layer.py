"""The semantic layer: answer a request with the stored answer of a near-duplicate in its scope.

Lookup (after an exact miss):
  1. `scope.query_of`: the request's exact scope (everything but the last user message, with
     the model version token and tag generations) and the text compared by meaning. A request
     whose last message is not user text is outside the layer (counted `not_applicable`).
  2. Embed the text; search the scope's own vector index for the top `k` neighbours (cosine
     similarity in [-1, 1]); observe the nearest one's similarity in a histogram, hit or miss.
  3. Walk the neighbours from the most similar: `decision.accept` (threshold, then guards — the
     same rule `infercache tune` calibrates) must accept, and the neighbour's exact entry must be
     fresh for this request (`ExactCache.fresh_entry`: TTL, model version, tag generations,
     max-age). A neighbour whose entry is gone (expired, evicted, invalidated) is dropped from
     the index on the spot, so the index never serves what the store no longer would.
Store (after the exact layer stored an answer): a record `sem:{exact key}` in the same backend
holds scope, text and vector, with the exact entry's expiry, so a restart rebuilds every index
from the store (`rebuild`); the vector joins its scope's index.

Live verification (verify.py) samples hits; when the false-hit rate is above target with 95%
confidence, the threshold tightens by itself and the new value is kept in the store's meta, so
it survives restarts (until the operator configures a different threshold).

Indexes are per process: another process's new records are seen after its restart. Thread-safe
(one lock around index state).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from infercache.clock import Clock
from infercache.errors import InfercacheError, StoreError
from infercache.exact import ExactCache
from infercache.metrics import MissReason, PriceTable, StrategyMetrics
from infercache.request import ChatRequest
from infercache.semantic.decision import Reason, accept
from infercache.semantic.embedder import Embedder
from infercache.semantic.growing_index import GrowingIndex
from infercache.semantic.guards import Guard
from infercache.semantic.index import IndexFactory, VectorIndex
from infercache.semantic.scope import Query, query_of
from infercache.semantic.verify import FalseHitMonitor, Tightened, Verifier
from infercache.stores.base import Backend, Entry
from infercache.versions import VersionView

log = logging.getLogger(__name__)

RECORD_PREFIX = "sem:"
SIMILARITY_BUCKETS = (*(round(0.05 * i, 2) for i in range(-4, 20)), 0.97, 0.99)


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


class _Item(NamedTuple):
    scope: str
    key: str
    text: str


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
        self._new_index: IndexFactory = index_factory or GrowingIndex
        self.verifier = verifier
        if verifier is not None:
            verifier.attach(self.on_verdict)
        self._lock = threading.Lock()
        self._indexes: dict[str, VectorIndex] = {}
        self._items: OrderedDict[int, _Item] = OrderedDict()
        self._id_of_key: dict[str, int] = {}
        self._next_id = 0
        self._threshold = self._load_threshold()
        self.metrics.gauge("threshold", self._threshold)

    # -- threshold --

    @property
    def threshold(self) -> float:
        return self._threshold

    def _meta_name(self) -> str:
        return f"semantic:threshold:{self.embedder.name}"

    def _load_threshold(self) -> float:
        """The configured threshold, or the one live verification tightened it to since."""
        try:
            raw = self.backend.read_meta([self._meta_name()]).get(self._meta_name())
        except StoreError as exc:
            log.warning("could not read the stored semantic threshold: %s", exc)
            return self.config.threshold
        if raw is None:
            return self.config.threshold
        saved = json.loads(raw)
        if saved.get("configured") != self.config.threshold:
            return self.config.threshold  # the operator re-tuned: their value wins
        return float(saved["current"])

    def tighten(self, event: Tightened) -> None:
        with self._lock:
            self._threshold = max(self._threshold, event.new_threshold)
            current = self._threshold
        self.metrics.count("threshold_tightened")
        self.metrics.gauge("threshold", current)
        log.warning(
            "semantic false-hit rate above target (%d of %d verified hits wrong): "
            "threshold %.4f -> %.4f",
            event.false_hits,
            event.verified,
            event.old_threshold,
            current,
        )
        saved = json.dumps({"configured": self.config.threshold, "current": current})
        try:
            self.backend.write_meta(self._meta_name(), saved)
        except StoreError as exc:
            log.warning("could not persist the tightened threshold: %s", exc)

    def on_verdict(self, similarity: float, wrong: bool) -> None:
        """A verification's verdict (called by the Verifier's background thread)."""
        assert self.verifier is not None
        monitor: FalseHitMonitor = self.verifier.monitor
        self.metrics.count("verified")
        if wrong:
            self.metrics.count("verified_false_hits")
        event = monitor.record(similarity, wrong, self._threshold)
        lower, upper = monitor.interval()
        self.metrics.gauge("false_hit_estimate", monitor.estimate())
        self.metrics.gauge("false_hit_lower", lower)
        self.metrics.gauge("false_hit_upper", upper)
        if event is not None:
            self.tighten(event)

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
            vector = self.embedder.embed([query.text])[0]
        except InfercacheError as exc:  # e.g. a remote embedder down: a counted miss
            self.metrics.count("embedder_errors")
            self.metrics.miss(MissReason.STORE_ERROR)
            log.warning("semantic lookup skipped, the embedder failed: %s", exc)
            return None, None
        probe = Probe(query, vector)
        with self._lock:
            index = self._indexes.get(query.scope)
            neighbours = index.search(vector, self.config.k) if index is not None else []
            candidates = [(n.similarity, n.id, self._items.get(n.id)) for n in neighbours]
            threshold = self._threshold
        if candidates:
            self.metrics.observe("nn_similarity", candidates[0][0], SIMILARITY_BUCKETS)
        hit, reason = self._first_acceptable(query, view, request, candidates, threshold)
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
        candidates: list[tuple[float, int, _Item | None]],
        threshold: float,
    ) -> tuple[SemanticHit | None, MissReason]:
        reason = MissReason.ABSENT
        for similarity, vid, item in candidates:
            if item is None:
                continue
            decision = accept(similarity, query.text, item.text, threshold, self.guards)
            if not decision.accepted:
                if reason is MissReason.ABSENT:
                    reason = (
                        MissReason.BELOW_THRESHOLD
                        if decision.reason is Reason.BELOW_THRESHOLD
                        else MissReason.GUARD_REJECTED
                    )
                if decision.reason is Reason.BELOW_THRESHOLD:
                    break  # neighbours come most similar first: the rest are lower still
                continue
            try:
                entry = self.exact.fresh_entry(item.key, view, request.directives.max_age_s)
            except StoreError as exc:
                self.metrics.count("store_errors")
                log.warning("semantic candidate unreadable, serving without it: %s", exc)
                return None, MissReason.STORE_ERROR
            if entry is None:
                self._forget(vid)  # expired, evicted or invalidated in the store
                continue
            return SemanticHit(entry, item.key, similarity), reason
        return None, reason

    # -- store --

    def store(self, request: ChatRequest, view: VersionView, key: str, probe: Probe | None) -> None:
        """Index the answer just stored under exact `key` with `view` (and persist its vector)."""
        query = query_of(request, view, self.exact.ignorable_fields)
        if query is None:
            return
        if probe is not None and probe.query.text == query.text:
            probe = Probe(query, probe.vector)
        else:
            try:
                probe = Probe(query, self.embedder.embed([query.text])[0])
            except InfercacheError as exc:
                self.metrics.count("embedder_errors")
                log.warning("semantic record not stored, the embedder failed: %s", exc)
                return
        try:
            entry = self.backend.get(key)
            if entry is None:
                return
            self.backend.put(RECORD_PREFIX + key, self._record(probe, key, entry))
        except StoreError as exc:
            self.metrics.count("store_errors")
            log.warning("semantic record not stored: %s", exc)
            return
        self._add(_Item(probe.query.scope, key, probe.query.text), probe.vector)

    def _record(self, probe: Probe, key: str, entry: Entry) -> Entry:
        body = {
            "scope": probe.query.scope,
            "text": probe.query.text,
            "key": key,
            "embedder": self.embedder.name,
            "vector": base64.b64encode(probe.vector.astype(np.float32).tobytes()).decode(),
        }
        return Entry(
            response=json.dumps(body, separators=(",", ":")).encode(),
            model=entry.model,
            model_version=entry.model_version,
            tags=entry.tags,
            created_at_s=entry.created_at_s,
            expires_at_s=entry.expires_at_s,
            upstream_s=0.0,
            prompt_tokens=0,
            completion_tokens=0,
        )

    def rebuild(self) -> int:
        """Load every live record of this embedder from the store; return how many."""
        now_s = self._clock.now_s()
        loaded = 0
        for _, record in self.backend.scan(RECORD_PREFIX):
            if record.expires_at_s <= now_s:
                continue
            body = json.loads(record.response)
            if body.get("embedder") != self.embedder.name:
                continue  # vectors of another model are not comparable
            vector = np.frombuffer(base64.b64decode(body["vector"]), dtype=np.float32)
            self._add(_Item(body["scope"], body["key"], body["text"]), vector)
            loaded += 1
        self.metrics.gauge("vectors", len(self._items))
        return loaded

    def _add(self, item: _Item, vector: npt.NDArray[np.float32]) -> None:
        with self._lock:
            old = self._id_of_key.pop(item.key, None)
            if old is not None:
                self._forget_locked(old)
            vid = self._next_id
            self._next_id += 1
            index = self._indexes.get(item.scope)
            if index is None:
                index = self._indexes[item.scope] = self._new_index(self.embedder.dim)
            index.add([vid], vector.reshape(1, -1))
            self._items[vid] = item
            self._id_of_key[item.key] = vid
            while len(self._items) > self.config.max_vectors:
                self._forget_locked(next(iter(self._items)))
            size = len(self._items)
        self.metrics.gauge("vectors", size)

    def _forget(self, vid: int) -> None:
        with self._lock:
            self._forget_locked(vid)

    def _forget_locked(self, vid: int) -> None:
        item = self._items.pop(vid, None)
        if item is None:
            return
        if self._id_of_key.get(item.key) == vid:
            del self._id_of_key[item.key]
        index = self._indexes.get(item.scope)
        if index is not None:
            index.remove([vid])
            if len(index) == 0:
                del self._indexes[item.scope]

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
