"""Nearest cached vectors: the `VectorIndex` Protocol every index implements.

Contract (one contract test suite, tests/semantic/test_index.py, runs it against every
implementation):
- Vectors are float32 rows of length `dim`, L2-normalised by the caller (the embedder does it),
  so the inner product is the cosine similarity. Every `Hit.similarity` is a cosine similarity
  clipped to [-1, 1]; higher is closer. It is never a distance.
- Ids are integers in [0, 2**63). `add` of an id already present replaces its vector (an
  upsert), so a rebuild can re-add freely; one call must not repeat an id.
- `remove(ids)` ignores unknown ids and returns how many were present. A removed id is never
  returned by a later search (an approximate index may miss live ids, never return dead ones).
- `search(vector, k)` returns at most k hits, best first; fewer when the index holds fewer.
  `search_many(matrix, k)` does the same for each row.
- Bad shapes, k < 1, ids out of range or repeated raise `ValueError` (`TypeError` for ids that
  are not integers) naming the value: the checks live in `vectors.py`.
- Each index takes an internal lock: any method may be called from several threads.

Implementations, chosen by measurement (bench/semantic.py, figures in bench/README.md):
- `flat_index.FlatIndex`: exact numpy scan; the fastest and never wrong while small.
- `hnsw_index.HNSWIndex`: usearch's HNSW graph; approximate, sub-millisecond at 100k vectors,
  removes natively.
- `growing_index.GrowingIndex`: flat while small, HNSW once large; the layer's default per scope.
`FlatIndex` is re-exported here (the analyzer imports it from this module).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import numpy.typing as npt

from infercache.semantic.flat_index import FlatIndex
from infercache.semantic.vectors import Hit

__all__ = ["FlatIndex", "Hit", "IndexFactory", "VectorIndex"]


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


# Builds an empty index for vectors of a given dimension (one per semantic scope).
IndexFactory = Callable[[int], VectorIndex]
