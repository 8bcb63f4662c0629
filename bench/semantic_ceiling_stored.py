"""Day 2 as the gateway stores it, for bench/semantic_ceiling.py: a request the semantic layer
answers is not cached (`store_hits_as_exact` is off by default), so asked again it is a lookup
again, and tests/semantic/days/scoring.py counts it again as a same-answer paraphrase (its text
has no stored answer, its label has one). What a threshold serves then depends on the threshold
itself, so each is replayed on its own (`stored_at`) and `stored_sweep` tries a few. Besides
the requests, `stored_at` counts the distinct paraphrase texts and those answered right at
least once: a day's exact repeats of an answered paraphrase are answered again and again, and
they weigh heavily where a FAQ's pool of phrasings runs dry (hwu64's). `certify_stored` runs
`tune`'s fixed-sequence walk on outcomes replayed this way.

A per-question matcher (matcher.py: the plain cosine, today's fitted matcher) looks at the k
nearest cached questions exactly as replay.replay_lookups finds them (the answer counts as
cached at that moment) and serves what cache_sim.ceilings would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from infercache.semantic.guards import Guard
from infercache.semantic.matcher import Matcher
from infercache.semantic.tuning.cache_sim import LookupCase, ceilings
from infercache.semantic.tuning.intents import LabelledText


def stored_at(
    stream: Sequence[LabelledText],
    vectors: npt.NDArray[np.float32],
    matcher: Matcher,
    guards: Sequence[Guard],
    threshold: float,
    *,
    k: int = 8,
) -> dict[str, Any]:
    """Recall and wrong answers of day 2 at `threshold`, as the gateway stores (docstring)."""
    similarities = vectors @ vectors.T
    stored: set[str] = set()
    cached: list[int] = []
    counts: dict[str, int] = {}
    asked = right = wrong = 0
    distinct: set[str] = set()  # paraphrase texts, each counted once
    distinct_right: set[str] = set()
    for i, row in enumerate(stream):
        if row.text in stored:
            continue  # the exact layer's
        asked += row.label in counts
        if row.label in counts:
            distinct.add(row.text)
        served = None
        if cached:
            at = np.array(cached)
            order = at[np.argsort(-similarities[i, at], kind="stable")[:k]]
            picked = tuple((stream[j], float(similarities[i, j])) for j in order)
            seen = tuple(counts[c.label] for c, _ in picked)
            found = ceilings([LookupCase(row, picked, seen)], matcher, guards)
            served = found[0] if found and found[0][0] >= threshold else None
        if served is None:
            stored.add(row.text)
            cached.append(i)
            counts[row.label] = counts.get(row.label, 0) + 1
        else:
            right += served[1]
            wrong += not served[1]
            if served[1]:
                distinct_right.add(row.text)
    return {
        "threshold": threshold,
        "paraphrases": asked,
        "recall": right / asked if asked else None,
        "served": right + wrong,
        "wrong": wrong,
        "distinct_paraphrases": len(distinct),
        "distinct_answered": len(distinct_right),
    }


def stored_sweep(
    stream: Sequence[LabelledText],
    vectors: npt.NDArray[np.float32],
    matcher: Matcher,
    guards: Sequence[Guard],
    scores: Sequence[float],
    target: float,
    *,
    steps: int = 16,
) -> dict[str, Any]:
    """The best recall at <= target wrong among thresholds at `steps` evenly spaced ranks of
    `scores` (the day's serving ceilings, cache-everything replay), from its 100th down."""
    ranked = sorted(scores, reverse=True)
    ranks = np.linspace(100, len(ranked) - 1, steps).astype(int) if len(ranked) > 100 else []
    best: dict[str, Any] = {"recall": 0.0, "threshold": None, "served": 0, "wrong": 0}
    for rank in ranks:
        point = stored_at(stream, vectors, matcher, guards, ranked[int(rank)])
        if point["wrong"] <= target * point["served"] and point["recall"] > best["recall"]:
            best = point
    return best


def certify_stored(
    halves: Sequence[tuple[Sequence[LabelledText], npt.NDArray[np.float32], Matcher]],
    guards: Sequence[Guard],
    grid: Sequence[float],
    target: float,
    floor: float | None,
) -> dict[str, Any]:
    """`tune`'s fixed-sequence walk (cache_sim.certify) on outcomes replayed as the gateway
    stores: each threshold of `grid` (strictest first, never below `floor`) replays every half
    (its texts, their vectors, the model that did not see them) at that threshold and pools
    the answers; a threshold is certified while the pooled wrong share's 95% upper bound is
    <= target, once enough answers are served for the bound to be able to get there; the walk
    stops at the first failure. Repeats of an answered question count again, as the gateway's
    traffic has them (their outcomes are not independent: the bound is optimistic there)."""
    from infercache.semantic.tuning.cache_sim import _clean_minimum
    from infercache.semantic.tuning.calibrate import wilson_upper

    need = _clean_minimum(target, 0.95)
    best: dict[str, Any] = {"threshold": None}
    for threshold in sorted(set(grid), reverse=True):
        if floor is not None and threshold < floor:
            break
        points = [stored_at(s, v, m, guards, threshold) for s, v, m in halves]
        served = sum(p["served"] for p in points)
        wrong = sum(p["wrong"] for p in points)
        if served < need:
            continue
        upper = wilson_upper(wrong, served)
        if upper > target:
            best["stopped"] = {"threshold": threshold, "served": served, "wrong": wrong,
                               "upper": upper}  # fmt: skip
            break
        best = {"threshold": threshold, "served": served, "wrong": wrong, "upper": upper}
    return best
