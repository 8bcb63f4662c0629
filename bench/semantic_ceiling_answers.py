"""Answer-centroid scoring for bench/semantic_ceiling.py (issue 23's "what a simulation says is
within reach"): a day replayed in time order from an empty cache, each lookup scored per cached
*answer* rather than per cached question.

For lookup q (its vector in the adapter's space) and each answer l in the cache (the cached
questions with that label; the label stands for the judged answer), the features are
    centroid   c_l = cos(q, mean of l's cached question vectors)
    margin     c_l - max(c_m over the other answers m, background)
    seen       log(n_l), n_l the cached questions of l
and, for the combined head (scorer d), also
    nearest    s_l = the best cosine of q to one of l's cached questions
    nn margin  s_l - max(best cosine to another answer's question, background)
    vote       the k-nearest posterior of l (matcher.py's feature 4: exp(s/tau) summed over l's
               questions among the k nearest, over all k plus one unseen rival at background).
The candidates of a lookup are the `top` answers by centroid plus the answers among the k
nearest questions, the rivals every other cached answer; with `top` 0 (the layer's view, which
finds only the k nearest questions) the candidates and rivals are the answers among the k
nearest, each served only from its questions among them. An answer with fewer than
`min_seen` cached questions is never served. The layer's rule is kept: candidates are tried by
score (then similarity) and the first whose answer has a cached question (the most similar
first, up to k of them) that every guard passes (`decision.accept`) is served — so each lookup
has one serving ceiling.

Vectors may change as the day goes (an adapter refitted online): `segments` gives, per block
of the stream, the vectors every text has in that block; the cache's sums are recomputed in the
new space at each block's start (the stored vectors re-projected).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from infercache.semantic.decision import accept
from infercache.semantic.guards import Guard
from infercache.semantic.tuning.intents import LabelledText

Array = npt.NDArray[np.float64]
HEADS = {  # the features each head reads
    "centroid": (0, 1, 2),
    "combined": (0, 1, 2, 3, 4, 5),
    "nearest": (2, 3, 4, 5),  # no centroid: the nearest-neighbour features and log(seen)
}
TEMPERATURE = 0.05


class Segment(NamedTuple):
    start: int
    vectors: npt.NDArray[np.float32]
    background: float  # how similar unrelated questions get in this space (fit.py's)


@dataclass(frozen=True, slots=True)
class Candidate:
    features: Array  # (6,)
    label: str
    served_text: str | None  # the cached question served for it; None: every guard refused
    seen: int


@dataclass(frozen=True, slots=True)
class Lookup:
    index: int  # position in the stream
    query: LabelledText
    candidates: tuple[Candidate, ...]
    answerable: bool  # an answer of the query's label is cached: a same-answer paraphrase


class _Cache:
    """The cached questions so far, with per-answer sums of their vectors in one space."""

    def __init__(self, dim: int) -> None:
        self.rows: list[int] = []  # stream positions
        self.label_ids: list[int] = []
        self.labels: list[str] = []
        self.index: dict[str, int] = {}
        self.members: list[list[int]] = []
        self.sums = np.zeros((0, dim))

    def add(self, i: int, label: str, vector: Array) -> None:
        if label not in self.index:
            self.index[label] = len(self.labels)
            self.labels.append(label)
            self.members.append([])
            self.sums = np.vstack([self.sums, np.zeros((1, self.sums.shape[1]))])
        a = self.index[label]
        self.rows.append(i)
        self.label_ids.append(a)
        self.members[a].append(i)
        self.sums[a] += vector

    def reproject(self, vectors: Array) -> None:
        self.sums = np.zeros_like(self.sums)
        np.add.at(self.sums, np.array(self.label_ids), vectors[np.array(self.rows)])


def lookups(
    stream: Sequence[LabelledText],
    segments: Sequence[Segment],
    guards: Sequence[Guard],
    *,
    k: int = 8,
    top: int = 3,
    min_seen: int = 2,
    serves: Callable[[Lookup], bool] | None = None,
) -> list[Lookup]:
    """Every first asking of a text, replayed in order from an empty cache (module docstring).
    `segments`: per block, its start (ascending from 0), the vectors of every stream text in
    that block's space, and the background cosine of that space. `serves`: as the gateway
    stores, a lookup it answers is not cached (its text is looked up again when repeated);
    None caches every lookup (the replay of replay.py)."""
    stored: set[str] = set()
    cache = _Cache(segments[0][1].shape[1])
    out: list[Lookup] = []
    bounds = [segment.start for segment in segments[1:]] + [len(stream)]
    for (start, vectors, background), end in zip(segments, bounds, strict=True):
        vectors64 = vectors.astype(np.float64)
        if cache.rows:
            cache.reproject(vectors64)
        for i in range(start, end):
            row = stream[i]
            if row.text in stored:
                continue  # an exact repeat: the exact layer's
            found = None
            if cache.rows:
                sizes = (k, top, min_seen)
                found = _lookup(i, stream, vectors64, cache, guards, background, sizes)
                out.append(found)
            if serves is None or found is None or not serves(found):
                stored.add(row.text)
                cache.add(i, row.label, vectors64[i])
    return out


def _lookup(
    i: int,
    stream: Sequence[LabelledText],
    vectors: Array,
    cache: _Cache,
    guards: Sequence[Guard],
    background: float,
    sizes: tuple[int, int, int],
) -> Lookup:
    k, top, min_seen = sizes
    q = vectors[i]
    sims = vectors[np.array(cache.rows)] @ q
    ids = np.array(cache.label_ids)
    centroid = (cache.sums @ q) / np.maximum(np.linalg.norm(cache.sums, axis=1), 1e-12)
    best_nn = np.full(len(cache.labels), -np.inf)
    np.maximum.at(best_nn, ids, sims)
    nearest = np.argsort(-sims, kind="stable")[:k]
    chosen = list(dict.fromkeys([*np.argsort(-centroid, kind="stable")[:top], *ids[nearest]]))
    among = np.array(chosen) if top == 0 else np.arange(len(cache.labels))
    peak = max(float(sims[nearest].max()), background)
    votes = np.exp((sims[nearest] - peak) / TEMPERATURE)
    total = float(votes.sum()) + math.exp((background - peak) / TEMPERATURE)
    candidates = []
    for a in chosen:
        others = among[among != a]
        rival_c = max(float(centroid[others].max(initial=-1.0)), background)
        rival_nn = max(float(best_nn[others].max(initial=-1.0)), background)
        vote = float(votes[ids[nearest] == a].sum()) / total
        members = cache.members[a]
        if top == 0:  # the layer's view: only the answer's questions among the k nearest
            members = [cache.rows[p] for p in nearest if ids[p] == a]
        feats = np.array([
            centroid[a], centroid[a] - rival_c, math.log(len(cache.members[a])),
            best_nn[a], best_nn[a] - rival_nn, vote,
        ])  # fmt: skip
        served = (
            _served_text(
                stream[i].text, [stream[j] for j in members], list(vectors[members] @ q), guards, k
            )
            if len(cache.members[a]) >= min_seen
            else None
        )
        candidates.append(Candidate(feats, cache.labels[a], served, len(cache.members[a])))
    return Lookup(i, stream[i], tuple(candidates), stream[i].label in cache.index)


def _served_text(
    query: str,
    entries: Sequence[LabelledText],
    sims: Sequence[float],
    guards: Sequence[Guard],
    k: int,
) -> str | None:
    """The most similar of the answer's cached questions (up to k) every guard passes."""
    for p in sorted(range(len(entries)), key=lambda p: -sims[p])[:k]:
        if accept(1.0, query, entries[p].text, 0.0, guards).accepted:
            return entries[p].text
    return None


@dataclass(frozen=True, slots=True)
class LogisticHead:
    weights: Array
    bias: float
    columns: tuple[int, ...]  # the features it reads

    def score(self, features: Array) -> float:
        z = float(features[list(self.columns)] @ self.weights + self.bias)
        return 1.0 / (1.0 + math.exp(-max(-60.0, min(60.0, z))))


def fit_head(
    found: Sequence[Lookup], columns: tuple[int, ...], min_seen: int, l2: float = 1e-3
) -> LogisticHead:
    """Logistic regression (Newton steps) from the candidates' features at `columns` to
    "this answer is the query's", on the candidates that could be served."""
    x, y = [], []
    for lookup in found:
        for c in lookup.candidates:
            if c.seen >= min_seen:
                x.append(c.features[list(columns)])
                y.append(float(c.label == lookup.query.label))
    design = np.hstack([np.array(x), np.ones((len(x), 1))])
    target = np.array(y)
    w = np.zeros(design.shape[1])
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ w, -60, 60)))
        gradient = design.T @ (p - target) + l2 * w
        hessian = (design * (p * (1 - p))[:, None]).T @ design + l2 * np.eye(len(w))
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    return LogisticHead(w[:-1], float(w[-1]), columns)


@dataclass(frozen=True, slots=True)
class Served:
    score: float
    right: bool
    query: LabelledText
    label: str
    text: str


def ceilings(found: Sequence[Lookup], head: LogisticHead, min_seen: int) -> list[Served]:
    """Per lookup, what it is served at its highest threshold (module docstring)."""
    out = []
    for lookup in found:
        scored = [
            (head.score(c.features), float(c.features[0]), c)
            for c in lookup.candidates
            if c.seen >= min_seen
        ]
        for score, _, c in sorted(scored, key=lambda t: (-t[0], -t[1])):
            if c.served_text is not None:
                right = c.label == lookup.query.label
                out.append(Served(score, right, lookup.query, c.label, c.served_text))
                break
    return out


def served_at(lookup: Lookup, head: LogisticHead, min_seen: int, threshold: float) -> Served | None:
    """What the lookup is served at `threshold` (None: a miss)."""
    found = ceilings([lookup], head, min_seen)
    return found[0] if found and found[0].score >= threshold else None
