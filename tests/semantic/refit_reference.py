"""The shadow refit's decision as it was computed before it was vectorised (shadow_fit.py up to
branch `refit`): each judgment's features and scores in Python loops, judgment by judgment,
through `matcher.features` and `Matcher.scores`. Kept as the reference the vectorised refit is
tested against (test_shadow_fit.py) and timed against (bench/semantic_refit_cost.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from infercache.errors import InvalidRequestError
from infercache.semantic.head_fit import fit_head
from infercache.semantic.matcher import FEATURES, FittedMatcher, Head, Matcher
from infercache.semantic.matcher import features as candidate_features
from infercache.semantic.shadow import operating_point
from infercache.semantic.shadow_fit import Judged, Proposal


def propose_by_loops(
    judged: Sequence[Judged],
    current: Matcher,
    fit_share: float,
    target: float,
    min_pairs: int,
    name: str,
) -> Proposal | None:
    cut = int(fit_share * len(judged))
    early, late = judged[:cut], judged[cut:]
    if len(late) < min_pairs:
        return None
    background = _background(judged)
    template = Head(weights=(0.0,) * FEATURES, bias=0.0, background=background)
    rows = np.array([candidate_features(j.neighbours, template)[j.position] for j in early])
    right = np.array([0.0 if j.wrong else 1.0 for j in early])
    k = max(len(j.neighbours) for j in judged)
    try:
        head = fit_head(rows, right, k, background=background)
    except InvalidRequestError:
        return None
    fitted = FittedMatcher(head, name)
    new = served_by_loops(fitted, late, target, min_pairs)
    now = served_by_loops(current, late, target, min_pairs)
    if new is None or (now is not None and new <= now):
        return None
    pairs = [(score_by_loops(fitted, j), j.wrong) for j in late]
    return Proposal(fitted, len(early), len(late), new, now, pairs)


def served_by_loops(
    matcher: Matcher, judged: Sequence[Judged], target: float, min_pairs: int
) -> int | None:
    scores = np.array([score_by_loops(matcher, j) for j in judged])
    wrong = np.array([j.wrong for j in judged], dtype=bool)
    point = operating_point(scores, wrong, target, min_pairs)
    return None if point.serving_at is None else int(np.sum(scores >= point.serving_at))


def score_by_loops(matcher: Matcher, judged: Judged) -> float:
    return matcher.scores(judged.neighbours)[judged.position]


def _background(judged: Sequence[Judged]) -> float:
    wrong = [j.neighbours[j.position].similarity for j in judged if j.wrong]
    return float(np.quantile(wrong, 0.95)) if len(wrong) >= 20 else 0.5
