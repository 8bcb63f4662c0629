"""Near-duplicates for the census: is there an earlier request in the same scope (semantic/scope.py:
everything but the last user message agrees) whose text the live semantic layer would accept?

The rule is the live layer's: candidates are walked from the most similar (cosine similarity,
in [-1, 1]) and the first one `semantic.decision.accept` accepts (threshold, then guards: the
rule `infercache tune` calibrates) makes the request a near-duplicate. Unlike the live layer
there is no TTL and no store: this is the census's unbounded view, bounded only by
`max_vectors` texts remembered (the oldest leave first).

Two ways to find the candidates (`NearDuplicateFinder`, one window of requests at a time):
- every request (a user's calibration, small logs): every text is embedded by the matcher, in
  one batch a window (`PrimedEmbedder`, which the replay's semantic layer reads too), and the
  `k` nearest earlier texts of the scope are the candidates;
- a uniform sample (the packaged public calibration, default_matcher.py): a fast embedder
  (the static model) embeds every text, and only a request in the sample (probability
  `sample_rate`, drawn from an injected RNG) is checked. Its candidates: in a scope of at most
  `SMALL_SCOPE` texts, all of them; in a larger one, the union of the fast embedder's `k`
  nearest and the `k` best by shared words (word_index.py). Candidates sharing fewer than
  `min_word_jaccard` of their words with the query, or that a guard vetoes (guards read only
  the texts), are dropped; the rest are embedded by the matcher (MiniLM, batched, remembered
  across windows) and walked as above. The stage misses a few near-duplicates: how many is
  measured on public data (bench/analyze_calibration.py, recorded in default_matcher.json),
  and the census turns the sample into an estimate with its interval (census.py).
Exact repeats are never near-duplicates and are not checked: a repeat's text is already known.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from infercache.analyze.prepared_request import PreparedRequest
from infercache.analyze.word_index import WordIndex, jaccard, words
from infercache.clock import Clock
from infercache.semantic.decision import Reason, accept
from infercache.semantic.embedder import Embedder, Matrix
from infercache.semantic.guards import Guard
from infercache.semantic.index import FlatIndex, IndexFactory, VectorIndex
from infercache.semantic.scope import Query

SMALL_SCOPE = 64  # texts: up to this many, every text of the scope is a candidate


def small_flat_index(dim: int) -> VectorIndex:
    """An exact index that starts with room for one vector: most scopes (a conversation's
    turns, say) only ever hold one text, and a 64-row start would cost ~100 KB each."""
    return FlatIndex(dim, initial_capacity=1)


class NearMatch(NamedTuple):
    similarity: float  # cosine similarity in [-1, 1] of the accepted candidate
    text: str  # the candidate's text
    last_seen_s: float | None  # when a request last carried that text


class NearCheck(NamedTuple):
    checked: bool  # whether the request was checked (False: outside the sample, or no text)
    match: NearMatch | None  # the accepted earlier text, when it is a near-duplicate


class Neighbour(NamedTuple):
    similarity: float  # cosine similarity in [-1, 1] by the store's embedder
    text: str
    last_seen_s: float | None


class _ScopedText(NamedTuple):
    scope: str
    text: str


class ScopedTexts:
    """Distinct texts per scope with their vectors and last-seen times, at most `max_vectors`
    (the least recently seen leave first)."""

    def __init__(self, *, max_vectors: int, index_factory: IndexFactory) -> None:
        self._max_vectors = max_vectors
        self._new_index = index_factory
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
        self,
        query: Query,
        vector: np.ndarray,
        *,
        k: int,
        min_word_jaccard: float,
        guards: Sequence[Guard],
    ) -> list[Neighbour]:
        """The sample's candidates for `query` (see the module docstring); their similarity
        is the fast embedder's, for the matcher to re-score."""
        members = self._members.get(query.scope)
        if not members:
            return []
        if len(members) <= SMALL_SCOPE:
            ids: dict[int, float] = dict.fromkeys(members, 0.0)
        else:
            ids = {hit.id: hit.similarity for hit in self._indexes[query.scope].search(vector, k)}
            query_words = words(query.text)
            for vid in self._word_index(query.scope).best(query_words, k):
                ids.setdefault(vid, 0.0)
        query_words = words(query.text)
        out = []
        for vid, similarity in ids.items():
            item = self._items.get(vid)
            if item is None or jaccard(query_words, words(item.text)) < min_word_jaccard:
                continue
            if all(g.check(query.text, item.text) for g in guards):
                out.append(Neighbour(similarity, item.text, self._last_seen.get(vid)))
        return out

    def _word_index(self, scope: str) -> WordIndex:
        found = self._words.get(scope)
        if found is None:
            found = self._words[scope] = WordIndex()
            for vid in self._members[scope]:
                found.add(vid, words(self._items[vid].text))
        return found

    def remember(self, query: Query, vector: np.ndarray | None, now_s: float | None) -> None:
        """Note `query` as seen at `now_s` (`vector` may be None for a text already stored)."""
        item = _ScopedText(query.scope, query.text)
        vid = self._id_of.get(item)
        if vid is not None:
            self._last_seen[vid] = now_s
            self._items.move_to_end(vid)
            return
        if vector is None:
            raise ValueError(f"a new text needs its vector: {query.text[:60]!r}")
        vid = self._next_id
        self._next_id += 1
        index = self._indexes.get(query.scope)
        if index is None:
            index = self._indexes[query.scope] = self._new_index(len(vector))
        index.add([vid], vector.reshape(1, -1))
        self._members.setdefault(query.scope, {})[vid] = None
        word_index = self._words.get(query.scope)
        if word_index is not None:
            word_index.add(vid, words(query.text))
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
        del self._members[item.scope][vid]
        word_index = self._words.get(item.scope)
        if word_index is not None:
            word_index.forget(vid, words(item.text))
        if len(index) == 0:
            del self._indexes[item.scope], self._members[item.scope]
            self._words.pop(item.scope, None)

    def __len__(self) -> int:
        return len(self._items)


def first_accepted(
    query: str,
    neighbours: Iterable[Neighbour],
    threshold: float,
    guards: Sequence[Guard],
) -> NearMatch | None:
    """The most similar neighbour `accept` takes, walking down until one falls below the
    threshold (neighbours must come most similar first)."""
    for n in neighbours:
        decision = accept(n.similarity, query, n.text, threshold, guards)
        if decision.accepted:
            return NearMatch(n.similarity, n.text, n.last_seen_s)
        if decision.reason is Reason.BELOW_THRESHOLD:
            return None
    return None


class PrimedEmbedder:
    """An `Embedder` that answers from a primed window, and asks `inner` for anything else.
    `keep` > 0 also remembers up to that many vectors across windows (least recent out).
    `inner` is not touched until a text is to be embedded (a lazy model never loads for a
    log without text)."""

    def __init__(self, inner: Embedder, *, keep: int = 0) -> None:
        self.inner = inner
        self._keep = keep
        self._primed: OrderedDict[str, np.ndarray] = OrderedDict()
        self.embedded = 0  # texts the model embedded
        self.embedded_chars = 0  # ... and their characters

    def prime(self, texts: Iterable[str]) -> None:
        """Embed the distinct `texts` not yet held, in one batch; unless `keep`, forget the
        previous window."""
        distinct = list(dict.fromkeys(texts))
        missing = [t for t in distinct if t not in self._primed] if self._keep else distinct
        vectors = self._embed(missing)
        if not self._keep:
            self._primed = OrderedDict(zip(missing, vectors, strict=True))
            return
        for text in distinct:
            if text in self._primed:
                self._primed.move_to_end(text)
        self._primed.update(zip(missing, vectors, strict=True))
        while len(self._primed) > self._keep:
            self._primed.popitem(last=False)

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def name(self) -> str:
        return self.inner.name

    def _embed(self, texts: list[str]) -> Matrix:
        if not texts:
            return np.zeros((0, 0), np.float32)
        self.embedded += len(texts)
        self.embedded_chars += sum(map(len, texts))
        return self.inner.embed(texts)

    def vector(self, text: str) -> np.ndarray:
        found = self._primed.get(text)
        return found if found is not None else self.embed([text])[0]

    def embed(self, texts: Sequence[str]) -> Matrix:
        missing = list(dict.fromkeys(t for t in texts if t not in self._primed))
        extra = dict(zip(missing, self._embed(missing), strict=True))
        rows = [self._primed[t] if t in self._primed else extra[t] for t in texts]
        if not rows:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.ascontiguousarray(np.stack(rows), dtype=np.float32)


class CandidateStage(NamedTuple):
    """Sampled mode: the fast embedder and what it lets through to the matcher."""

    embedder: PrimedEmbedder
    k: int  # nearest by the fast embedder, and best by shared words, in a large scope
    min_word_jaccard: float  # in [0, 1]


class NearDuplicateFinder:
    """Near-duplicate checks a window at a time (see the module docstring). `check` must see
    every request once, in time order, with whether it repeats an earlier one exactly."""

    def __init__(
        self,
        matcher: PrimedEmbedder,
        *,
        threshold: float,
        guards: Sequence[Guard],
        k: int = 4,
        max_vectors: int = 200_000,
        index_factory: IndexFactory | None = None,
        candidates: CandidateStage | None = None,
        sample_rate: float = 1.0,
        rng: random.Random | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if sample_rate < 1 and (candidates is None or rng is None):
            raise ValueError("sampling needs a candidate stage and an RNG")
        self.matcher = matcher
        self.threshold = threshold
        self._guards = tuple(guards)
        self._k = k
        self.candidates = candidates
        self.sample_rate = sample_rate
        self._rng = rng
        self._clock = clock
        self.embed_s = 0.0
        self._texts = ScopedTexts(
            max_vectors=max_vectors, index_factory=index_factory or small_flat_index
        )

    def check(self, window: Sequence[PreparedRequest], seen: Sequence[bool]) -> list[NearCheck]:
        if self.candidates is None:
            return self._check_all(window, seen)
        return self._check_sample(window, seen, self.candidates)

    def _timed(self, work: Callable[[], None]) -> None:
        started = self._clock.monotonic_s() if self._clock is not None else 0.0
        work()
        if self._clock is not None:
            self.embed_s += self._clock.monotonic_s() - started

    def _check_all(
        self, window: Sequence[PreparedRequest], seen: Sequence[bool]
    ) -> list[NearCheck]:
        matcher = self.matcher
        self._timed(lambda: matcher.prime(e.query.text for e in window if e.query is not None))
        out = []
        for event, repeat in zip(window, seen, strict=True):
            query = event.query
            if query is None:
                out.append(NearCheck(False, None))
                continue
            vector = matcher.vector(query.text)
            match = None
            if not repeat:
                found = self._texts.nearest(query, vector, self._k)
                match = first_accepted(query.text, found, self.threshold, self._guards)
            self._texts.remember(query, vector, event.timestamp_s)
            out.append(NearCheck(not repeat, match))
        return out

    def _check_sample(
        self, window: Sequence[PreparedRequest], seen: Sequence[bool], stage: CandidateStage
    ) -> list[NearCheck]:
        assert self._rng is not None
        drawn = [self._rng.random() < self.sample_rate for _ in window]
        fresh = [
            e.query.text
            for e, repeat in zip(window, seen, strict=True)
            if e.query is not None and not repeat and e.query not in self._texts
        ]
        self._timed(lambda: stage.embedder.prime(fresh))
        pending: list[tuple[int, Query, list[Neighbour]]] = []
        for i, (event, repeat, sampled) in enumerate(zip(window, seen, drawn, strict=True)):
            query = event.query
            if query is None:
                continue
            known = query in self._texts
            vector = None if known else stage.embedder.vector(query.text)
            if sampled and not repeat:
                probe = vector if vector is not None else stage.embedder.vector(query.text)
                near = self._texts.candidates(
                    query,
                    probe,
                    k=stage.k,
                    min_word_jaccard=stage.min_word_jaccard,
                    guards=self._guards,
                )
                pending.append((i, query, near))
            self._texts.remember(query, vector, event.timestamp_s)
        wanted = [t for _, q, near in pending for t in (q.text, *(n.text for n in near)) if near]
        self._timed(lambda: self.matcher.prime(wanted))
        out = [NearCheck(False, None)] * len(window)
        for i, query, near in pending:
            out[i] = NearCheck(True, self._verify(query, near))
        return out

    def _verify(self, query: Query, near: list[Neighbour]) -> NearMatch | None:
        """The candidates re-scored by the matcher, walked by the live rule."""
        if not near:
            return None
        vectors = self.matcher.embed([query.text, *(n.text for n in near)])
        similarities = np.clip(vectors[1:] @ vectors[0], -1.0, 1.0)
        rescored = sorted(
            (
                Neighbour(float(s), n.text, n.last_seen_s)
                for s, n in zip(similarities, near, strict=True)
            ),
            key=lambda n: -n.similarity,
        )
        return first_accepted(query.text, rescored, self.threshold, self._guards)

    def __len__(self) -> int:
        return len(self._texts)
