"""The one Wilson score interval (intervals.py) the semantic layer and the analyzer share."""

from __future__ import annotations

import math

import pytest

from infercache.intervals import sample_size, wilson_interval, wilson_upper, z_score


def test_known_values() -> None:
    # 10 of 100 at 95%: the textbook interval (Newcombe 1998, method 3) is 0.0552–0.1744
    low, high = wilson_interval(10, 100)
    assert low == pytest.approx(0.05522, abs=1e-5)
    assert high == pytest.approx(0.17437, abs=1e-5)
    assert wilson_upper(0, 1000) == pytest.approx(2.7055 / (1000 + 2.7055), rel=1e-4)
    assert wilson_upper(10, 100) == pytest.approx(0.16036, abs=1e-5)
    assert z_score(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert sample_size(0.01) == 9604


def test_the_interval_holds_the_share_and_narrows_with_trials() -> None:
    for k, n in [(0, 1), (1, 1), (3, 7), (50, 100), (1, 10_000)]:
        low, high = wilson_interval(k, n)
        assert 0 <= low <= k / n <= high <= 1
    assert wilson_interval(0, 1)[0] == 0.0
    assert wilson_interval(5, 5)[1] == 1.0
    wide, narrow = wilson_interval(5, 50), wilson_interval(50, 500)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    assert wilson_upper(3, 100) < wilson_interval(3, 100)[1]  # one tail gets all 5%


def test_no_trials_know_nothing_and_impossible_counts_are_refused() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    for k, n in [(-1, 5), (6, 5), (1, 0), (0, -1)]:
        with pytest.raises(ValueError, match="0 <= k <= n"):
            wilson_interval(k, n)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(1, 2, confidence=1.0)
    with pytest.raises(ValueError, match="half_width"):
        sample_size(0.5)
    assert math.isfinite(wilson_upper(1, 2, confidence=0.999))
