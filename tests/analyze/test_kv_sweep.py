"""The KV sweep: reuse at every budget from one pass (kv_sweep.py), checked against real bounded
replays of the simulated prefix cache, and against the unbounded census where the working set
fits."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infercache.analyze.kv_sweep import BudgetSweep, Fenwick, SweepPoint, budget_bin
from infercache.analyze.simulated_prefix_cache import SimulatedPrefixCache
from tests.analyze.conftest import MOONCAKE, RunAnalysis
from tests.analyze.generators import multi_turn_chat, support_bot


@given(st.lists(st.tuples(st.integers(1, 200), st.integers(-5, 5)), max_size=60))
def test_fenwick_prefix_sums_match_a_plain_list(updates: list[tuple[int, int]]) -> None:
    tree, plain = Fenwick(size=4), [0] * 201  # a small start: it grows as indexes arrive
    for index, weight in updates:
        tree.add(index, weight)
        plain[index] += weight
        for probe in (1, index, 200):
            assert tree.prefix(probe) == sum(plain[1 : probe + 1])
    assert tree.total == sum(plain)


def test_budget_bins_are_the_smallest_power_of_two_that_fits() -> None:
    assert [budget_bin(n) for n in (1, 2, 3, 4, 5, 1024, 1025)] == [0, 1, 2, 2, 3, 10, 11]


prompts = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.lists(st.integers(0, 3), min_size=1, max_size=12)),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(prompts)
def test_where_the_working_set_fits_the_sweep_is_the_unbounded_cache(
    requests: list[tuple[str, list[int]]],
) -> None:
    cache = SimulatedPrefixCache(sweep=True)
    reused = hits = total = 0
    for t, (namespace, raw) in enumerate(requests):
        units = tuple(raw)
        reuse = cache.observe(
            namespace, units, unit_tokens=1, prompt_tokens=len(units), now_s=float(t)
        )
        reused += reuse.reused_tokens
        hits += reuse.reused_tokens > 0
        total += len(units)
    assert cache.sweep is not None
    curve = cache.sweep.curve(flat=0.0)
    if not reused:
        assert curve == []
        return
    assert [p.token_share for p in curve] == sorted(p.token_share for p in curve)
    assert curve[-1].token_share == pytest.approx(reused / total)
    assert curve[-1].hit_share == pytest.approx(hits / len(requests))


def real_reuse(run_analysis: RunAnalysis, log: Path, budget: int) -> float:
    analysis = run_analysis([log], prefix_capacity_tokens=budget)
    return float(analysis.replays["prefix"].strategies["prefix"]["token_hit_rate"])


@pytest.mark.parametrize("log_name", ["support", "chat", "mooncake"])
def test_the_sweep_agrees_with_bounded_replays(
    tmp_path: Path, run_analysis: RunAnalysis, log_name: str
) -> None:
    """Within 3.5 points wherever the budget holds a few prompts (the real tree evicts whole
    leaves of its own shape, the sweep counts spans of the unbounded one), exactly once the
    working set fits."""
    if log_name == "support":
        log = support_bot(seed=5, n=1500).write(tmp_path / "log.jsonl")
    elif log_name == "chat":
        log = multi_turn_chat(seed=5, conversations=150).write(tmp_path / "log.jsonl")
    else:
        log = MOONCAKE
    analysis = run_analysis([log], replay=False)
    sweep = analysis.census.kv_sweep
    assert sweep is not None
    curve = sweep.curve()
    working_set = analysis.census.prefix.cached_tokens
    longest = {"support": 1024, "chat": 2048, "mooncake": 200_000}[log_name]
    compared = [p for p in curve if p.budget_tokens >= 2 * longest]
    assert compared
    for point in compared:
        real = real_reuse(run_analysis, log, point.budget_tokens)
        assert point.token_share == pytest.approx(real, abs=0.035)
    unbounded = analysis.census.total.prefix_token_share
    assert real_reuse(run_analysis, log, working_set) == pytest.approx(unbounded, abs=1e-12)
    assert curve[-1].token_share == pytest.approx(unbounded, abs=0.001)


def test_the_knee_is_where_the_curve_bends_on_a_log_axis() -> None:
    sweep = BudgetSweep()
    points = [
        SweepPoint(1 << 10, 0.05, 0.1),
        SweepPoint(1 << 11, 0.40, 0.5),
        SweepPoint(1 << 12, 0.60, 0.7),
        SweepPoint(1 << 13, 0.62, 0.7),
        SweepPoint(1 << 14, 0.63, 0.7),
    ]
    knee = sweep.knee(points)
    assert knee is not None
    assert knee.budget_tokens == 1 << 12
    assert sweep.knee(points[:1]) == points[0]
    assert sweep.knee([]) is None
