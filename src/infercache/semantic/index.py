"""Nearest cached vectors, behind the `VectorIndex` Protocol, and the exact numpy `FlatIndex`.

Contract (one contract test suite runs it against every implementation):
- Vectors are float32 rows of length `dim`, L2-normalised by the caller (the embedder does it),
  so the inner product is the cosine similarity. Every `Hit.similarity` is a cosine similarity
  clipped to [-1, 1]; higher is closer. It is never a distance.
- Ids are integers in [0, 2**63). `add` of an id already present replaces its vector (an
  upsert), so a rebuild can re-add freely; one call must not repeat an id.
- `remove(ids)` ignores unknown ids and returns how many were present. A removed id is never
  returned by a later search (an approximate index may miss live ids, never return dead ones).
- `search(vector, k)` returns at most k hits, best first; fewer when the index holds fewer.
  `search_many(matrix, k)` does the same for each row.
- Bad shapes, k < 1, ids out of range or repeated raise `InvalidRequestError` naming the value.
- Each index takes an internal lock: any method may be called from several threads.

`FlatIndex` is exact: one contiguous `(capacity, dim)` matrix, rows [0, len) live. `add` appends
(capacity doubles, so a rebuild of n vectors copies O(n) rows in total) or overwrites a row in
place; `remove` moves the last row into the hole (swap-remove), keeping live rows contiguous.
Maps: `_row_of[id] → row` and `_ids[row] → id`, kept inverse to each other. Search is one
matrix-vector product plus `argpartition`: ~0.5 ms at 10k × 384, 16–24 ms at 100k on 2 cores
(bench/README.md), so beyond ~20k vectors use `ann_index.UsearchIndex`.
Ties in similarity are ordered by ascending id, so results are deterministic.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from infercache.errors import ConfigError, InvalidRequestError

MAX_ID = 2**63 - 1


class Hit(NamedTuple):
    id: int
    similarity: float
    """Cosine similarity in [-1, 1]; 1 = same direction."""


class VectorIndex(Protocol):
    @property
    def dim(self) -> int: ...

    def add(self, ids: Sequence[int], vectors: npt.ArrayLike) -> None:
        """Insert or replace one vector per id (`vectors` shape `(len(ids), dim)`)."""
        ...

    def search(self, vector: npt.ArrayLike, k: int) -> list[Hit]:
        """The (up to) k most similar live vectors to one `(dim,)` vector, best first."""
        ...

    def search_many(self, vectors: npt.ArrayLike, k: int) -> list[list[Hit]]:
        """`search` for each row of an `(n, dim)` matrix."""
        ...

    def remove(self, ids: Iterable[int]) -> int:
        """Forget these ids; unknown ids are ignored. Returns how many were present."""
        ...

    def __len__(self) -> int: ...


def check_dim(dim: int) -> int:
    if dim < 1:
        raise ConfigError(f"index dim must be at least 1, got {dim}")
    return dim


def as_matrix(
    vectors: npt.ArrayLike, dim: int, *, rows: int | None = None
) -> npt.NDArray[np.float32]:
    """`vectors` as a C-contiguous float32 `(n, dim)` matrix, or `InvalidRequestError`."""
    matrix = np.ascontiguousarray(vectors, dtype=np.float32)
    if rows == 0 and matrix.size == 0:
        return np.zeros((0, dim), dtype=np.float32)
    if matrix.ndim != 2 or matrix.shape[1] != dim or (rows is not None and len(matrix) != rows):
        expected = f"({rows if rows is not None else 'n'}, {dim})"
        raise InvalidRequestError(f"vectors must have shape {expected}, got {matrix.shape}")
    if not np.isfinite(matrix).all():
        raise InvalidRequestError("vectors contain NaN or infinity")
    return matrix


def as_vector(vector: npt.ArrayLike, dim: int) -> npt.NDArray[np.float32]:
    array = np.asarray(vector, dtype=np.float32)
    if array.shape != (dim,):
        raise InvalidRequestError(f"query vector must have shape ({dim},), got {array.shape}")
    return as_matrix(array[None, :], dim)


def check_ids(ids: Sequence[int]) -> npt.NDArray[np.int64]:
    """Ids as int64, each in [0, MAX_ID] and unique within the call."""
    array = np.asarray(ids)
    if array.ndim != 1 or (len(array) and not np.issubdtype(array.dtype, np.integer)):
        raise InvalidRequestError(f"ids must be a flat sequence of integers, got {ids!r:.80}")
    if len(array) and (array.min() < 0 or array.max() > MAX_ID):
        bad = array[(array < 0) | (array > MAX_ID)][0]
        raise InvalidRequestError(f"ids must lie in [0, 2**63), got {int(bad)}")
    out = array.astype(np.int64)
    unique, counts = np.unique(out, return_counts=True)
    if len(unique) != len(out):
        raise InvalidRequestError(f"id {int(unique[counts > 1][0])} repeated in one add()")
    return out


def check_k(k: int) -> int:
    if k < 1:
        raise InvalidRequestError(f"k must be at least 1, got {k}")
    return k


def top_k(similarities: npt.NDArray[np.float32], ids: npt.NDArray[np.int64], k: int) -> list[Hit]:
    """The k best (similarity desc, id asc) of parallel arrays, as clipped `Hit`s."""
    if len(similarities) > k:
        # Keep every row tied with the k-th best so the id tie-break below sees all of them.
        kth = np.partition(similarities, len(similarities) - k)[len(similarities) - k]
        keep = np.flatnonzero(similarities >= kth)
        similarities, ids = similarities[keep], ids[keep]
    order = np.lexsort((ids, -similarities))[:k]
    clipped = np.clip(similarities[order], -1.0, 1.0)
    return [Hit(int(i), float(s)) for i, s in zip(ids[order], clipped, strict=True)]


# Builds an empty index for vectors of a given dimension (one per semantic scope).
IndexFactory = Callable[[int], "VectorIndex"]


class FlatIndex:
    """Exact cosine search over a contiguous numpy matrix (see the module docstring)."""

    def __init__(self, dim: int, *, initial_capacity: int = 1024) -> None:
        self._dim = check_dim(dim)
        capacity = max(1, initial_capacity)
        self._vectors = np.zeros((capacity, dim), dtype=np.float32)
        self._ids = np.zeros(capacity, dtype=np.int64)
        self._row_of: dict[int, int] = {}
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self._dim

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

    def search(self, vector: npt.ArrayLike, k: int) -> list[Hit]:
        return self.search_many(as_vector(vector, self._dim), k)[0]

    def search_many(self, vectors: npt.ArrayLike, k: int) -> list[list[Hit]]:
        check_k(k)
        queries = as_matrix(vectors, self._dim)
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
