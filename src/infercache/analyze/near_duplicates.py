"""Near-duplicates for the census, and the batched embedding both the census and the replay use.

`NearDuplicates.observe(query, vector, now_s)`: is there an earlier request in the same scope
(semantic/scope.py: everything but the last user message agrees) whose text the live semantic
layer would accept? The candidates are the `k` nearest earlier texts of the scope by cosine
similarity (in [-1, 1]); they are walked from the most similar and the first one that
`semantic.decision.accept` accepts (threshold, then guards: the rule `infercache tune`
calibrates) makes the request a near-duplicate, as in semantic/layer.py. Then the text joins its
scope's index (once per distinct text; a repeat only refreshes its last-seen time).
Unlike the live layer there is no TTL and no store: this is the census's unbounded view, bounded
only by `max_vectors` (the oldest texts leave first; ~1.6 KB each with MiniLM's 384 floats).

`PrimedEmbedder` embeds a window of texts in one batch (`prime`) and then answers `embed` for
those texts from memory: the census and every replay's semantic layer ask for the same texts
one at a time, and the model runs once per window, batched.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

from infercache.semantic.decision import Reason, accept
from infercache.semantic.embedder import Embedder, Matrix
from infercache.semantic.guards import Guard
from infercache.semantic.index import FlatIndex, IndexFactory, VectorIndex
from infercache.semantic.scope import Query


def small_flat_index(dim: int) -> VectorIndex:
    """An exact index that starts with room for one vector: most scopes (a conversation's
    turns, say) only ever hold one text, and a 64-row start would cost ~100 KB each."""
    return FlatIndex(dim, initial_capacity=1)


class NearMatch(NamedTuple):
    similarity: float  # cosine similarity in [-1, 1] of the accepted candidate
    text: str  # the candidate's text
    last_seen_s: float | None  # when a request last carried that text


class _ScopedText(NamedTuple):
    scope: str
    text: str


class NearDuplicates:
    def __init__(
        self,
        *,
        threshold: float,
        guards: Sequence[Guard],
        k: int = 4,
        max_vectors: int = 1_000_000,
        index_factory: IndexFactory | None = None,
    ) -> None:
        self.threshold = threshold
        self._guards = tuple(guards)
        self._k = k
        self._max_vectors = max_vectors
        self._new_index = index_factory or small_flat_index
        self._indexes: dict[str, VectorIndex] = {}
        self._items: OrderedDict[int, _ScopedText] = OrderedDict()
        self._id_of: dict[_ScopedText, int] = {}
        self._last_seen: dict[int, float | None] = {}
        self._next_id = 0

    def observe(
        self, query: Query, vector: np.ndarray, now_s: float | None, *, check: bool = True
    ) -> NearMatch | None:
        """The accepted earlier candidate (when `check`), then remember this text."""
        match = self._match(query, vector) if check else None
        self._remember(query, vector, now_s)
        return match

    def _match(self, query: Query, vector: np.ndarray) -> NearMatch | None:
        index = self._indexes.get(query.scope)
        if index is None:
            return None
        for hit in index.search(vector, self._k):
            item = self._items.get(hit.id)
            if item is None:
                continue
            decision = accept(hit.similarity, query.text, item.text, self.threshold, self._guards)
            if decision.accepted:
                return NearMatch(hit.similarity, item.text, self._last_seen.get(hit.id))
            if decision.reason is Reason.BELOW_THRESHOLD:
                return None  # neighbours come most similar first
        return None

    def _remember(self, query: Query, vector: np.ndarray, now_s: float | None) -> None:
        item = _ScopedText(query.scope, query.text)
        vid = self._id_of.get(item)
        if vid is not None:
            self._last_seen[vid] = now_s
            self._items.move_to_end(vid)
            return
        vid = self._next_id
        self._next_id += 1
        index = self._indexes.get(query.scope)
        if index is None:
            index = self._indexes[query.scope] = self._new_index(len(vector))
        index.add([vid], vector.reshape(1, -1))
        self._items[vid] = item
        self._id_of[item] = vid
        self._last_seen[vid] = now_s
        while len(self._items) > self._max_vectors:
            self._forget(next(iter(self._items)))

    def _forget(self, vid: int) -> None:
        item = self._items.pop(vid)
        del self._id_of[item]
        del self._last_seen[vid]
        index = self._indexes[item.scope]
        index.remove([vid])
        if len(index) == 0:
            del self._indexes[item.scope]

    def __len__(self) -> int:
        return len(self._items)


class PrimedEmbedder:
    """An `Embedder` that answers from a primed window, and asks `inner` for anything else."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner
        self.dim: int = inner.dim
        self.name: str = inner.name
        self._primed: dict[str, np.ndarray] = {}
        self.embedded = 0  # texts the model embedded
        self.embedded_chars = 0  # ... and their characters

    def prime(self, texts: Iterable[str]) -> None:
        """Embed the distinct `texts` in one batch; forget the previous window."""
        distinct = list(dict.fromkeys(texts))
        vectors = self.inner.embed(distinct) if distinct else np.zeros((0, self.dim), np.float32)
        self.embedded += len(distinct)
        self.embedded_chars += sum(map(len, distinct))
        self._primed = dict(zip(distinct, vectors, strict=True))

    def vector(self, text: str) -> np.ndarray:
        found = self._primed.get(text)
        return found if found is not None else self.embed([text])[0]

    def embed(self, texts: Sequence[str]) -> Matrix:
        missing = [t for t in texts if t not in self._primed]
        extra = dict(zip(missing, self.inner.embed(missing), strict=True)) if missing else {}
        self.embedded += len(missing)
        self.embedded_chars += sum(map(len, missing))
        rows = [self._primed[t] if t in self._primed else extra[t] for t in texts]
        if not rows:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.ascontiguousarray(np.stack(rows), dtype=np.float32)
