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
- a uniform sample (the packaged public calibration, default_matcher.py): only a request in
  the sample (probability `sample_rate`, drawn from an injected RNG) is checked. Its
  candidates (scoped_texts.py): in a scope of at most `SMALL_SCOPE` texts, all of them; in a
  larger one, the union of a fast embedder's (character 3-grams') `k` nearest and the `k`
  best by shared words (word_index.py); the fast embedder embeds a window's texts of large
  scopes in one batch. Candidates sharing fewer than
  `min_word_jaccard` of their words with the query, or that a guard vetoes (guards read only
  the texts), are dropped; the rest are embedded by the matcher (MiniLM, batched, remembered
  across windows) and walked as above. The stage misses a few near-duplicates: how many is
  measured on public data (bench/analyze_calibration.py, recorded in default_matcher.json),
  and the census turns the sample into an estimate with its interval (census.py).
Exact repeats are never near-duplicates and are not checked: a repeat's text is already known.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from infercache.analyze.near_duplicates.scoped_texts import Neighbour, ScopedTexts, small_flat_index
from infercache.analyze.prepared_request import PreparedRequest
from infercache.clock import Clock
from infercache.semantic.decision import Reason, accept
from infercache.semantic.embedder import Embedder, EmbedderWrapper, Matrix
from infercache.semantic.guards import Guard
from infercache.semantic.index import IndexFactory
from infercache.semantic.scope import Query


class NearMatch(NamedTuple):
    similarity: float  # cosine similarity in [-1, 1] of the accepted candidate
    text: str  # the candidate's text
    last_seen_s: float | None  # when a request last carried that text


class NearCheck(NamedTuple):
    checked: bool  # whether the request was checked (False: outside the sample, or no text)
    match: NearMatch | None  # the accepted earlier text, when it is a near-duplicate


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


class PrimedEmbedder(EmbedderWrapper):
    """An `Embedder` that answers from a primed window, and asks `inner` for anything else.
    `keep` > 0 also remembers up to that many vectors across windows (least recent out).
    `inner` is not touched until a text is to be embedded (a lazy model never loads for a
    log without text)."""

    def __init__(self, inner: Embedder, *, keep: int = 0) -> None:
        super().__init__(inner)
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
        fast = candidates.embedder.embed if candidates is not None else None
        self._texts = ScopedTexts(
            max_vectors=max_vectors, index_factory=index_factory or small_flat_index, embed=fast
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
        arriving = Counter(e.query.scope for e in window if e.query is not None)
        texts = self._texts
        fast = [  # new texts of scopes that have (or are about to get) an index, and probes
            e.query.text
            for e, sampled in zip(window, drawn, strict=True)
            if e.query is not None
            and (sampled or e.query not in texts)
            and texts.needs_vectors(e.query.scope, arriving[e.query.scope])
        ]
        self._timed(lambda: stage.embedder.prime(fast))  # one batch; the store reads it back
        pending: list[tuple[int, Query, list[Neighbour]]] = []
        for i, (event, repeat, sampled) in enumerate(zip(window, seen, drawn, strict=True)):
            query = event.query
            if query is None:
                continue
            if sampled and not repeat:
                near = self._texts.candidates(
                    query, k=stage.k, min_word_jaccard=stage.min_word_jaccard, guards=self._guards
                )
                pending.append((i, query, near))
            self._texts.remember(query, None, event.timestamp_s)
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
