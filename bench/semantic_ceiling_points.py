"""Operating points and wrong-answer kinds for bench/semantic_ceiling.py (its docstring says
what each figure is): `walk` lists (threshold, served, wrong) strictest first; `hindsight` is
the best recall at <= target wrong on day 2 itself; `point_threshold` the lowest threshold whose
wrong share on day 1 is <= target; `bound_threshold` the one `tune`'s walk certifies
(cache_sim.certify); `at` day 2's figures at a threshold; `kind_of` what separates a wrong
answer's label from the query's (hwu64's labels are intent plus slot values)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from semantic_ceiling_answers import Served

from infercache.errors import InvalidRequestError
from infercache.semantic.tuning.cache_sim import certify


def walk(outcomes: Sequence[tuple[float, bool]]) -> list[tuple[float, int, int]]:
    """(threshold, served, wrong) at every distinct score, strictest first."""
    ordered = sorted(outcomes, key=lambda c: -c[0])
    points, wrong = [], 0
    for index, (score, right) in enumerate(ordered):
        wrong += not right
        if index + 1 == len(ordered) or ordered[index + 1][0] < score:
            points.append((score, index + 1, wrong))
    return points


def hindsight(outcomes: Sequence[tuple[float, bool]], asked: int, target: float) -> dict[str, Any]:
    best: tuple[float, int, int] | None = None
    for t, served, wrong in walk(outcomes):
        if wrong <= target * served and (best is None or served - wrong > best[1] - best[2]):
            best = (t, served, wrong)
    if best is None:
        return {"recall": 0.0, "threshold": None, "served": 0, "wrong": 0}
    t, served, wrong = best
    return {"recall": (served - wrong) / asked, "threshold": t, "served": served, "wrong": wrong}


def point_threshold(outcomes: Sequence[tuple[float, bool]], target: float) -> float | None:
    """The lowest threshold whose wrong share on `outcomes` is <= target."""
    passing = [t for t, served, wrong in walk(outcomes) if wrong <= target * served]
    return min(passing) if passing else None


def bound_threshold(
    outcomes: Sequence[tuple[float, bool]], target: float, floor: float | None
) -> float | None:
    try:
        return certify(outcomes, target_false_hit=target, floor=floor, fitted=True)
    except InvalidRequestError:
        return None


def at(served: Sequence[Served], threshold: float | None, asked: int) -> dict[str, Any]:
    if threshold is None:
        return {"threshold": None}
    kept = [s.right for s in served if s.score >= threshold]
    wrong = len(kept) - sum(kept)
    return {
        "threshold": threshold,
        "recall": sum(kept) / asked,
        "served": len(kept),
        "wrong": wrong,
        "wrong_share": wrong / len(kept) if kept else None,
    }


def _parse(label: str) -> tuple[str, dict[str, str]]:
    intent, _, slots = label.partition("[")
    pairs = [p.split("=", 1) for p in slots.rstrip("]").split(";") if "=" in p]
    return intent, {key: value for key, value in pairs}


def kind_of(asked: str, served: str) -> str:
    """What separates a wrong answer's label from the query's (module docstring)."""
    if asked.startswith("ood:"):
        return "out-of-domain question"
    (intent, slots), (other, other_slots) = _parse(asked), _parse(served)
    if intent != other:
        return "another intent"
    if slots.keys() != other_slots.keys():
        return "a slot one side lacks"
    for key, value in slots.items():
        theirs = other_slots[key]
        if value != theirs and not (value in theirs or theirs in value or value[:4] == theirs[:4]):
            return "another slot value"
    return "same slot value, another surface form"
