"""Per-answer thresholds: the global threshold is the prior; judged outcomes move an answer's own
threshold; a complaint keeps that answer from ever being served at that score again."""

from __future__ import annotations

import pytest

from infercache.semantic.answer_stats import AnswerStats, AnswerStatsConfig, GroupKey

BASE = 0.90
A = GroupKey("scope-1", "answer-a")
B = GroupKey("scope-1", "answer-b")


def test_an_answer_without_observations_uses_the_global_threshold() -> None:
    stats = AnswerStats()
    assert stats.threshold(A, BASE) == BASE
    assert stats.threshold(A, 0.5) == 0.5


def test_a_wrong_outcome_near_the_threshold_raises_only_that_answer() -> None:
    stats = AnswerStats(AnswerStatsConfig(band=0.05, epsilon=1e-4))
    stats.record(A, 0.93, wrong=True)
    assert stats.threshold(A, BASE) == pytest.approx(0.9301)
    assert stats.threshold(B, BASE) == BASE
    stats.record(B, 0.70, wrong=True)  # far below the threshold: says nothing about 0.90
    assert stats.threshold(B, BASE) == BASE


def test_enough_right_outcomes_below_the_threshold_lower_it_within_the_limit() -> None:
    config = AnswerStatsConfig(max_lower=0.02, min_right=3, band=0.05)
    stats = AnswerStats(config)
    for score in (0.895, 0.893):
        stats.record(A, score, wrong=False)
    assert stats.threshold(A, BASE) == BASE  # two are not enough
    stats.record(A, 0.891, wrong=False)
    assert stats.threshold(A, BASE) == pytest.approx(0.891)  # down to where rights were seen
    for score in (0.885, 0.875, 0.86):
        stats.record(A, score, wrong=False)
    assert stats.threshold(A, BASE) == pytest.approx(0.885)  # 0.875 and 0.86: beyond the limit
    stats.record(A, 0.86, wrong=True)  # a wrong one within the band below ends the lowering
    assert stats.threshold(A, BASE) == BASE


def test_a_complaint_forbids_that_score_for_good_and_tenants_stay_apart() -> None:
    stats = AnswerStats()
    stats.complain(A, 0.97)
    assert stats.threshold(A, BASE) > 0.97
    assert stats.threshold(A, 0.99) == 0.99
    assert stats.threshold(GroupKey("scope-2", "answer-a"), BASE) == BASE
    assert stats.observations(A) == [(0.97, True)]


def test_the_oldest_groups_are_forgotten_beyond_the_bound() -> None:
    stats = AnswerStats(AnswerStatsConfig(max_groups=2))
    stats.record(A, 0.95, wrong=True)
    stats.record(B, 0.95, wrong=True)
    stats.record(GroupKey("scope-1", "c"), 0.95, wrong=True)
    assert len(stats) == 2
    assert stats.threshold(A, BASE) == BASE
