"""`HNSWIndex`: an approximate `VectorIndex` (contract in `index.py`) over usearch's HNSW graph,
for large scopes. Chosen by measurement over faiss (bench/semantic.py, figures in
bench/README.md, "Vector index"): faiss's HNSW cannot remove vectors and its removable index
(IDMap2 over a flat index) is exact, so O(n) a query; usearch removes natively and keeps
recall@1 near 0.995 at 100k MiniLM vectors.

Algorithm: HNSW (Malkov & Yashunin) with `connectivity` (M) links a node per layer,
`expansion_add` (efConstruction) candidates while inserting and `expansion_search` (ef) while
searching; higher values buy recall with time. The metric is usearch's cosine *distance*
(1 − cos); it is turned back into cosine similarity in [-1, 1] at this boundary, so callers
only ever see similarities. `dtype` is the stored scalar type. "f32" (default) keeps
similarities exact to float32, so a threshold calibrated on exact cosines applies unchanged.
"f16" measured the same recall@1, builds faster and halves memory, but similarities move by up
to ~1e-3: use it when the caller re-scores the k candidates with its stored float32 vectors.
"i8" is faster still but loses recall (bench/README.md).

Below `exact_below` live vectors a search is brute force inside usearch (`exact=True`): as fast
as the graph at that size and never misses. Removal is usearch's own: a removed key leaves the
graph's results at once (the contract test checks it never comes back); the node is tombstoned
and its memory reused by later inserts. After heavy churn recall may drift down: rebuild (the
cache rebuilds the index from its store at start anyway). An upsert removes, then adds.

Thread-safety: one lock around every call (usearch's Python wrapper is not documented as safe for
concurrent add and search).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from infercache.semantic.vectors import CheckedIndex, Hit, as_matrix, check_ids

StoredType = Literal["f32", "f16", "i8"]


class HNSWIndex(CheckedIndex):
    def __init__(
        self,
        dim: int,
        *,
        dtype: StoredType = "f32",
        connectivity: int = 16,
        expansion_add: int = 128,
        expansion_search: int = 64,
        exact_below: int = 1024,
        threads: int = 0,
    ) -> None:
        """`threads` is the thread count for bulk `add` (0 = all cores); a single-vector
        search always runs on the calling thread."""
        from usearch.index import Index

        if dtype not in ("f32", "f16", "i8"):
            raise ValueError(f"usearch dtype must be f32, f16 or i8, got {dtype!r}")
        for name, value in (("connectivity", connectivity), ("expansion_add", expansion_add),
                            ("expansion_search", expansion_search)):  # fmt: skip
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if threads < 0 or exact_below < 0:
            raise ValueError(f"threads and exact_below must be >= 0, got {threads}, {exact_below}")
        super().__init__(dim)
        self._index: Any = Index(
            ndim=dim,
            metric="cos",
            dtype=dtype,
            connectivity=connectivity,
            expansion_add=expansion_add,
            expansion_search=expansion_search,
        )
        self._exact_below = exact_below
        self._threads = threads

    def __len__(self) -> int:
        with self._lock:
            return int(self._index.size)

    def add(self, ids: Sequence[int], vectors: npt.ArrayLike) -> None:
        keys = check_ids(ids).astype(np.uint64)
        matrix = as_matrix(vectors, self._dim, rows=len(keys))
        if len(keys) == 0:
            return
        with self._lock:
            present = np.atleast_1d(self._index.contains(keys))
            if present.any():
                self._index.remove(keys[present])
            self._index.add(keys, matrix, threads=self._threads)

    def remove(self, ids: Iterable[int]) -> int:
        keys = np.fromiter((int(i) for i in ids), dtype=np.int64)
        keys = np.unique(keys[(keys >= 0)]).astype(np.uint64)
        if len(keys) == 0:
            return 0
        with self._lock:
            present = keys[np.atleast_1d(self._index.contains(keys))]
            if len(present):
                self._index.remove(present)
        return len(present)

    def _search_rows(self, queries: npt.NDArray[np.float32], k: int) -> list[list[Hit]]:
        with self._lock:
            size = int(self._index.size)
            if size == 0 or len(queries) == 0:
                return [[] for _ in range(len(queries))]
            threads = 1 if len(queries) == 1 else self._threads
            found = self._index.search(
                queries, min(k, size), exact=size < self._exact_below, threads=threads
            )
        # usearch answers one query with `Matches` (1-d arrays, no counts), several with
        # `BatchMatches` (2-d arrays plus a count per row).
        keys = np.atleast_2d(found.keys)
        distances = np.atleast_2d(found.distances)
        count_field: Any = getattr(found, "counts", keys.shape[1])
        counts = np.atleast_1d(count_field)
        return [
            [
                Hit(int(key), float(np.clip(1.0 - distance, -1.0, 1.0)))
                for key, distance in zip(keys[row, :count], distances[row, :count], strict=True)
            ]
            for row, count in enumerate(counts.tolist())
        ]
