"""Threshold tuning and evaluation: the lowest threshold whose Wilson upper bound on the
false-hit rate meets the target, decided pair by pair by `accept`."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infercache.errors import ConfigError, InvalidRequestError
from infercache.semantic.embedder import HashingEmbedder, StaticEmbedder
from infercache.semantic.guards import build_guards, default_guards
from infercache.semantic.tuning.calibrate import (
    THRESHOLD_STEP,
    ScoredPair,
    curve,
    evaluate,
    plot,
    score_pairs,
    tune,
    wilson_upper,
)
from infercache.semantic.tuning.pairs import Pair


def synthetic(positives: int, negatives: int, seed: int) -> list[ScoredPair]:
    """Positives near 0.85, negatives near 0.5, on texts the guards have nothing to say about."""
    rng = random.Random(seed)
    pairs = [ScoredPair(Pair(f"q{i}", f"p{i}", True), min(1.0, rng.gauss(0.85, 0.07)))
             for i in range(positives)]  # fmt: skip
    pairs += [ScoredPair(Pair(f"q{i}", f"n{i}", False), min(1.0, rng.gauss(0.5, 0.12)))
              for i in range(negatives)]  # fmt: skip
    return pairs


def test_wilson_upper_bound_matches_known_values() -> None:
    assert wilson_upper(0, 1000) == pytest.approx(2.7055 / (1000 + 2.7055), rel=1e-4)
    assert wilson_upper(10, 100) == pytest.approx(0.16036, abs=1e-5)
    assert wilson_upper(100, 100) == 1.0
    assert wilson_upper(3, 1000) < wilson_upper(4, 1000) < wilson_upper(4, 500)


def test_wilson_upper_bound_covers_the_true_rate_about_95_percent_of_the_time() -> None:
    draws = np.random.default_rng(0).binomial(1000, 0.01, size=4000)
    missed = np.mean([wilson_upper(int(k), 1000) < 0.01 for k in draws])
    assert 0.02 < missed < 0.08


def test_tune_picks_the_lowest_threshold_on_the_grid_meeting_the_target() -> None:
    scored = synthetic(1000, 2000, seed=1)
    calibration = tune(scored, target_false_hit=0.01)
    e = calibration.evaluation
    assert e.false_hit_upper is not None
    assert e.false_hit_upper <= 0.01
    one_step_lower = evaluate(scored, round(e.threshold - THRESHOLD_STEP, 4))
    assert one_step_lower.false_hit_upper is not None
    assert one_step_lower.false_hit_upper > 0.01
    assert e.false_hits == calibration.max_false_hits
    assert round(e.threshold / THRESHOLD_STEP) * THRESHOLD_STEP == pytest.approx(e.threshold)
    assert (e.pairs, e.positives, e.negatives) == (3000, 1000, 2000)
    assert e.hit_rate == sum(s.similarity >= e.threshold for s in scored[:1000]) / 1000


def test_tune_reports_exactly_what_evaluate_reports_at_its_threshold() -> None:
    scored = synthetic(300, 900, seed=2)
    calibration = tune(scored, target_false_hit=0.02, guards=default_guards())
    assert calibration.evaluation == evaluate(
        scored, calibration.threshold, guards=default_guards()
    )


def test_a_stricter_target_never_lowers_the_threshold() -> None:
    scored = synthetic(500, 3000, seed=3)
    thresholds = [tune(scored, target_false_hit=t).threshold for t in (0.05, 0.02, 0.01, 0.005)]
    assert thresholds == sorted(thresholds)


def test_negatives_vetoed_by_a_guard_do_not_hold_the_threshold_up() -> None:
    scored = synthetic(300, 1000, seed=4)
    # Ten near-identical negatives differing only in a number: without the guard they force
    # the threshold above 0.99; the numbers guard vetoes them, so it can stay low.
    scored += [ScoredPair(Pair(f"cancel order {i}", f"cancel order {i + 1}", False), 0.995)
               for i in range(10)]  # fmt: skip
    without = tune(scored, target_false_hit=0.01)
    with_guard = tune(scored, target_false_hit=0.01, guards=build_guards(["numbers"]))
    assert without.threshold > 0.99
    assert with_guard.threshold < 0.9
    assert with_guard.evaluation.guard_vetoes == 10


def test_when_every_negative_may_be_accepted_the_threshold_is_the_lowest_similarity() -> None:
    scored = [ScoredPair(Pair("a", f"b{'xyz'[i]}", False), 0.3) for i in range(3)]
    scored += [ScoredPair(Pair("a", f"c{'xyz'[i]}", True), 0.42) for i in range(3)]
    scored += [ScoredPair(Pair(f"n {i}", f"n {i + 1}", False), 0.9) for i in range(2000)]
    calibration = tune(scored, target_false_hit=0.01, guards=build_guards(["numbers"]))
    assert calibration.threshold == 0.3
    assert calibration.evaluation.hit_rate == 1.0


def test_too_few_negatives_to_meet_the_target_is_an_error_saying_so() -> None:
    with pytest.raises(
        InvalidRequestError, match=r"100 negative pairs cannot show .* bound is 0.0263"
    ):
        tune(synthetic(50, 100, seed=5), target_false_hit=0.01)
    with pytest.raises(InvalidRequestError, match="0 negative pairs"):
        tune(synthetic(50, 0, seed=5))
    with pytest.raises(ConfigError, match=r"target_false_hit .* got 1\.5"):
        tune(synthetic(50, 500, seed=5), target_false_hit=1.5)


def test_too_many_identical_negatives_mean_no_threshold_can_meet_the_target() -> None:
    scored = synthetic(100, 1000, seed=8)
    scored += [ScoredPair(Pair("same", f"same{'abcdefghijklmnopqrst'[i]}", False), 1.0)
               for i in range(20)]  # fmt: skip
    with pytest.raises(InvalidRequestError, match=r"20 negative pairs have similarity 1\.0"):
        tune(scored, target_false_hit=0.01)


def test_evaluate_without_positives_or_negatives_reports_none_for_their_rates() -> None:
    only_positives = evaluate(synthetic(10, 0, seed=6), 0.5)
    assert only_positives.false_hit_rate is None
    assert only_positives.false_hit_upper is None
    assert evaluate(synthetic(0, 10, seed=6), 0.5).hit_rate is None


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 1000), threshold=st.floats(0.0, 1.0))
def test_curve_points_agree_with_evaluate(seed: int, threshold: float) -> None:
    scored = synthetic(40, 60, seed)
    scored.append(ScoredPair(Pair("order 1", "order 2", False), 0.97))
    guards = build_guards(["numbers"])
    for point in curve(scored, guards=guards, points=7):
        e = evaluate(scored, point.threshold, guards=guards)
        assert (point.hit_rate, point.false_hit_rate, point.false_hit_upper) == (
            e.hit_rate,
            e.false_hit_rate,
            e.false_hit_upper,
        )
    rates = [p.false_hit_rate for p in curve(scored, points=20)]
    assert rates == sorted(rates, key=lambda r: -(r or 0.0))


def test_score_pairs_embeds_each_text_once_and_gives_cosines() -> None:
    seen: list[str] = []

    class Counting(HashingEmbedder):
        def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            seen.extend(texts)
            return super().embed(texts)

    embedder = Counting(dim=64)
    pairs = [Pair("same text", "same text", True), Pair("same text", "other", False)]
    scored = score_pairs(pairs, embedder)
    assert sorted(seen) == ["other", "same text"]
    assert scored[0].similarity == pytest.approx(1.0, abs=1e-6)
    assert -1.0 <= scored[1].similarity < 0.9


def test_score_pairs_with_the_static_model_separates_hard_case_kinds(
    static_embedder: StaticEmbedder, hard_cases: list[Pair]
) -> None:
    scored = score_pairs(hard_cases, static_embedder)
    assert len(scored) == len(hard_cases)
    assert all(-1.0 <= s.similarity <= 1.0 for s in scored)


def test_plot_writes_a_png(tmp_path: Path) -> None:
    scored = synthetic(100, 300, seed=7)
    path = plot(
        {"with guards": curve(scored, guards=default_guards()), "no guards": curve(scored)},
        tmp_path / "curve.png",
        target_false_hit=0.01,
        threshold=0.8,
    )
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000
