"""`GrowingIndex`: exact while small, approximate once large — the semantic layer's per-scope
index.

Most scopes (one tenant × one system prompt × one parameter set) hold a handful of vectors, for
which the exact `FlatIndex` is both the fastest and never wrong, and costs next to no memory.
A scope that grows past `switch_at` vectors moves, once, into a `UsearchIndex` (HNSW), where a
search stays under a millisecond at 100k vectors while the flat scan grows linearly (16–24 ms
at 100k MiniLM vectors on 2 cores; figures in bench/README.md). It never moves back: removals
are cheap in both. Similarities are cosine in [-1, 1] in both. Thread-safe: both indexes are,
and the switch happens under this object's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy.typing as npt

from infercache.semantic.index import FlatIndex, Hit, VectorIndex

SWITCH_AT = 20_000


class GrowingIndex:
    def __init__(self, dim: int, *, switch_at: int = SWITCH_AT) -> None:
        self._dim = dim
        self._switch_at = switch_at
        self._flat: FlatIndex | None = FlatIndex(dim, initial_capacity=16)
        self._index: VectorIndex = self._flat
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def approximate(self) -> bool:
        return self._flat is None

    def __len__(self) -> int:
        return len(self._index)

    def add(self, ids: Sequence[int], vectors: npt.ArrayLike) -> None:
        with self._lock:
            self._index.add(ids, vectors)
            if self._flat is not None and len(self._flat) > self._switch_at:
                from infercache.semantic.ann_index import UsearchIndex

                held_ids, held_vectors = self._flat.export()
                ann = UsearchIndex(self._dim)
                ann.add(held_ids.tolist(), held_vectors)
                self._index, self._flat = ann, None

    def remove(self, ids: Iterable[int]) -> int:
        with self._lock:
            return self._index.remove(ids)

    def search(self, vector: npt.ArrayLike, k: int) -> list[Hit]:
        with self._lock:
            index = self._index
        return index.search(vector, k)

    def search_many(self, vectors: npt.ArrayLike, k: int) -> list[list[Hit]]:
        with self._lock:
            index = self._index
        return index.search_many(vectors, k)
