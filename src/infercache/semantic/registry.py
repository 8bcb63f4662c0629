"""`ScopedIndexes`: the semantic layer's vectors, one `VectorIndex` per exact scope.

A near-duplicate may only answer inside its own scope (scope.py), so each scope gets its own
index, built on first use by the injected `IndexFactory` and dropped when its last vector goes;
a search never has to filter out other tenants' or other prompts' vectors.

Invariants (tests/semantic/test_registry.py):
- Each vector has a process-local integer id (`vid`), never reused — not even by another
  registry of the process, so a candidate found before a rebuild swapped registries can never
  name another vector of the new one — naming an `IndexedItem` (scope, exact key, text).
  `_items[vid]` is present exactly when `vid` is in its scope's index.
- One exact key has at most one vector: adding a key again replaces its old vector.
- At most `max_vectors` vectors are held in total; beyond it the oldest added go first.
- `answer_count(scope, answer)` is how many held vectors of `scope` carry that answer digest
  (what the fitted matcher's fifth feature reads).

Thread-safe: one lock around the maps and every index call made through this class.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from infercache.semantic.index import IndexFactory, VectorIndex

_VIDS = itertools.count()  # shared by every registry of the process (next() holds the GIL)


class IndexedItem(NamedTuple):
    scope: str
    key: str  # the exact key whose answer the vector stands for
    text: str  # the text compared by meaning (guards read it)
    answer: str = ""  # records.answer_digest of that answer ("" unknown)


class Candidate(NamedTuple):
    similarity: float  # cosine similarity in [-1, 1] to the query
    vid: int
    item: IndexedItem


class ScopedIndexes:
    def __init__(self, dim: int, factory: IndexFactory, *, max_vectors: int) -> None:
        if max_vectors < 1:
            raise ValueError(f"max_vectors must be >= 1, got {max_vectors}")
        self.dim = dim
        self._factory = factory
        self._max_vectors = max_vectors
        self._lock = threading.Lock()
        self._indexes: dict[str, VectorIndex] = {}
        self._items: OrderedDict[int, IndexedItem] = OrderedDict()  # oldest first
        self._vid_of_key: dict[str, int] = {}
        self._answers: dict[tuple[str, str], int] = {}  # (scope, answer) -> vectors held

    def __len__(self) -> int:
        return len(self._items)

    @property
    def scopes(self) -> int:
        return len(self._indexes)

    def search(self, scope: str, vector: npt.ArrayLike, k: int) -> list[Candidate]:
        """The (up to) k nearest vectors of `scope`, most similar first."""
        with self._lock:
            index = self._indexes.get(scope)
            if index is None:
                return []
            return [
                Candidate(hit.similarity, hit.id, self._items[hit.id])
                for hit in index.search(vector, k)
                if hit.id in self._items
            ]

    def add(self, item: IndexedItem, vector: npt.NDArray[np.float32]) -> int:
        """Index `item` (replacing its key's old vector); returns how many vectors are held."""
        return self.add_many([item], vector.reshape(1, -1))

    def add_many(self, items: Sequence[IndexedItem], vectors: npt.NDArray[np.float32]) -> int:
        """Index many items at once, one index call per scope (a rebuild); a key listed twice
        keeps its last vector. Returns how many vectors are held."""
        last_row = {item.key: row for row, item in enumerate(items)}
        by_scope: dict[str, list[tuple[int, int]]] = defaultdict(list)  # scope -> (vid, row)
        with self._lock:
            for key, row in last_row.items():
                old = self._vid_of_key.get(key)
                if old is not None:
                    self._forget_locked(old)
                vid = next(_VIDS)
                self._items[vid] = items[row]
                group = (items[row].scope, items[row].answer)
                self._answers[group] = self._answers.get(group, 0) + 1
                self._vid_of_key[key] = vid
                by_scope[items[row].scope].append((vid, row))
            for scope, members in by_scope.items():
                index = self._indexes.get(scope)
                if index is None:
                    index = self._indexes[scope] = self._factory(self.dim)
                vids, rows = zip(*members, strict=True)
                index.add(list(vids), vectors[list(rows)])
            while len(self._items) > self._max_vectors:
                self._forget_locked(next(iter(self._items)))
            return len(self._items)

    def answer_count(self, scope: str, answer: str) -> int:
        """How many held vectors of `scope` carry `answer` (1 for an unknown answer "")."""
        if not answer:
            return 1
        with self._lock:
            return self._answers.get((scope, answer), 0)

    def item_of_key(self, key: str) -> IndexedItem | None:
        with self._lock:
            vid = self._vid_of_key.get(key)
            return self._items.get(vid) if vid is not None else None

    def forget(self, vid: int) -> None:
        with self._lock:
            self._forget_locked(vid)

    def forget_key(self, key: str) -> bool:
        """Drop the vector of exact key `key`; True if there was one."""
        with self._lock:
            vid = self._vid_of_key.get(key)
            if vid is None:
                return False
            self._forget_locked(vid)
            return True

    def _forget_locked(self, vid: int) -> None:
        item = self._items.pop(vid, None)
        if item is None:
            return
        group = (item.scope, item.answer)
        left = self._answers.get(group, 1) - 1
        if left > 0:
            self._answers[group] = left
        else:
            self._answers.pop(group, None)
        if self._vid_of_key.get(item.key) == vid:
            del self._vid_of_key[item.key]
        index = self._indexes.get(item.scope)
        if index is not None:
            index.remove([vid])
            if len(index) == 0:
                del self._indexes[item.scope]
