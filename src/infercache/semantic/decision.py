"""The one rule deciding whether a cached candidate answers a query. Threshold tuning, evaluation
and the live cache all call `accept`, so what is measured is what runs.

Rule, in order:
1. `similarity < threshold` → rejected, reason `below_threshold`. `similarity` is the matcher's
   decision score (matcher.py): with the plain matcher the cosine similarity of the two texts'
   embeddings, in [-1, 1]; with a fitted matcher a probability in (0, 1). Higher is closer;
   the threshold is on the same scale, tuned by `calibrate.tune` or `fit.tune_lookups`.
2. Any guard whose `check(query, candidate)` is False → rejected, reason `guard`, naming the first
   such guard in the order given. Guards look only at the texts, never at the threshold.
3. Otherwise accepted.

Invariant relied on by calibration: for fixed texts and guards, acceptance is monotone in the
threshold (accepted at t ⇒ accepted at every t' ≤ t), because only step 1 sees the threshold.
So a pair's decision at `threshold = similarity` is its decision at every lower threshold.

Among a query's candidates the layer tries them in `ranked` order (score, then similarity, both
descending) and serves the first accepted one whose entry is fresh; the simulated lookups of
calibration (fit.py) use the same order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from infercache.semantic.guards import Guard


class Reason(StrEnum):
    ACCEPTED = "accepted"
    BELOW_THRESHOLD = "below_threshold"
    GUARD = "guard"


@dataclass(frozen=True, slots=True)
class Decision:
    accepted: bool
    reason: Reason
    guard: str | None = None
    """Name of the guard that rejected, when `reason` is `guard`."""


ACCEPTED = Decision(True, Reason.ACCEPTED)
BELOW_THRESHOLD = Decision(False, Reason.BELOW_THRESHOLD)


def accept(
    similarity: float,
    query_text: str,
    candidate_text: str,
    threshold: float,
    guards: Sequence[Guard],
) -> Decision:
    """Whether a candidate at cosine `similarity` (in [-1, 1]) may answer the query."""
    if not (math.isfinite(similarity) and math.isfinite(threshold)):
        raise ValueError(
            f"similarity and threshold must be finite, got {similarity} and {threshold}"
        )
    if similarity < threshold:
        return BELOW_THRESHOLD
    for guard in guards:
        if not guard.check(query_text, candidate_text):
            return Decision(False, Reason.GUARD, guard.name)
    return ACCEPTED


def ranked(scores: Sequence[float], similarities: Sequence[float]) -> list[int]:
    """Candidate positions in the order they are tried: score descending, then similarity
    descending, then position (so equal inputs give equal orders)."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], -similarities[i], i))
