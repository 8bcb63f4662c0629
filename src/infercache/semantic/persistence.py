"""The semantic layer's persisted side: records in the store, and the feed to other replicas.

- `write`: after the exact layer stored an answer under `key`, its `records.SemanticRecord`
  (scope, text, answer digest, vector) goes to the same backend under `sem:{key}` with the
  exact entry's expiry, so a restart rebuilds every index from the store without embedding
  anything (`scan`).
- `indexable`: which stored records may join an index — live, readable, and of this embedder
  (another model's vectors are not comparable).
- `retire`: a complaint deletes the record and the exact entry.
- `publish`: on a Redis store the replicas share their indexes through a feed
  (replica_sync.py): an `ADD {key}` once a record is written, a `REMOVE {key}` when one is
  retired, best effort (a failed publish is counted as `feed_errors` and logged; the entry
  reaches the others at their next rebuild). Correctness never rests on the feed: every
  candidate is checked against the store on read.
Thread-safe: it holds no state but the feed's last published position.
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass, field

import numpy as np
import numpy.typing as npt

from infercache.clock import Clock
from infercache.errors import StoreError
from infercache.metrics import StrategyMetrics
from infercache.semantic.records import (
    RECORD_PREFIX,
    SemanticRecord,
    answer_digest,
    decode_record,
    encode_record,
    record_key,
)
from infercache.semantic.registry import IndexedItem
from infercache.semantic.scope import Query
from infercache.stores.base import Backend, Entry
from infercache.stores.feed import Feed, FeedEvent, FeedKind

log = logging.getLogger(__name__)

Vector = npt.NDArray[np.float32]


@dataclass(eq=False, repr=False, slots=True)
class Records:
    backend: Backend
    _: KW_ONLY
    embedder_name: str
    dim: int
    metrics: StrategyMetrics
    clock: Clock
    # where adds and removals are published (replica_sync), and the last event's position
    feed: Feed | None = field(init=False, default=None)
    published: str | None = field(init=False, default=None)

    def write(self, query: Query, key: str, vector: Vector) -> tuple[IndexedItem, Entry] | None:
        """Persist the record of the answer stored under exact `key`; the item to index and
        the answer, or None when that answer is gone already. Raises StoreError."""
        answer = self.backend.get(key)
        if answer is None:
            return None
        digest = answer_digest(answer.response)
        record = SemanticRecord(query.scope, query.text, key, self.embedder_name, vector, digest)
        self.backend.put(record_key(key), encode_record(record, answer))
        return IndexedItem(query.scope, key, query.text, digest), answer

    def scan(self) -> tuple[list[IndexedItem], list[Vector]]:
        """Every live record of this embedder in the store. Raises StoreError."""
        now_s = self.clock.now_s()
        items: list[IndexedItem] = []
        vectors: list[Vector] = []
        for name, entry in self.backend.scan(RECORD_PREFIX):
            indexable = self.indexable(name, entry, now_s)
            if indexable is not None:
                items.append(indexable[0])
                vectors.append(indexable[1])
        return items, vectors

    def read(self, key: str) -> tuple[IndexedItem, Vector] | None:
        """The record of exact `key` as the store holds it now (None: gone). Raises StoreError."""
        name = record_key(key)
        entry = self.backend.get(name)
        return None if entry is None else self.indexable(name, entry, self.clock.now_s())

    def indexable(self, name: str, entry: Entry, now_s: float) -> tuple[IndexedItem, Vector] | None:
        """The item and vector the record `entry` (stored under `name`) stands for; None if
        it expired, is unreadable or holds another model's vector (not comparable)."""
        if entry.expires_at_s <= now_s:
            return None
        try:
            record = decode_record(entry)
        except ValueError as exc:
            log.warning("skipping the unreadable semantic record %s: %s", name, exc)
            return None
        if record.embedder != self.embedder_name or len(record.vector) != self.dim:
            return None
        return IndexedItem(record.scope, record.key, record.text, record.answer), record.vector

    def retire(self, key: str) -> None:
        """Delete the record and the exact entry of `key` (a failure is logged and counted),
        and tell the other replicas to stop serving it, even when undeleted."""
        try:
            self.backend.delete(record_key(key))
            self.backend.delete(key)
        except StoreError as exc:
            self.metrics.count("store_errors")
            log.warning("could not delete the entry reported wrong: %s", exc)
        self.publish(FeedKind.REMOVE, key)

    def publish(self, kind: FeedKind, key: str) -> None:
        """Tell the other replicas (best effort: the store is the truth, they rebuild from it)."""
        if self.feed is None:
            return
        try:
            self.published = self.feed.publish(FeedEvent(kind, key))
            self.metrics.count("feed_published")
        except StoreError as exc:
            self.metrics.count("feed_errors")
            log.warning("semantic %s of %s not shared with other replicas: %s", kind, key, exc)
