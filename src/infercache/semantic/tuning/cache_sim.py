"""A semantic cache simulated on labelled texts: how `tune` measures and calibrates a matcher on
intent-labelled data (pairs files are measured by calibrate.py instead).

Each query text is looked up in a cache holding the other texts of the set ("cache" texts),
exactly as the layer would: its `k` nearest cached vectors by cosine, one decision score each
from the matcher (matcher.py), tried in `decision.ranked` order, the first that
`decision.accept` takes (threshold, then guards) is served. The served answer is right when its
label equals the query's.

Figures at a threshold (`evaluate_lookups`):
- lookups: queries with at least one cached candidate; answerable: those whose label is among
  the cached texts (a right answer exists);
- hit rate = right answers served / answerable lookups;
- false-hit rate = wrong answers served / answers served (the share of served answers that are
  wrong, the figure live verification watches), with its one-sided Wilson upper bound.
Serving is monotone in the threshold: a query is served at threshold t exactly when its best
guard-passing candidate (by rank) scores ≥ t, so each lookup has one ceiling, and
`tune_lookups` walks the sorted ceilings down by fixed-sequence testing (its docstring). Which
lookups are measured — every text against all the others, or a replay in order through a cache
that starts empty (replay.py, what `tune` uses) — is the caller's choice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import numpy.typing as npt

from infercache.errors import InvalidRequestError
from infercache.semantic.decision import accept, ranked
from infercache.semantic.guards import Guard
from infercache.semantic.matcher import CosineMatcher, Matcher, NearbyAnswer
from infercache.semantic.tuning.calibrate import wilson_upper
from infercache.semantic.tuning.intents import LabelledText


@dataclass(frozen=True, slots=True)
class LookupCase:
    query: LabelledText
    candidates: tuple[tuple[LabelledText, float], ...]
    """The k nearest cached texts with their cosine similarity, most similar first."""
    seen: tuple[int, ...] = ()
    """Per candidate, how many cached texts have its label (its own included); () = 1 each."""

    def neighbours(self) -> list[NearbyAnswer]:
        """What the matcher sees of the candidates (matcher.NearbyAnswer)."""
        seen = self.seen or (1,) * len(self.candidates)
        return [
            NearbyAnswer(s, c.label, n) for (c, s), n in zip(self.candidates, seen, strict=True)
        ]

    @property
    def answerable(self) -> bool:
        return any(c.label == self.query.label for c, _ in self.candidates)


@dataclass(frozen=True, slots=True)
class LookupEvaluation:
    threshold: float
    lookups: int
    answerable: int
    served: int
    right: int
    wrong: int
    hit_rate: float | None
    false_hit_rate: float | None
    false_hit_upper: float | None
    confidence: float
    guards: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The figures under the keys `tune` reports for pairs too."""
        return {
            "kind": "lookups",
            "threshold": self.threshold,
            "pairs": self.lookups,
            "positives": self.answerable,
            "negatives": self.lookups - self.answerable,
            "hits": self.right,
            "false_hits": self.wrong,
            "served": self.served,
            "hit_rate": self.hit_rate,
            "false_hit_rate": self.false_hit_rate,
            "false_hit_upper": self.false_hit_upper,
            "confidence": self.confidence,
            "guards": list(self.guards),
        }


@dataclass(frozen=True, slots=True)
class Embedded:
    """Labelled texts and their vectors, row i for text i: one side of simulated lookups (the
    queries, or the cache they look in)."""

    texts: Sequence[LabelledText]
    vectors: npt.NDArray[np.float32]

    def __post_init__(self) -> None:
        if len(self.texts) != len(self.vectors):
            raise ValueError("texts and vectors must have the same length")

    def rows(self, kept: Sequence[int] | npt.NDArray[np.intp]) -> Embedded:
        """The texts at positions `kept`, with their vectors."""
        at = np.asarray(kept, dtype=np.intp)
        return Embedded([self.texts[int(i)] for i in at], self.vectors[at])


def simulate_lookups(
    asked: Embedded, held: Embedded, *, k: int, without_own_label: bool = False
) -> list[LookupCase]:
    """Each query of `asked`'s k nearest texts of the cache `held` (the query itself excluded
    when cached too). `without_own_label`: leave out every text of the query's label too — the
    lookup of a question whose answer is not cached yet, where every candidate is wrong."""
    queries, query_vectors = asked.texts, asked.vectors
    cache, cache_vectors = held.texts, held.vectors
    labels = np.array([c.label for c in cache])
    own = {label: labels == label for label in {q.label for q in queries}}
    counts: dict[str, int] = {}
    for c in cache:
        counts[c.label] = counts.get(c.label, 0) + 1
    cases = []
    for start in range(0, len(queries), 512):
        block = query_vectors[start : start + 512] @ cache_vectors.T
        for offset, similarities in enumerate(block):
            query = queries[start + offset]
            if without_own_label:
                similarities = np.where(own[query.label], -np.inf, similarities)
            order = np.argsort(-similarities, kind="stable")[: k + 1]
            picked = [
                (cache[j], float(similarities[j]))
                for j in order
                if cache[j] != query and np.isfinite(similarities[j])
            ][:k]
            if picked:
                seen = tuple(
                    counts[c.label] - (c.label == query.label and query in cache) for c, _ in picked
                )
                cases.append(LookupCase(query, tuple(picked), seen))
    return cases


def ceilings(
    cases: Sequence[LookupCase], matcher: Matcher, guards: Sequence[Guard]
) -> list[tuple[float, bool]]:
    """Per case, the highest threshold at which it is served and whether that answer is right
    (cases that are never served are left out)."""
    out = []
    for case in cases:
        neighbours = case.neighbours()
        scores = matcher.scores(neighbours)
        for j in ranked(scores, [n.similarity for n in neighbours]):
            text = case.candidates[j][0].text
            if accept(scores[j], case.query.text, text, scores[j], guards).accepted:
                out.append((scores[j], case.candidates[j][0].label == case.query.label))
                break
    return out


def evaluate_lookups(
    cases: Sequence[LookupCase],
    matcher: Matcher,
    threshold: float,
    *,
    guards: Sequence[Guard] = (),
    confidence: float = 0.95,
) -> LookupEvaluation:
    outcomes = ceilings(cases, matcher, guards)
    return _evaluation(cases, outcomes, threshold, guards=guards, confidence=confidence)


def _evaluation(
    cases: Sequence[LookupCase],
    outcomes: Sequence[tuple[float, bool]],
    threshold: float,
    *,
    guards: Sequence[Guard],
    confidence: float,
) -> LookupEvaluation:
    """`evaluate_lookups` from the cases' serving ceilings (`ceilings`), computed once."""
    served = [right for score, right in outcomes if score >= threshold]
    right = sum(served)
    wrong = len(served) - right
    answerable = sum(case.answerable for case in cases)
    return LookupEvaluation(
        threshold=threshold,
        lookups=len(cases),
        answerable=answerable,
        served=len(served),
        right=right,
        wrong=wrong,
        hit_rate=right / answerable if answerable else None,
        false_hit_rate=wrong / len(served) if served else None,
        false_hit_upper=wilson_upper(wrong, len(served), confidence) if served else None,
        confidence=confidence,
        guards=tuple(g.name for g in guards),
    )


def tune_lookups(
    cases: Sequence[LookupCase],
    matcher: Matcher,
    *,
    target_false_hit: float,
    guards: Sequence[Guard] = (),
    confidence: float = 0.95,
    floor: float | None = None,
) -> LookupEvaluation:
    """The evaluation at the threshold fixed-sequence testing certifies: walking the serving
    ceilings down from the strictest point with served answers enough that the bound could
    hold with none wrong, each point is accepted while the false-hit rate's one-sided upper
    bound is <= the target, and the walk stops at the first that fails (taking the lowest of
    all points that pass would pick the luckiest of many tests). Never below `floor` (what
    unrelated text reaches, replay.ood_floor). `InvalidRequestError` says what is missing
    when no point is certified."""
    outcomes = ceilings(cases, matcher, guards)
    best = certify(
        outcomes,
        target_false_hit=target_false_hit,
        confidence=confidence,
        floor=floor,
        lookups=len(cases),
        fitted=not isinstance(matcher, CosineMatcher),
    )
    return _evaluation(cases, outcomes, best, guards=guards, confidence=confidence)


def certify(
    outcomes: Sequence[tuple[float, bool]],
    *,
    target_false_hit: float,
    confidence: float = 0.95,
    floor: float | None = None,
    lookups: int | None = None,
    fitted: bool = False,
) -> float:
    """The lowest score threshold fixed-sequence testing certifies on `outcomes` (each lookup's
    serving ceiling and whether its answer is right; `tune_lookups`' rule). `fitted`: the
    scores are a fitted matcher's (a refusal then does not suggest fitting one)."""
    walk = sorted(outcomes, key=lambda c: -c[0])
    need = _clean_minimum(target_false_hit, confidence)
    best: float | None = None
    wrong = 0
    stopped: tuple[int, int] | None = None
    for index, (score, right) in enumerate(walk):
        served = index + 1
        wrong += not right
        if floor is not None and score < floor:
            break
        at_boundary = index + 1 == len(walk) or walk[index + 1][0] < score
        if not at_boundary or served < need:
            continue
        if wilson_upper(wrong, served, confidence) > target_false_hit:
            stopped = (served, wrong)
            break
        best = score
    if best is None:
        counted = len(walk) if lookups is None else lookups
        raise InvalidRequestError(
            _refusal(counted, len(walk), need, stopped, target_false_hit, confidence, floor, fitted)
        )
    return best


def _clean_minimum(target: float, confidence: float) -> int:
    """The fewest served answers whose upper bound can be <= target with none wrong (with no
    failure the bound is z²/(n + z²))."""
    z = NormalDist().inv_cdf(confidence)
    served = max(1, math.floor(z * z * (1 - target) / target))
    while wilson_upper(0, served, confidence) > target:
        served += 1
    return served


def _refusal(
    lookups: int,
    servable: int,
    need: int,
    stopped: tuple[int, int] | None,
    target: float,
    confidence: float,
    floor: float | None,
    fitted: bool,
) -> str:
    head = f"no threshold keeps the false-hit rate's {confidence:.0%} upper bound <= {target}"
    if servable < need:
        return (
            f"{head}: a bound that low needs at least {need} answers served with none wrong, "
            f"and these {lookups} simulated lookups serve at most {servable} (texts whose "
            f"answer another text shares). Add labelled texts or a longer log, or raise the "
            f"target."
        )
    if stopped is not None:
        served, wrong = stopped
        return (
            f"{head}: at the strictest threshold serving {served} answers (the fewest whose "
            f"bound can meet it), {wrong} were wrong (bound "
            f"{wilson_upper(wrong, served, confidence):.4f}), and every lower threshold is "
            f"untested (the walk stops at the first failure). Certifying this target needs "
            f"more served answers per wrong one: a longer log or more labelled texts, "
            f"{'' if fitted else 'a fitted matcher (--fit), '}or a higher target."
        )
    return (
        f"{head}: every threshold that serves {need} answers lies below what unrelated "
        f"questions reach (floor {floor:.4f}). "
        f"{'Add' if fitted else 'Fit a matcher (--fit) or add'} labelled texts or a longer log, "
        f"or raise the target."
    )
