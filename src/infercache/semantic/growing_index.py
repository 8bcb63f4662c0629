"""`GrowingIndex`: exact while small, approximate once large — the semantic layer's default
`VectorIndex` (contract in `index.py`), one per scope.

Most scopes (one tenant × one system prompt × one parameter set) hold a handful of vectors, for
which the exact `FlatIndex` is both the fastest and never wrong, and costs next to no memory.
A scope that grows past `switch_at` vectors moves, once, into an `HNSWIndex`, whose search time
stays flat while the flat scan grows linearly with the vectors held (bench/README.md, "Vector
index" and "Lookup latency"). It never moves back: removals are cheap in both. Similarities are
cosine in [-1, 1] in both.

Thread-safe: both indexes are, and the switch happens under this object's lock (a search that
took the flat index just before the switch still reads a valid, complete index).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

import numpy.typing as npt

from infercache.semantic.flat_index import FlatIndex
from infercache.semantic.index import VectorIndex
from infercache.semantic.vectors import Hit, check_dim

SWITCH_AT = 20_000


class GrowingIndex:
    def __init__(self, dim: int, *, switch_at: int = SWITCH_AT) -> None:
        if switch_at < 0:
            raise ValueError(f"switch_at must be >= 0, got {switch_at}")
        self._dim = check_dim(dim)
        self._switch_at = switch_at
        self._flat: FlatIndex | None = FlatIndex(dim, initial_capacity=16)
        self._index: VectorIndex = self._flat
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self._dim

    def __len__(self) -> int:
        return len(self._index)

    def add(self, ids: Sequence[int], vectors: npt.ArrayLike) -> None:
        with self._lock:
            self._index.add(ids, vectors)
            if self._flat is not None and len(self._flat) > self._switch_at:
                from infercache.semantic.hnsw_index import HNSWIndex

                held_ids, held_vectors = self._flat.export()
                graph = HNSWIndex(self._dim)
                graph.add(held_ids.tolist(), held_vectors)
                self._index, self._flat = graph, None

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
