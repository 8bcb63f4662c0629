"""Shadow mode's background refit (shadow_fit.py): a head learnt from judged pairs replaces the
matcher only when it certifies more of the later judgments, and the calibration it hands over is
on the new head's scale."""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from infercache.semantic.matcher import CosineMatcher, FittedMatcher, Matcher, NearbyAnswer
from infercache.semantic.shadow_fit import ShadowFit, score_of


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
    assert len(pairs) == 400
    assert [w for _, w in pairs] == [w for _, w in data]  # every judgment, in time order
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
    from infercache.semantic.shadow_fit import Judged

    judged = []
    for _ in range(400):  # the cosine alone separates them
        wrong = rng.random() < 0.3
        similarity = rng.uniform(0.5, 0.7) if wrong else rng.uniform(0.9, 0.99)
        judged.append(Judged((NearbyAnswer(similarity, "a", 2),), 0, wrong))
    assert fit.refit(judged) is False
    assert switched == []
    assert score_of(CosineMatcher(), judged[0]) == judged[0].neighbours[0].similarity
