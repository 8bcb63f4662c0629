"""Vectors and ids at the vector-index boundary: the `Hit` an index returns and the checks every
index applies to what it is given (the contract is drawn in `index.py`), and `CheckedIndex`, the
part the exact and the graph index share (dimension, lock, a query's checks).

The checks guard internal invariants (the embedder and the layer produce these values, never a
client), so they raise `ValueError` (bad shape or value) and `TypeError` (not integers), naming
the bad value. Pure numpy, no other dependency: every index module imports this one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

MAX_ID = 2**63 - 1


class Hit(NamedTuple):
    id: int
    similarity: float
    """Cosine similarity in [-1, 1]; 1 = same direction."""


def check_dim(dim: int) -> int:
    if dim < 1:
        raise ValueError(f"index dim must be at least 1, got {dim}")
    return dim


def as_matrix(
    vectors: npt.ArrayLike, dim: int, *, rows: int | None = None
) -> npt.NDArray[np.float32]:
    """`vectors` as a C-contiguous float32 `(n, dim)` matrix, or `ValueError`."""
    matrix = np.ascontiguousarray(vectors, dtype=np.float32)
    if rows == 0 and matrix.size == 0:
        return np.zeros((0, dim), dtype=np.float32)
    if matrix.ndim != 2 or matrix.shape[1] != dim or (rows is not None and len(matrix) != rows):
        expected = f"({rows if rows is not None else 'n'}, {dim})"
        raise ValueError(f"vectors must have shape {expected}, got {matrix.shape}")
    if not np.isfinite(matrix).all():
        raise ValueError("vectors contain NaN or infinity")
    return matrix


def as_vector(vector: npt.ArrayLike, dim: int) -> npt.NDArray[np.float32]:
    """One `(dim,)` query vector as a `(1, dim)` matrix, or `ValueError`."""
    array = np.asarray(vector, dtype=np.float32)
    if array.shape != (dim,):
        raise ValueError(f"query vector must have shape ({dim},), got {array.shape}")
    return as_matrix(array[None, :], dim)


def check_ids(ids: Sequence[int]) -> npt.NDArray[np.int64]:
    """Ids as int64, each in [0, MAX_ID] and unique within the call."""
    array = np.asarray(ids)
    if array.ndim != 1 or (len(array) and not np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"ids must be a flat sequence of integers, got {ids!r:.80}")
    if len(array) and (array.min() < 0 or array.max() > MAX_ID):
        bad = array[(array < 0) | (array > MAX_ID)][0]
        raise ValueError(f"ids must lie in [0, 2**63), got {int(bad)}")
    out = array.astype(np.int64)
    unique, counts = np.unique(out, return_counts=True)
    if len(unique) != len(out):
        raise ValueError(f"id {int(unique[counts > 1][0])} repeated in one add()")
    return out


def check_k(k: int) -> int:
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
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


class CheckedIndex:
    """An index's dimension and lock, and its searches' checks: `search` is `search_many` of one
    row, and `search_many` checks `k` and the matrix before the index's own `_search_rows`."""

    def __init__(self, dim: int) -> None:
        self._dim = check_dim(dim)
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self._dim

    def search(self, vector: npt.ArrayLike, k: int) -> list[Hit]:
        return self.search_many(as_vector(vector, self._dim), k)[0]

    def search_many(self, vectors: npt.ArrayLike, k: int) -> list[list[Hit]]:
        check_k(k)
        return self._search_rows(as_matrix(vectors, self._dim), k)

    def _search_rows(self, queries: npt.NDArray[np.float32], k: int) -> list[list[Hit]]:
        raise NotImplementedError
