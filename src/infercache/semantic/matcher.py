"""Matchers: the score that decides whether a cached candidate may answer a query.

The layer finds a query's `k` nearest cached vectors in its scope, then asks the matcher for one
decision score per candidate; `decision.accept(score, ..., threshold, guards)` decides. What
`tune` calibrates is this score, so calibration and the live cache apply the same function
(`FittedMatcher.scores` is called by fit.py and by the layer).

- `CosineMatcher`: the score is the cosine similarity in [-1, 1] (the plain threshold, as
  GPTCache or RedisVL apply it), -1 for an answer cached for fewer than `min_seen` questions.
- `FittedMatcher` (built by `infercache tune --fit`, tuning/fit.py): queries and cached texts
  are embedded by an `AdaptedEmbedder` — the packaged model followed by a linear map trained
  contrastively on the user's labelled texts — and each candidate j among the k nearest gets
  the probability that its answer is right, a logistic head over five features:
    1. s_j, its cosine similarity to the query;
    2. s_j − s_rival, where s_rival is the best similarity among candidates with a different
       answer, and at least `background` — how similar unrelated questions get in this
       embedding (fit.py measures it): a close rival means the query is ambiguous;
    3. how many other candidates share j's answer within `agree_band` below s_j (capped at 3):
       several phrasings of one answer agreeing is strong evidence;
    4. the neighbours' vote for j's answer, Σ exp(s/τ) over candidates with that answer divided
       by Σ exp(s/τ) over all k plus one unseen rival at `background` (a kNN posterior at
       temperature τ). The background rival keeps a sparse cache — one answer nearby, all its
       candidates agreeing — from looking like certainty when every similarity is low.
    5. how many cached questions of the scope have j's answer, beyond j itself (capped at 3):
       an answer given once is a one-off question's, and a lone near neighbour with such an
       answer is the commonest wrong hit (two trivia questions about one person); an answer
       given to many wordings is an FAQ's. (Format 1 files have four weights: this one is 0.)
  Measured on a generated banking day, that lone neighbour (two wordings of one trivia
  question, answered apart) is too rare in training for a linear head to learn it, so the head
  also has `min_seen`: a candidate whose answer fewer cached questions share scores 0, never
  served (`tune LOG --fit` sets 2: a one-off answer is not served from its single question).
  Answers are compared by digest (`records.answer_digest`); an unknown answer ("") agrees with
  nothing. The score is a probability in (0, 1); the threshold is on that scale.

`features_at` / `scores_at` compute the same features and scores for many queries at once, one
padded row each (`Candidates`; shadow mode's refit scores its whole window so): the features to
the bit, a fitted score to within a rounding (BLAS may sum the five terms in another order).

Artefacts live in one directory: `matcher.json` (format below) and `adapter.npy` (the float32
`(dim, dim)` map). `load_fitted` checks the base embedder is the one the matcher was fitted on.

    {"format": 2, "base": {"kind": "minilm", "name": ...}, "adapter": "adapter.npy",
     "adapter_sha256": ..., "head": {"weights": [w1..w5], "bias": b, "k": 8,
     "agree_band": 0.15, "temperature": 0.05, "background": b}, "fit": {...report...}}
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from infercache.errors import ConfigError
from infercache.semantic.embedder import Embedder, Matrix, l2_normalise

MATCHER_FILE = "matcher.json"
ADAPTER_FILE = "adapter.npy"
FORMAT = 2
READABLE_FORMATS = (1, 2)
FEATURES = 5
PAIRWISE_BLOCK = 128  # numpy's pairwise sum splits longer runs in halves


class NearbyAnswer(NamedTuple):
    """What a matcher sees of one candidate."""

    similarity: float  # cosine similarity to the query, in [-1, 1]
    answer: str  # digest of the candidate's answer; "" when unknown
    seen: int = 1  # cached questions of the scope with this answer, the candidate's included


class Matcher(Protocol):
    @property
    def name(self) -> str:
        """Identifies the scoring; a change invalidates calibrated thresholds."""
        ...

    @property
    def k(self) -> int | None:
        """How many neighbours the scores need (None: any number)."""
        ...

    def scores(self, neighbours: Sequence[NearbyAnswer]) -> list[float]:
        """One decision score per neighbour (given most similar first); higher is better."""
        ...


class CosineMatcher:
    """The cosine itself; with `min_seen` > 1 a candidate whose answer fewer cached questions
    of the scope share scores -1 (never served), as `Head.min_seen` (`tune` writes 2: the
    lone neighbour, one trivia question answered for another wording of another one, is the
    wrong hit a plain threshold cannot tell from a paraphrase)."""

    k: int | None = None

    def __init__(self, min_seen: int = 1) -> None:
        if min_seen < 1:
            raise ValueError(f"min_seen must be >= 1, got {min_seen}")
        self.min_seen = min_seen
        self.name = "cosine" if min_seen == 1 else f"cosine;min_seen={min_seen}"

    def scores(self, neighbours: Sequence[NearbyAnswer]) -> list[float]:
        return [n.similarity if n.seen >= self.min_seen else -1.0 for n in neighbours]

    def scores_at(self, c: Candidates) -> npt.NDArray[np.float64]:
        """Per row of `c`, `scores(row)[position]`."""
        rows = np.arange(len(c.positions))
        seen = c.seen[rows, c.positions]
        return np.where(seen >= self.min_seen, c.similarities[rows, c.positions], -1.0)


@dataclass(frozen=True, slots=True)
class Head:
    weights: tuple[float, ...]  # one per feature (FEATURES)
    bias: float
    k: int = 8
    agree_band: float = 0.15
    temperature: float = 0.05
    background: float = 0.0  # cosine of unrelated questions (a high percentile), in [-1, 1]
    min_seen: int = 1  # an answer cached for fewer questions of the scope is never served

    def __post_init__(self) -> None:
        if self.k < 1 or self.agree_band < 0 or self.temperature <= 0:
            raise ValueError(f"bad head parameters: {self}")
        if len(self.weights) != FEATURES:
            raise ValueError(f"a head has {FEATURES} weights, got {len(self.weights)}")


def features(neighbours: Sequence[NearbyAnswer], head: Head) -> npt.NDArray[np.float64]:
    """The `(len(neighbours), FEATURES)` feature matrix (see the module docstring)."""
    n = len(neighbours)
    out = np.zeros((n, FEATURES))
    if n == 0:
        return out
    sims = np.array([x.similarity for x in neighbours], dtype=np.float64)
    answers = [x.answer or f"\0unknown{i}" for i, x in enumerate(neighbours)]
    top = max(float(sims.max()), head.background)
    votes = np.exp((sims - top) / head.temperature)
    total = votes.sum() + math.exp((head.background - top) / head.temperature)
    for j in range(n):
        same = np.array([a == answers[j] for a in answers])
        rivals = sims[~same]
        rival = max(float(rivals.max()), head.background) if len(rivals) else head.background
        agree = int(np.sum(same & (sims >= sims[j] - head.agree_band))) - 1
        seen = min(max(neighbours[j].seen - 1, 0), 3) if neighbours[j].answer else 0
        out[j] = (sims[j], sims[j] - rival, min(agree, 3), votes[same].sum() / total, seen)
    return out


class Candidates(NamedTuple):
    """Many queries' candidates at once, one row per query padded to the longest (shadow mode's
    refit scores its whole window this way): `features_at` and `scores_at` give for each row
    what `features` and `scores` give for its candidate at `positions` (module docstring)."""

    similarities: npt.NDArray[np.float64]  # (m, width); padding past `counts` is ignored
    answers: npt.NDArray[np.int64]  # (m, width) codes: equal codes, one answer; -1: unknown
    seen: npt.NDArray[np.int64]  # (m, width)
    counts: npt.NDArray[np.int64]  # (m,) candidates in each row
    positions: npt.NDArray[np.int64]  # (m,) the candidate each row is scored at

    def since(self, start: int) -> Candidates:
        """The rows from `start` on."""
        c = self
        return Candidates(
            c.similarities[start:], c.answers[start:], c.seen[start:], c.counts[start:],
            c.positions[start:],
        )  # fmt: skip


def features_at(c: Candidates, head: Head) -> npt.NDArray[np.float64]:
    """The `(m, FEATURES)` rows of `features` at each query's position, in one numpy pass."""
    m, width = c.similarities.shape
    if m == 0:
        return np.zeros((0, FEATURES))
    rows, columns = np.arange(m), np.arange(width)
    valid = columns < c.counts[:, None]
    sims = np.where(valid, c.similarities, -np.inf)
    s, code = c.similarities[rows, c.positions], c.answers[rows, c.positions]
    known = code >= 0
    same = valid & (
        ((c.answers == code[:, None]) & known[:, None]) | (columns == c.positions[:, None])
    )
    rival = np.maximum(np.where(same, -np.inf, sims).max(axis=1), head.background)
    top = np.maximum(sims.max(axis=1), head.background)
    votes = np.where(valid, np.exp((sims - top[:, None]) / head.temperature), 0.0)
    unseen = [math.exp((head.background - t) / head.temperature) for t in top.tolist()]
    total = numpy_sums(votes, valid) + np.array(unseen)
    agree = np.sum(same & (sims >= (s - head.agree_band)[:, None]), axis=1) - 1
    seen = np.where(known, np.clip(c.seen[rows, c.positions] - 1, 0, 3), 0)
    vote = numpy_sums(votes, same) / total
    return np.column_stack([s, s - rival, np.minimum(agree, 3), vote, seen]).astype(np.float64)


def numpy_sums(
    values: npt.NDArray[np.float64], mask: npt.NDArray[np.bool_]
) -> npt.NDArray[np.float64]:
    """Per row, `values[row][mask[row]].sum()` as numpy computes it, to the bit: its pairwise
    sum (sequential below 8 terms; eight running sums, combined as a tree, then the rest)."""
    counts = mask.sum(axis=1)
    order = np.argsort(~mask, axis=1, kind="stable")  # the masked terms first, in order
    terms = np.where(np.take_along_axis(mask, order, 1), np.take_along_axis(values, order, 1), 0.0)
    width = terms.shape[1]
    if width > PAIRWISE_BLOCK:  # numpy recurses on halves there: its own sum, row by row
        return np.array([row[:n].sum() for row, n in zip(terms, counts.tolist(), strict=True)])
    sequential = np.zeros(len(terms))
    for i in range(width):  # zeros past a row's count add nothing
        sequential = sequential + terms[:, i]
    if width < 8:
        return sequential
    blocked = 8 * (counts // 8)
    running = [terms[:, j].copy() for j in range(8)]
    for i in range(8, width - 7, 8):
        for j in range(8):
            running[j] += np.where(i + 8 <= blocked, terms[:, i + j], 0.0)
    r = running
    tree = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    for i in range(8, width):
        tree = tree + np.where((i >= blocked) & (i < counts), terms[:, i], 0.0)
    return np.where(counts < 8, sequential, tree)


class FittedMatcher:
    """Scores with a fitted logistic head (module docstring). Pure and thread-safe."""

    def __init__(self, head: Head, name: str) -> None:
        self.head = head
        self.name = name
        self.k: int | None = head.k
        self._w = np.array(head.weights, dtype=np.float64)

    def scores(self, neighbours: Sequence[NearbyAnswer]) -> list[float]:
        if not neighbours:
            return []
        logits = features(neighbours, self.head) @ self._w + self.head.bias
        return [
            1.0 / (1.0 + math.exp(-float(z))) if n.seen >= self.head.min_seen else 0.0
            for z, n in zip(np.clip(logits, -60.0, 60.0), neighbours, strict=True)
        ]

    def scores_at(self, c: Candidates) -> npt.NDArray[np.float64]:
        """Per row of `c`, `scores(row)[position]` (to within a rounding: the logits' product
        may sum its five terms in another order than the one-query product)."""
        return self.scores_of_rows(
            features_at(c, self.head), c.seen[np.arange(len(c.seen)), c.positions]
        )

    def scores_of_rows(
        self, rows: npt.NDArray[np.float64], seen: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]:
        """The scores of candidates whose feature rows (`features_at` with this head's feature
        parameters) and answer counts are given."""
        logits = np.clip(rows @ self._w + self.head.bias, -60.0, 60.0).tolist()
        return np.array([
            1.0 / (1.0 + math.exp(-z)) if n >= self.head.min_seen else 0.0
            for z, n in zip(logits, seen.tolist(), strict=True)
        ], dtype=np.float64)  # fmt: skip


class AdaptedEmbedder:
    """`base` followed by a linear map and L2 normalisation: the fitted matcher's embedder.
    `name` adds the map's digest to the base's, so vectors of another fit are never mixed."""

    def __init__(self, base: Embedder, adapter: npt.ArrayLike) -> None:
        matrix = np.ascontiguousarray(adapter, dtype=np.float32)
        if matrix.shape != (base.dim, base.dim):
            raise ConfigError(
                f"adapter shape {matrix.shape} does not fit the {base.dim}-d base embedder"
            )
        self.base = base
        self.adapter = matrix
        self.dim: int = base.dim
        digest = hashlib.sha256(matrix.tobytes()).hexdigest()[:16]
        self.name: str = f"{base.name};adapter={digest}"

    def embed(self, texts: Sequence[str]) -> Matrix:
        return l2_normalise(self.base.embed(texts) @ self.adapter.T)


class FittedParts(NamedTuple):
    embedder: AdaptedEmbedder
    matcher: FittedMatcher
    meta: dict[str, Any]


def save_fitted(
    directory: Path, *, adapter: npt.NDArray[np.float32], head: Head, base: Embedder,
    base_kind: str, report: dict[str, Any],
) -> Path:  # fmt: skip
    """Write the artefacts; returns the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    np.save(directory / ADAPTER_FILE, adapter.astype(np.float32))
    meta = {
        "format": FORMAT,
        "base": {"kind": base_kind, "name": base.name},
        "adapter": ADAPTER_FILE,
        "adapter_sha256": hashlib.sha256(adapter.astype(np.float32).tobytes()).hexdigest(),
        "head": {
            "weights": list(head.weights),
            "bias": head.bias,
            "k": head.k,
            "agree_band": head.agree_band,
            "temperature": head.temperature,
            "background": head.background,
            "min_seen": head.min_seen,
        },
        "fit": report,
    }
    (directory / MATCHER_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return directory


def read_meta(directory: Path) -> dict[str, Any]:
    path = directory / MATCHER_FILE
    try:
        meta: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the fitted matcher {path}: {exc}") from exc
    if meta.get("format") not in READABLE_FORMATS:
        raise ConfigError(f"{path}: unsupported matcher format {meta.get('format')!r}")
    return meta


def load_fitted(directory: Path, base: Embedder) -> FittedParts:
    """The fitted embedder and matcher stored in `directory`, over `base` (which must be the
    embedder the matcher was fitted on)."""
    meta = read_meta(directory)
    if meta["base"]["name"] != base.name:
        raise ConfigError(
            f"the matcher in {directory} was fitted on {meta['base']['name']!r}, "
            f"not on {base.name!r}"
        )
    try:
        adapter = np.load(directory / meta["adapter"])
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the adapter in {directory}: {exc}") from exc
    if hashlib.sha256(adapter.astype(np.float32).tobytes()).hexdigest() != meta["adapter_sha256"]:
        raise ConfigError(f"the adapter in {directory} does not match its recorded digest")
    h = meta["head"]
    weights = [float(w) for w in h["weights"]]
    head = Head(
        weights=tuple(weights + [0.0] * (FEATURES - len(weights))),
        bias=float(h["bias"]),
        k=int(h["k"]),
        agree_band=float(h["agree_band"]),
        temperature=float(h["temperature"]),
        background=float(h["background"]),
        min_seen=int(h.get("min_seen", 1)),
    )
    embedder = AdaptedEmbedder(base, adapter)
    return FittedParts(embedder, FittedMatcher(head, f"fitted:{embedder.name}"), meta)
