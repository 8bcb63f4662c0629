"""`LiveCalibration`: no operating point before enough judged pairs meet the bound; serving at the
lowest score reached walking down while each point meets it; back to shadow when the bound is
exceeded; kept across restarts."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from infercache.clock import ManualClock
from infercache.metrics import StrategyMetrics
from infercache.semantic.shadow import LiveCalibration, wilson_uppers
from infercache.semantic.tuning.calibrate import wilson_upper
from infercache.stores import open_store


def calibration(
    tmp_path: Path, *, min_pairs: int = 60, persist_every: int = 50
) -> tuple[LiveCalibration, StrategyMetrics]:
    metrics = StrategyMetrics("semantic")
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    store = open_store(url, clock=ManualClock(), max_bytes=1 << 20)
    live = LiveCalibration(
        store,
        name="m",
        metrics=metrics,
        target_false_hit=0.05,
        min_pairs=min_pairs,
        window=1000,
        persist_every=persist_every,
    )
    return live, metrics


def test_the_vectorised_bound_is_the_scalar_one() -> None:
    failures = np.array([0, 3, 10, 100])
    trials = np.array([50, 100, 100, 100])
    expected = [wilson_upper(int(f), int(n)) for f, n in zip(failures, trials, strict=True)]
    assert wilson_uppers(failures, trials, 0.95) == pytest.approx(expected)


def test_serving_starts_only_once_the_bound_is_met_over_enough_pairs(tmp_path: Path) -> None:
    live, metrics = calibration(tmp_path)
    for i in range(59):
        live.record(0.9 + i * 1e-4, wrong=False)
    assert live.operating_point is None  # 59 < min_pairs
    live.record(0.95, wrong=False)
    state = live.state()
    assert state.serving
    assert live.operating_point == pytest.approx(0.9)
    assert state.false_hit_upper == pytest.approx(wilson_upper(0, 60))
    snapshot = metrics.snapshot()
    assert snapshot["counters"]["calibration_started_serving"] == 1
    assert snapshot["gauges"]["calibration_serving"] == 1.0


def test_the_operating_point_is_the_lowest_score_whose_bound_meets_the_target(
    tmp_path: Path,
) -> None:
    live, _ = calibration(tmp_path, min_pairs=50)
    rng = random.Random(0)
    for _ in range(400):  # high scores are right, low scores are wrong half the time
        score = rng.random()
        live.record(score, wrong=score < 0.5 and rng.random() < 0.5)
    point = live.operating_point
    assert point is not None
    assert 0.35 < point < 0.6
    state = live.state()
    assert state.false_hit_upper is not None
    assert state.false_hit_upper <= 0.05


def test_the_walk_down_stops_at_the_first_point_that_fails(tmp_path: Path) -> None:
    """A band of wrong answers between two clean bands: the lower clean band alone would pass
    the bound, but reaching it means serving the wrong band too, so the point stays above it."""
    live, _ = calibration(tmp_path, min_pairs=60)
    for i in range(100):
        live.record(0.9 + i * 1e-4, wrong=False)  # clean: 0.9 and up
    for i in range(20):
        live.record(0.8 + i * 1e-4, wrong=True)  # a wrong band just below
    for i in range(800):
        live.record(0.1 + i * 1e-4, wrong=False)  # many clean pairs far below (window: 1,000)
    # Over everything scoring >= 0.1 the rate is 20 / 920 (its upper bound would pass alone),
    # but the walk down meets the wrong band first and stops in it (1 wrong in 101 still
    # passes; 2 in 102 does not).
    assert wilson_upper(20, 920) <= 0.05
    assert live.operating_point == pytest.approx(0.8019)
    state = live.state()
    assert state.serving
    assert state.false_hit_upper == pytest.approx(wilson_upper(1, 101))


def test_wrong_answers_send_it_back_to_shadow_and_the_state_survives_a_restart(
    tmp_path: Path,
) -> None:
    live, metrics = calibration(tmp_path, persist_every=10)
    for _ in range(100):
        live.record(0.95, wrong=False)
    assert live.operating_point is not None
    for _ in range(20):
        live.record(0.97, wrong=True)
    assert live.operating_point is None
    assert metrics.snapshot()["counters"]["calibration_back_to_shadow"] == 1
    restarted, _ = calibration(tmp_path)
    assert restarted.state().pairs_judged == 120
    assert restarted.operating_point is None
    assert restarted.state().window_pairs == 120


def test_the_would_be_hit_rate_counts_lookups_whose_candidate_reaches_the_point(
    tmp_path: Path,
) -> None:
    live, _ = calibration(tmp_path, min_pairs=60)
    for i in range(100):
        live.note_lookup()
        live.note_lookup()  # every other lookup had no candidate worth judging
        live.record(0.9 + (i % 10) * 0.001, wrong=False)
    rate = live.state().would_be_hit_rate
    assert rate == pytest.approx(0.5, abs=0.01)


def test_the_would_be_hit_rate_survives_a_rescore_of_the_window(tmp_path: Path) -> None:
    """Shadow's refit replaces the judged pairs by the same judgments on a new scale: the rate
    still counts them against the lookups they came from, not against the lookups since."""
    live, _ = calibration(tmp_path, min_pairs=60)
    for i in range(100):
        live.note_lookup()
        live.note_lookup()
        live.record(0.9 + (i % 10) * 0.001, wrong=False)
    before = live.state().would_be_hit_rate
    rescored = [(0.5 + (i % 10) * 0.01, False) for i in range(100)]
    live.reset(rescored, "m:refit")
    after = live.state().would_be_hit_rate
    assert before == pytest.approx(0.5, abs=0.01)
    assert after == pytest.approx(before, abs=0.01)


def test_the_would_be_hit_rate_survives_a_restart(tmp_path: Path) -> None:
    live, _ = calibration(tmp_path, min_pairs=60, persist_every=100)
    for i in range(100):
        live.note_lookup()
        live.note_lookup()
        live.record(0.9 + (i % 10) * 0.001, wrong=False)  # the 100th record persists
    restarted, _ = calibration(tmp_path, min_pairs=60, persist_every=100)
    assert restarted.state().would_be_hit_rate == pytest.approx(0.5, abs=0.01)
