"""`ServedAnswers`: which cached entry served each recent answer, so that a complaint about an
answer (`Cache.report_wrong`, `POST /v1/feedback`) retires that entry and is counted against
the layer that answered.

A bounded LRU keyed by (tenant, response id), in this process's memory:
- `remember` on every answer a cache entry holds: an exact hit, a semantic hit, an answer
  fetched upstream and stored, an identical request's answer shared in flight;
- each record lives `ttl_s` after the answer was last served (injected clock) and at most
  `max_answers` records are kept, the least recently served dropped first; a record served
  again is refreshed at most once a second (`REFRESH_GRANULARITY_S`, a tenth of `ttl_s` if
  that is less): a hot answer's repeats in between change nothing and take no lock;
- `take(tenant, id)` returns the record only to the tenant it was served to: another tenant's
  report finds nothing, as an unknown id does (a caller cannot tell the two apart).

A replayed answer keeps the upstream's response id, so one id may be served several times to
one tenant: its fetch, exact hits of its question, semantic hits of paraphrases. Those
servings merge into one record: every exact key that held the answer, and the semantic
serving's key, score and answer group, since a complaint is then most likely about a
paraphrase (an answer replayed to its own question is wrong only if the upstream was). The
record's `layer` is the most suspect layer that served it: semantic, then exact, then fetched.
Tenants never share entries, so two tenants meet on one id only when an upstream repeats ids.

`retire_reported` acts on a first report: every key that held the answer is deleted (the exact
entry, its semantic record and vector) unless a refresh has since replaced the answer there;
a semantic serving goes through `SemanticLayer.report_wrong` (the answer's statistics, the
threshold or calibration, the `complaints` counter of the semantic strategy); an exact or
fetched one is counted on the exact strategy (`complaints`, `complaints_on_fetched`).

A reported record stays, marked, so a repeated report (a client retrying) is accepted again
but counted once. Records are per process: behind several gateway replicas a report reaches
the replica that served the answer only if the balancer keeps the client there (the entry it
retires is in the shared store either way). Thread-safe (one lock).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import StrEnum

import orjson

from infercache.clock import Clock
from infercache.errors import StoreError
from infercache.metrics import StrategyMetrics
from infercache.semantic.answer_stats import GroupKey
from infercache.semantic.layer import SemanticLayer
from infercache.semantic.records import record_key
from infercache.stores.base import Backend

log = logging.getLogger(__name__)


class ServedBy(StrEnum):
    """Which layer served an answer, most suspect first (a complaint is charged to it)."""

    SEMANTIC = "semantic"
    EXACT = "exact"
    FETCHED = "fetched"  # fetched upstream and stored (or shared in flight with its leader)


_SUSPICION = {ServedBy.SEMANTIC: 2, ServedBy.EXACT: 1, ServedBy.FETCHED: 0}
REFRESH_GRANULARITY_S = 1.0


@dataclass(frozen=True, slots=True)
class SemanticServing:
    """What a semantic complaint needs: the served entry's key and the decision it passed."""

    key: str
    score: float  # on the matcher's scale, the score the threshold was applied to
    group: GroupKey | None


@dataclass(slots=True)
class ServedAnswer:
    layer: ServedBy
    keys: set[str]  # exact keys that held this answer when it was served
    semantic: SemanticServing | None = None
    reported: bool = False
    expires_at_s: float = field(default=0.0)


class ServedAnswers:
    def __init__(self, *, max_answers: int, ttl_s: float, clock: Clock) -> None:
        if max_answers < 0 or ttl_s <= 0:
            raise ValueError(f"need max_answers >= 0 and ttl_s > 0, got {max_answers}, {ttl_s}")
        self.max_answers = max_answers
        self.ttl_s = ttl_s
        # A record served again is refreshed (expiry, LRU order) at most once per granularity.
        refresh_granularity_s = min(REFRESH_GRANULARITY_S, ttl_s / 10)
        self._refreshed_within_s = ttl_s - refresh_granularity_s
        self._clock = clock
        self._lock = threading.Lock()
        self._records: OrderedDict[tuple[str, str], ServedAnswer] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def remember(
        self,
        tenant: str,
        response_id: object,
        layer: ServedBy,
        keys: tuple[str, ...],
        semantic: SemanticServing | None = None,
    ) -> None:
        """One answer served to `tenant` (an answer without a string id cannot be reported)."""
        if not isinstance(response_id, str) or not response_id or self.max_answers == 0:
            return
        now_s = self._clock.monotonic_s()
        name = (tenant, response_id)
        records = self._records
        record = records.get(name)  # read without the lock: at worst a moment old
        if (
            record is not None
            and record.layer is layer
            and semantic is None
            and not record.reported
            and record.expires_at_s > now_s + self._refreshed_within_s
            and record.keys.issuperset(keys)
        ):
            return  # the hot path: served again within the refresh granularity, as it was
        with self._lock:
            record = records.get(name)
            if record is None or record.reported or record.expires_at_s <= now_s:
                records.pop(name, None)
                records[name] = record = ServedAnswer(
                    layer, set(keys), semantic, expires_at_s=now_s + self.ttl_s
                )
                while len(records) > self.max_answers:
                    records.popitem(last=False)
                self._drop_expired(now_s)  # records only grow here: dropping here bounds them
            else:  # served again (a hot cached answer): refreshed, moved to the young end
                if not record.keys.issuperset(keys):
                    record.keys.update(keys)
                if layer is not record.layer and _SUSPICION[layer] > _SUSPICION[record.layer]:
                    record.layer = layer
                if semantic is not None:
                    record.semantic = semantic
                records.move_to_end(name)
                record.expires_at_s = now_s + self.ttl_s

    def take(self, tenant: str, response_id: str) -> tuple[ServedAnswer, bool] | None:
        """The live record of `response_id` served to `tenant` and whether this is its first
        report (it is marked reported); None when this tenant was not served it recently."""
        now_s = self._clock.monotonic_s()
        with self._lock:
            record = self._records.get((tenant, response_id))
            if record is None or record.expires_at_s <= now_s:
                return None
            first, record.reported = not record.reported, True
            return record, first

    def _drop_expired(self, now_s: float) -> None:
        """Drop expired records from the old end (a few per call: amortised O(1))."""
        for _ in range(2):
            if not self._records:
                return
            name, oldest = next(iter(self._records.items()))
            if oldest.expires_at_s > now_s:
                return
            del self._records[name]


def retire_reported(
    record: ServedAnswer,
    response_id: str,
    *,
    backend: Backend,
    semantic: SemanticLayer | None,
    exact_metrics: StrategyMetrics,
) -> None:
    """Act on the first report of `record` (module docstring)."""
    keys = set(record.keys)
    serving = record.semantic
    if record.layer is ServedBy.SEMANTIC and serving is not None and semantic is not None:
        if _holds(backend, serving.key, response_id, exact_metrics):
            semantic.report_wrong(serving.key, score=serving.score, group=serving.group)
        else:  # replaced since: nothing to retire there, the wrong decision still counts
            semantic.outcomes.complaint(serving.score, serving.group)
        keys.discard(serving.key)
    else:
        exact_metrics.count(
            "complaints" if record.layer is ServedBy.EXACT else "complaints_on_fetched"
        )
    for key in keys:
        if _holds(backend, key, response_id, exact_metrics):
            _retire(backend, key, semantic, exact_metrics)


def _holds(backend: Backend, key: str, response_id: str, metrics: StrategyMetrics) -> bool:
    """Whether the entry under `key` still holds the answer `response_id` (a refresh may
    have replaced it with another answer, which nobody reported)."""
    try:
        entry = backend.get(key)
    except StoreError as exc:
        metrics.count("store_errors")
        log.warning("could not read the entry reported wrong: %s", exc)
        return False
    return entry is not None and orjson.loads(entry.response).get("id") == response_id


def _retire(
    backend: Backend, key: str, semantic: SemanticLayer | None, metrics: StrategyMetrics
) -> None:
    """Delete exact entry `key` and, with the semantic layer on, its record and vector."""
    if semantic is not None:
        semantic.indexes.forget_key(key)
    try:
        backend.delete(key)
        if semantic is not None:
            backend.delete(record_key(key))
    except StoreError as exc:
        metrics.count("store_errors")
        log.warning("could not delete the entry reported wrong: %s", exc)
