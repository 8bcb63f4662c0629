"""`FlatIndex`: exact cosine search over one contiguous numpy matrix, a `VectorIndex` (contract
in `index.py`).

Layout: one `(capacity, dim)` float32 matrix, rows [0, len) live. `add` appends (capacity
doubles, so a rebuild of n vectors copies O(n) rows in total) or overwrites a row in place;
`remove` moves the last row into the hole (swap-remove), keeping live rows contiguous. Maps:
`_row_of[id] → row` and `_ids[row] → id`, kept inverse to each other. Search is one
matrix-vector product plus `argpartition`: linear in the vectors held, so large scopes move to
`hnsw_index.HNSWIndex` (`growing_index` does it; timings in bench/README.md, "Vector index").
Ties in similarity are ordered by ascending id, so results are deterministic. One lock around
every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from infercache.semantic.vectors import CheckedIndex, Hit, as_matrix, check_ids, top_k


class FlatIndex(CheckedIndex):
    """Exact cosine search over a contiguous numpy matrix (see the module docstring)."""

    def __init__(self, dim: int, *, initial_capacity: int = 1024) -> None:
        super().__init__(dim)
        capacity = max(1, initial_capacity)
        self._vectors = np.zeros((capacity, dim), dtype=np.float32)
        self._ids = np.zeros(capacity, dtype=np.int64)
        self._row_of: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._row_of)

    def add(self, ids: Sequence[int], vectors: npt.ArrayLike) -> None:
        id_array = check_ids(ids)
        matrix = as_matrix(vectors, self._dim, rows=len(id_array))
        with self._lock:
            existing = [i for i, id_ in enumerate(id_array.tolist()) if id_ in self._row_of]
            if existing:
                rows = [self._row_of[int(id_array[i])] for i in existing]
                self._vectors[rows] = matrix[existing]
                fresh = np.ones(len(id_array), dtype=bool)
                fresh[existing] = False
                id_array, matrix = id_array[fresh], matrix[fresh]
            start = len(self._row_of)
            self._reserve(start + len(id_array))
            self._vectors[start : start + len(id_array)] = matrix
            self._ids[start : start + len(id_array)] = id_array
            self._row_of.update(
                zip(id_array.tolist(), range(start, start + len(id_array)), strict=True)
            )

    def remove(self, ids: Iterable[int]) -> int:
        removed = 0
        with self._lock:
            for id_ in ids:
                row = self._row_of.pop(int(id_), None)
                if row is None:
                    continue
                removed += 1
                last = len(self._row_of)  # the old last row, now outside [0, len)
                if row != last:
                    moved = int(self._ids[last])
                    self._vectors[row] = self._vectors[last]
                    self._ids[row] = moved
                    self._row_of[moved] = row
        return removed

    def export(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        """Copies of every (id, vector) held, to move them into another index."""
        with self._lock:
            n = len(self._row_of)
            return self._ids[:n].copy(), self._vectors[:n].copy()

    def _search_rows(self, queries: npt.NDArray[np.float32], k: int) -> list[list[Hit]]:
        with self._lock:
            n = len(self._row_of)
            if n == 0:
                return [[] for _ in range(len(queries))]
            similarities = queries @ self._vectors[:n].T
            return [top_k(row, self._ids[:n], k) for row in similarities]

    def _reserve(self, needed: int) -> None:
        capacity = len(self._vectors)
        if needed <= capacity:
            return
        while capacity < needed:
            capacity *= 2
        vectors = np.zeros((capacity, self._dim), dtype=np.float32)
        vectors[: len(self._row_of)] = self._vectors[: len(self._row_of)]
        ids = np.zeros(capacity, dtype=np.int64)
        ids[: len(self._row_of)] = self._ids[: len(self._row_of)]
        self._vectors, self._ids = vectors, ids
