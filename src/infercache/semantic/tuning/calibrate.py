"""Choosing the similarity threshold from labelled pairs, and measuring any threshold.

Terms (a pair is "accepted" when `decision.accept(similarity, a, b, threshold, guards)` accepts
it, the exact rule the live cache applies):
- false-hit rate = accepted negatives / negatives (a wrong cached answer served);
- hit rate = accepted positives / positives (a right cached answer served);
- false-hit upper bound = the one-sided Wilson score upper bound at `confidence` (0.95) on the
  false-hit rate: p̂ + z²/2n + z·√(p̂(1−p̂)/n + z²/4n²), divided by 1 + z²/n, z = Φ⁻¹(confidence).
  Wilson, not Clopper–Pearson: closed form, no beta quantile needed; at 0 false hits it gives
  z²/(n + z²) ≈ 2.71/n against Clopper–Pearson's ≈ 3.0/n, close enough at the sizes used (≥ 300
  negatives) and documented as such.

`tune` picks the LOWEST threshold whose upper bound is ≤ `target_false_hit`. Because acceptance
is monotone in the threshold (see `decision`), each pair has an acceptance ceiling: its
similarity if `accept(s, a, b, threshold=s, guards)` accepts, else never (−inf). At threshold t
the accepted pairs are exactly those with ceiling ≥ t. With k the largest false-hit count whose
bound meets the target, the lowest such threshold lies just above the (k+1)-th highest negative
ceiling; it is rounded UP to a multiple of 1e-4 (rounding up can only drop false hits, so the
bound still holds). If every negative may be accepted, the threshold is the lowest similarity
seen, rounded down; if it would exceed 1 (more negatives at similarity 1.0 than allowed), no
threshold works and `tune` raises `InvalidRequestError`. The reported figures are then
recomputed by `evaluate`, pair by pair through `accept`. Too few negatives to ever meet the
target (2.71/n > target) is an `InvalidRequestError` too.

Similarities are cosine similarities in [-1, 1] (higher = closer), never distances.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

from infercache.errors import ConfigError, InvalidRequestError
from infercache.semantic.decision import Reason, accept
from infercache.semantic.embedder import Embedder
from infercache.semantic.guards import Guard
from infercache.semantic.tuning.pairs import Pair

THRESHOLD_STEP = 1e-4


@dataclass(frozen=True, slots=True)
class ScoredPair:
    pair: Pair
    similarity: float
    """Cosine similarity of the two texts' embeddings, in [-1, 1]."""


@dataclass(frozen=True, slots=True)
class Evaluation:
    threshold: float
    pairs: int
    positives: int
    negatives: int
    hits: int
    false_hits: int
    hit_rate: float | None
    """Accepted positives / positives; None without positives."""
    false_hit_rate: float | None
    """Accepted negatives / negatives; None without negatives."""
    false_hit_upper: float | None
    """One-sided Wilson upper bound on `false_hit_rate` at `confidence`."""
    guard_vetoes: int
    """Pairs at or above the threshold that a guard rejected."""
    confidence: float
    guards: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["guards"] = list(self.guards)
        return out


@dataclass(frozen=True, slots=True)
class Calibration:
    evaluation: Evaluation
    target_false_hit: float
    max_false_hits: int
    """The most false hits whose upper bound still meets the target on these negatives."""

    @property
    def threshold(self) -> float:
        return self.evaluation.threshold

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.evaluation.to_dict(),
            "target_false_hit": self.target_false_hit,
            "max_false_hits": self.max_false_hits,
        }


@dataclass(frozen=True, slots=True)
class CurvePoint:
    threshold: float
    false_hit_rate: float | None
    false_hit_upper: float | None
    hit_rate: float | None


def score_pairs(pairs: Sequence[Pair], embedder: Embedder) -> list[ScoredPair]:
    """Each pair with its cosine similarity; every distinct text is embedded once."""
    texts = list(dict.fromkeys(t for p in pairs for t in (p.a, p.b)))
    row = {text: i for i, text in enumerate(texts)}
    vectors = embedder.embed(texts) if texts else np.zeros((0, embedder.dim), np.float32)
    a = vectors[[row[p.a] for p in pairs]]
    b = vectors[[row[p.b] for p in pairs]]
    similarities = np.clip(np.einsum("ij,ij->i", a, b), -1.0, 1.0) if pairs else []
    return [ScoredPair(p, float(s)) for p, s in zip(pairs, similarities, strict=True)]


def wilson_upper(failures: int, trials: int, confidence: float = 0.95) -> float:
    """One-sided Wilson score upper bound on a rate seen as `failures` of `trials`."""
    if trials < 1 or not 0 <= failures <= trials:
        raise ValueError(f"need 0 <= failures <= trials and trials >= 1, got {failures}/{trials}")
    _check_unit("confidence", confidence)
    z = NormalDist().inv_cdf(confidence)
    p = failures / trials
    z2n = z * z / trials
    centre = p + z2n / 2
    spread = z * math.sqrt(p * (1 - p) / trials + z2n / (4 * trials))
    return min(1.0, (centre + spread) / (1 + z2n))


def evaluate(
    scored: Sequence[ScoredPair],
    threshold: float,
    *,
    guards: Sequence[Guard] = (),
    confidence: float = 0.95,
) -> Evaluation:
    """The figures at `threshold`, each pair decided by `decision.accept`."""
    _check_unit("confidence", confidence)
    hits = false_hits = vetoes = positives = 0
    for item in scored:
        decision = accept(item.similarity, item.pair.a, item.pair.b, threshold, guards)
        positives += item.pair.same
        vetoes += decision.reason is Reason.GUARD
        if decision.accepted:
            hits += item.pair.same
            false_hits += not item.pair.same
    negatives = len(scored) - positives
    return Evaluation(
        threshold=threshold,
        pairs=len(scored),
        positives=positives,
        negatives=negatives,
        hits=hits,
        false_hits=false_hits,
        hit_rate=hits / positives if positives else None,
        false_hit_rate=false_hits / negatives if negatives else None,
        false_hit_upper=wilson_upper(false_hits, negatives, confidence) if negatives else None,
        guard_vetoes=vetoes,
        confidence=confidence,
        guards=tuple(g.name for g in guards),
    )


def tune(
    scored: Sequence[ScoredPair],
    *,
    target_false_hit: float = 0.01,
    guards: Sequence[Guard] = (),
    confidence: float = 0.95,
) -> Calibration:
    """The lowest threshold whose false-hit upper bound is ≤ `target_false_hit`."""
    _check_unit("target_false_hit", target_false_hit)
    _check_unit("confidence", confidence)
    ceilings = acceptance_ceilings(scored, guards)
    is_negative = np.array([not s.pair.same for s in scored], dtype=bool)
    negatives = int(is_negative.sum())
    if negatives == 0 or wilson_upper(0, negatives, confidence) > target_false_hit:
        floor = wilson_upper(0, negatives, confidence) if negatives else 1.0
        raise InvalidRequestError(
            f"{negatives} negative pairs cannot show a false-hit rate <= {target_false_hit}: "
            f"even with no false hit the {confidence:.0%} upper bound is {floor:.4f}; "
            f"add negatives or raise the target"
        )
    max_false_hits = 0
    while (
        max_false_hits < negatives
        and wilson_upper(max_false_hits + 1, negatives, confidence) <= target_false_hit
    ):
        max_false_hits += 1
    negative_ceilings = np.sort(ceilings[is_negative & np.isfinite(ceilings)])[::-1]
    if max_false_hits >= len(negative_ceilings):
        threshold = _grid_at_or_below(min(s.similarity for s in scored))
    else:
        threshold = _grid_above(float(negative_ceilings[max_false_hits]))
    if threshold > 1.0:
        identical = int(np.sum(negative_ceilings >= 1.0))
        raise InvalidRequestError(
            f"no threshold in [-1, 1] meets the target: {identical} negative pairs have "
            f"similarity 1.0 (identical embeddings) and pass the guards; at most "
            f"{max_false_hits} may be accepted"
        )
    evaluation = evaluate(scored, threshold, guards=guards, confidence=confidence)
    assert evaluation.false_hits <= max_false_hits, (evaluation, max_false_hits)
    return Calibration(evaluation, target_false_hit, max_false_hits)


def acceptance_ceilings(
    scored: Sequence[ScoredPair], guards: Sequence[Guard]
) -> npt.NDArray[np.float64]:
    """Per pair, the highest threshold at which `accept` takes it (−inf: never)."""
    ceilings = np.full(len(scored), -np.inf)
    for i, item in enumerate(scored):
        if accept(item.similarity, item.pair.a, item.pair.b, item.similarity, guards).accepted:
            ceilings[i] = item.similarity
    return ceilings


def curve(
    scored: Sequence[ScoredPair],
    *,
    guards: Sequence[Guard] = (),
    confidence: float = 0.95,
    points: int = 201,
) -> list[CurvePoint]:
    """False-hit rate, its upper bound and hit rate at `points` thresholds evenly spread over
    the similarities seen (for plotting; `evaluate` gives the figures at one threshold)."""
    if points < 2:
        raise ValueError(f"a curve needs at least 2 points, got {points}")
    if not scored:
        return []
    ceilings = acceptance_ceilings(scored, guards)
    same = np.array([s.pair.same for s in scored], dtype=bool)
    positive_ceilings = np.sort(ceilings[same])
    negative_ceilings = np.sort(ceilings[~same])
    sims = [s.similarity for s in scored]
    out = []
    for threshold in np.linspace(min(sims), max(sims), points):
        hits = len(positive_ceilings) - np.searchsorted(positive_ceilings, threshold, "left")
        false_hits = len(negative_ceilings) - np.searchsorted(negative_ceilings, threshold, "left")
        n_pos, n_neg = len(positive_ceilings), len(negative_ceilings)
        out.append(
            CurvePoint(
                threshold=float(threshold),
                false_hit_rate=int(false_hits) / n_neg if n_neg else None,
                false_hit_upper=wilson_upper(int(false_hits), n_neg, confidence) if n_neg else None,
                hit_rate=int(hits) / n_pos if n_pos else None,
            )
        )
    return out


# Each curve's lines: the CurvePoint field drawn, its line style, what its legend says.
_CURVE_LINES = (
    ("hit_rate", "-", "hit rate"),
    ("false_hit_rate", "--", "false-hit rate"),
    ("false_hit_upper", ":", "false-hit 95% upper"),
)


def plot(
    curves: Mapping[str, Sequence[CurvePoint]],
    path: str | Path,
    *,
    target_false_hit: float | None = None,
    threshold: float | None = None,
) -> Path:
    """A PNG of hit rate and false-hit rate (with upper bound) against the threshold, one
    colour per named curve. Uses matplotlib's Agg canvas directly: no pyplot global state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for index, (label, points) in enumerate(curves.items()):
        colour = f"C{index}"
        xs = [p.threshold for p in points]
        for field_name, linestyle, what in _CURVE_LINES:
            ys = [_nan(getattr(p, field_name)) for p in points]
            axes.plot(xs, ys, color=colour, linestyle=linestyle, label=f"{label}: {what}")
    if target_false_hit is not None:
        axes.axhline(
            target_false_hit, color="grey", linewidth=0.8, label=f"target {target_false_hit}"
        )
    if threshold is not None:
        axes.axvline(threshold, color="black", linewidth=0.8, label=f"threshold {threshold:.4f}")
    axes.set_xlabel("cosine similarity threshold")
    axes.set_ylabel("share of pairs accepted")
    axes.set_ylim(-0.02, 1.02)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    out = Path(path)
    try:
        figure.savefig(out, format="png")
    except OSError as exc:
        raise ConfigError(f"cannot write the plot {out}: {exc.strerror or exc}") from exc
    return out


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _grid_at_or_below(value: float) -> float:
    """The largest multiple of THRESHOLD_STEP at or below `value`."""
    threshold = round(math.floor(round(value / THRESHOLD_STEP, 6)) * THRESHOLD_STEP, 4)
    while threshold > value:
        threshold = round(threshold - THRESHOLD_STEP, 4)
    return threshold


def _grid_above(value: float) -> float:
    """The smallest multiple of THRESHOLD_STEP strictly above `value`."""
    threshold = round((math.floor(value / THRESHOLD_STEP) + 1) * THRESHOLD_STEP, 4)
    while threshold <= value:
        threshold = round(threshold + THRESHOLD_STEP, 4)
    return threshold


def _check_unit(name: str, value: float) -> None:
    if not 0.0 < value < 1.0:
        raise ConfigError(f"{name} must lie strictly between 0 and 1, got {value}")
