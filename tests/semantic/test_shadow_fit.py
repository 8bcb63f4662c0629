"""Shadow mode's background refit (shadow_fit.py): a head learnt from judged pairs replaces the
matcher only when it certifies more of the later judgments, and the calibration it hands over is
on the new head's scale."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any

import numpy as np
import pytest

from infercache.semantic.matcher import (
    CosineMatcher,
    FittedMatcher,
    Head,
    Matcher,
    NearbyAnswer,
    features,
    features_at,
    numpy_sums,
)
from infercache.semantic.shadow_fit import Judged, ShadowFit, candidates, pack, propose, score_of
from tests.semantic.refit_reference import propose_by_loops


class Inline(Executor):
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def judgments(n: int, seed: int) -> list[tuple[list[NearbyAnswer], bool]]:
    """Where the cosine cannot tell right from wrong but agreement can: a right candidate has
    a second neighbour with its answer, a wrong one is alone (all at similar cosines)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        similarity = rng.uniform(0.80, 0.95)
        wrong = rng.random() < 0.3
        if wrong:
            neighbours = [NearbyAnswer(similarity, "a", 1), NearbyAnswer(0.5, "b", 3)]
        else:
            neighbours = [NearbyAnswer(similarity, "a", 4), NearbyAnswer(similarity - 0.02, "a", 4)]
        out.append((neighbours, wrong))
    return out


def test_a_head_that_certifies_more_replaces_the_cosine_and_rescores_the_calibration() -> None:
    current: list[Matcher] = [CosineMatcher()]
    switched: list[tuple[Matcher, list[tuple[float, bool]]]] = []

    def on_switch(matcher: Matcher, pairs: list[tuple[float, bool]]) -> None:
        current[0] = matcher
        switched.append((matcher, pairs))

    fit = ShadowFit(
        Inline(), target_false_hit=0.05, min_pairs=60, on_switch=on_switch,
        current=lambda: current[0], refit_every=400,
    )  # fmt: skip
    data = judgments(400, seed=1)
    for neighbours, wrong in data:
        fit.add(neighbours, 0, wrong)
    assert (fit.refits, fit.switches) == (1, 1)
    matcher, pairs = switched[0]
    assert isinstance(matcher, FittedMatcher)
    later = data[int(0.6 * 400) :]  # fit_share 0.6 by default
    assert len(pairs) == len(later) < 400  # the judgments it was not fitted on, in time order
    assert [w for _, w in pairs] == [w for _, w in later]
    rights = [s for s, w in pairs if not w]
    wrongs = [s for s, w in pairs if w]
    assert min(rights) > max(wrongs)  # on the new scale the two are apart


def test_no_switch_when_the_cosine_already_does_as_well() -> None:
    switched: list[Matcher] = []
    fit = ShadowFit(
        Inline(), target_false_hit=0.05, min_pairs=60,
        on_switch=lambda m, _: switched.append(m), current=CosineMatcher, refit_every=10_000,
    )  # fmt: skip
    rng = random.Random(2)

    judged = []
    for _ in range(400):  # the cosine alone separates them
        wrong = rng.random() < 0.3
        similarity = rng.uniform(0.5, 0.7) if wrong else rng.uniform(0.9, 0.99)
        judged.append(Judged((NearbyAnswer(similarity, "a", 2),), 0, wrong))
    assert fit.refit(judged) is False
    assert switched == []
    assert score_of(CosineMatcher(), judged[0]) == judged[0].neighbours[0].similarity


POOL = ["", "a", "b", "c"]  # "": an unknown answer


def mixed_judgments(n: int, seed: int) -> list[Judged]:
    """`judgments` with 0–11 more neighbours below the judged pair (answers from a small pool,
    some unknown, counts 0–5) and the judged one not always first: rows of every width."""
    rng = random.Random(seed)
    out = []
    for neighbours, wrong in judgments(n, seed):
        low = neighbours[-1].similarity
        extra = [
            NearbyAnswer(low - rng.uniform(0.0, 0.3), rng.choice(POOL), rng.randint(0, 5))
            for _ in range(rng.randint(0, 11))
        ]
        if rng.random() < 0.2:  # the judged candidate second, after a closer one
            first = NearbyAnswer(neighbours[0].similarity + 0.01, rng.choice(["", "a", "z"]), 2)
            out.append(Judged((first, *neighbours, *extra), 1, wrong))
        else:
            out.append(Judged((*neighbours, *extra), 0, wrong))
    return out


@pytest.mark.parametrize("width", [1, 3, 7, 8, 9, 16, 23, 40])
def test_numpy_sums_are_numpys_own_sums_to_the_bit(width: int) -> None:
    rng = np.random.default_rng(width)
    values = np.exp(3.0 * rng.normal(size=(500, width)))
    mask = rng.random((500, width)) < rng.random((500, 1))
    expected = [row[m].sum() for row, m in zip(values, mask, strict=True)]
    assert numpy_sums(values, mask).tolist() == [float(x) for x in expected]


def test_the_window_features_are_each_judgments_features_to_the_bit() -> None:
    judged = mixed_judgments(600, seed=5)
    window = candidates(pack(judged))
    assert int(window.counts.max()) >= 12
    assert -1 in window.answers
    for background in (0.0, 0.62):
        head = Head(weights=(0.3, 1.0, 0.5, 2.0, 0.4), bias=-1.0, background=background)
        rows = features_at(window, head)
        one_by_one = [features(j.neighbours, head)[j.position].tolist() for j in judged]
        assert rows.tolist() == one_by_one
        for matcher in (FittedMatcher(head, "f"), CosineMatcher(min_seen=2)):
            scores = matcher.scores_at(window)
            np.testing.assert_allclose(
                scores, [score_of(matcher, j) for j in judged], rtol=0.0, atol=1e-15
            )


class HalfCosine:
    """A matcher of no class the refit knows (it is scored judgment by judgment)."""

    name = "half-cosine"
    k: int | None = None

    def scores(self, neighbours: Sequence[NearbyAnswer]) -> list[float]:
        return [n.similarity / 2 for n in neighbours]


CURRENT: dict[str, Matcher] = {
    "other": HalfCosine(),
    "cosine": CosineMatcher(),
    "cosine, min_seen 2": CosineMatcher(min_seen=2),
    "fitted": FittedMatcher(Head((5.0, 0.0, 0.0, 0.5, 0.0), -4.0, background=0.4), "f"),
}


@pytest.mark.parametrize("current", list(CURRENT))
@pytest.mark.parametrize("data", ["two", "mixed", "few"])
def test_the_vectorised_refit_decides_what_the_loops_decided(current: str, data: str) -> None:
    """The same proposal (head, rescored pairs, served counts) as the judgment-by-judgment
    refit it replaced (refit_reference.py), or the same absence of one."""
    if data == "mixed":
        judged = mixed_judgments(700, seed=6)
    else:  # "few": later judgments fewer than min_pairs, no proposal
        judged = [Judged(tuple(n), 0, w) for n, w in judgments(700 if data == "two" else 140, 6)]
    options = (0.6, 0.05, 60, "shadow-fit:1")
    loops = propose_by_loops(judged, CURRENT[current], *options)
    vectorised = propose(pack(judged), CURRENT[current], *options)
    if data == "few":
        assert loops is None
        assert vectorised is None
        return
    assert loops is not None
    assert vectorised is not None
    assert vectorised[1:5] == loops[1:5]  # fitted on, scored on, served, served now
    new, old = vectorised.matcher.head, loops.matcher.head
    np.testing.assert_allclose(new.weights, old.weights, rtol=0, atol=1e-12)
    assert (new.bias, new.k, new.background) == pytest.approx(
        (old.bias, old.k, old.background), rel=0, abs=1e-12
    )
    assert [w for _, w in vectorised.pairs] == [w for _, w in loops.pairs]
    np.testing.assert_allclose(
        [s for s, _ in vectorised.pairs], [s for s, _ in loops.pairs], rtol=0, atol=1e-12
    )
