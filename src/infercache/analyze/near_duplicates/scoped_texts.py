"""Distinct texts per semantic scope, with their last-seen times and a vector index per scope:
what the near-duplicate census compares a request with (near_duplicates/finder.py). At most
`max_vectors` texts are kept (the least recently seen leave first). With `embed` (a fast
embedder, the sample's candidate stage) a scope gets an index only once it holds more than
`SMALL_SCOPE` texts, and `candidates` then merges the index's nearest texts with those sharing
the most words (word_index.py); a small scope's candidates are all its texts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from infercache.analyze.near_duplicates.word_index import WordIndex, jaccard, words
from infercache.semantic.embedder import Matrix
from infercache.semantic.guards import Guard
from infercache.semantic.index import FlatIndex, IndexFactory, VectorIndex
from infercache.semantic.scope import Query

SMALL_SCOPE = 64  # texts: up to this many, every text of the scope is a candidate


def small_flat_index(dim: int) -> VectorIndex:
    """An exact index that starts with room for one vector: most scopes (a conversation's
    turns, say) only ever hold one text, and a 64-row start would cost ~100 KB each."""
    return FlatIndex(dim, initial_capacity=1)


class Neighbour(NamedTuple):
    similarity: float  # cosine similarity in [-1, 1] by the store's embedder
    text: str
    last_seen_s: float | None


class _ScopedText(NamedTuple):
    scope: str
    text: str


class ScopedTexts:
    """Distinct texts per scope with their last-seen times, at most `max_vectors` (the least
    recently seen leave first), and a vector index per scope.

    With `embed` (the sample's fast embedder), a scope gets its index only once it holds more
    than `SMALL_SCOPE` texts (they are embedded then, and every later one as it comes): a small
    scope's candidates are all its texts, and most scopes (a conversation, a prompt with a
    timestamp) stay small, so most texts are never embedded at all. Without it every text
    comes with its vector (`remember`)."""

    def __init__(
        self,
        *,
        max_vectors: int,
        index_factory: IndexFactory,
        embed: Callable[[list[str]], Matrix] | None = None,
    ) -> None:
        self._max_vectors = max_vectors
        self._new_index = index_factory
        self._embed = embed
        self._indexes: dict[str, VectorIndex] = {}
        self._members: dict[str, dict[int, None]] = {}  # scope → its text ids, in order
        self._words: dict[str, WordIndex] = {}  # built for a large scope on first need
        self._items: OrderedDict[int, _ScopedText] = OrderedDict()
        self._id_of: dict[_ScopedText, int] = {}
        self._last_seen: dict[int, float | None] = {}
        self._next_id = 0

    def __contains__(self, query: Query) -> bool:
        return _ScopedText(query.scope, query.text) in self._id_of

    def nearest(self, query: Query, vector: np.ndarray, k: int) -> list[Neighbour]:
        index = self._indexes.get(query.scope)
        if index is None:
            return []
        out = []
        for hit in index.search(vector, k):
            item = self._items.get(hit.id)
            if item is not None:
                out.append(Neighbour(hit.similarity, item.text, self._last_seen.get(hit.id)))
        return out

    def candidates(
        self, query: Query, *, k: int, min_word_jaccard: float, guards: Sequence[Guard]
    ) -> list[Neighbour]:
        """The sample's candidates for `query` (see the module docstring); their similarity
        is the fast embedder's (0 in a small scope), for the matcher to re-score."""
        members = self._members.get(query.scope)
        if not members:
            return []
        query_words = words(query.text)
        index = self._indexes.get(query.scope)
        if index is None:
            ids: dict[int, float] = dict.fromkeys(members, 0.0)
        else:
            assert self._embed is not None
            probe = self._embed([query.text])[0]
            ids = {hit.id: hit.similarity for hit in index.search(probe, k)}
            for vid in self._word_index(query.scope).best(query_words, k):
                ids.setdefault(vid, 0.0)
        out = []
        for vid, similarity in ids.items():
            item = self._items.get(vid)
            if item is None or jaccard(query_words, words(item.text)) < min_word_jaccard:
                continue
            if all(g.check(query.text, item.text) for g in guards):
                out.append(Neighbour(similarity, item.text, self._last_seen.get(vid)))
        return out

    def needs_vectors(self, scope: str, arriving: int) -> bool:
        """Whether texts of `scope` will be embedded if `arriving` more texts come to it."""
        if scope in self._indexes:
            return True
        return len(self._members.get(scope, ())) + arriving > SMALL_SCOPE

    def _word_index(self, scope: str) -> WordIndex:
        found = self._words.get(scope)
        if found is None:
            found = self._words[scope] = WordIndex()
            for vid in self._members[scope]:
                found.add(vid, words(self._items[vid].text))
        return found

    def remember(self, query: Query, vector: np.ndarray | None, now_s: float | None) -> None:
        """Note `query` as seen at `now_s`. Without `embed`, a new text needs its `vector`."""
        item = _ScopedText(query.scope, query.text)
        vid = self._id_of.get(item)
        if vid is not None:
            self._last_seen[vid] = now_s
            self._items.move_to_end(vid)
            return
        if vector is None and self._embed is None:
            raise ValueError(f"a new text needs its vector: {query.text[:60]!r}")
        vid = self._next_id
        self._next_id += 1
        members = self._members.setdefault(query.scope, {})
        members[vid] = None
        self._items[vid] = item
        self._id_of[item] = vid
        self._last_seen[vid] = now_s
        self._index(query, vid, vector, members)
        word_index = self._words.get(query.scope)
        if word_index is not None:
            word_index.add(vid, words(query.text))
        while len(self._items) > self._max_vectors:
            self._forget(next(iter(self._items)))

    def _index(
        self, query: Query, vid: int, vector: np.ndarray | None, members: dict[int, None]
    ) -> None:
        index = self._indexes.get(query.scope)
        if index is None and self._embed is not None:
            if len(members) <= SMALL_SCOPE:
                return
            ids = list(members)
            vectors = self._embed([self._items[i].text for i in ids])
            index = self._indexes[query.scope] = self._new_index(vectors.shape[1])
            index.add(ids, vectors)
            return
        if vector is None:
            assert self._embed is not None
            vector = self._embed([query.text])[0]
        if index is None:
            index = self._indexes[query.scope] = self._new_index(len(vector))
        index.add([vid], vector.reshape(1, -1))

    def _forget(self, vid: int) -> None:
        item = self._items.pop(vid)
        del self._id_of[item]
        del self._last_seen[vid]
        members = self._members[item.scope]
        del members[vid]
        index = self._indexes.get(item.scope)
        if index is not None:
            index.remove([vid])
        word_index = self._words.get(item.scope)
        if word_index is not None:
            word_index.forget(vid)
        if not members:
            del self._members[item.scope]
            self._indexes.pop(item.scope, None)
            self._words.pop(item.scope, None)

    def __len__(self) -> int:
        return len(self._items)
