"""The KV sweep with a disk tier below RAM (kv_sweep.py `with_disk`): RAM of R tokens over a
disk of D reuse what one LRU cache of max(R, D) would (the engine writes every block through
and refreshes its disk recency on use), the RAM share being the curve at R."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from infercache.analyze.simulated_prefix_cache import SimulatedPrefixCache
from tests.analyze.generators import support_bot
from tests.harness.cli import run_analyze


def swept(n: int = 600) -> SimulatedPrefixCache:
    cache = SimulatedPrefixCache(sweep=True)
    for t, units in enumerate(trace(n)):
        cache.observe("ns", units, unit_tokens=1, prompt_tokens=len(units), now_s=float(t))
    return cache


def trace(n: int) -> list[tuple[int, ...]]:
    """Support-bot prompts as token ids: five 200-token system prompts, the first ones far more
    often, each followed by a short question of its own."""
    rng = random.Random(3)
    out = []
    for i in range(n):
        system = min(int(rng.expovariate(0.7)), 4)
        question = tuple(rng.randrange(50_000, 60_000) for _ in range(rng.randint(4, 12)))
        out.append((*range(system * 1000, system * 1000 + 200), *question, i))
    return out


def test_a_disk_tier_adds_reuse_up_to_one_cache_of_its_size() -> None:
    cache = swept()
    sweep = cache.sweep
    assert sweep is not None
    curve = sweep.curve()
    small = [p for p in curve if p.budget_tokens < 1024]
    assert small
    tiered = sweep.with_disk(4096, small)
    for ram, both in zip(small, tiered, strict=True):
        assert both.ram_tokens == ram.budget_tokens
        assert both.token_share == pytest.approx(sweep.share_at(4096))
        assert both.disk_share == pytest.approx(both.token_share - ram.token_share)
        assert both.disk_share >= 0
    assert tiered[0].disk_share > 0.5  # five 200-token system prompts fit on disk, not in RAM


def test_a_disk_no_larger_than_ram_adds_nothing() -> None:
    sweep = swept().sweep
    assert sweep is not None
    curve = sweep.curve()
    for point in sweep.with_disk(curve[0].budget_tokens, curve):
        assert point.disk_share == pytest.approx(0.0)


def test_the_share_at_a_budget_is_the_bounded_replay_of_that_budget() -> None:
    sweep = swept().sweep
    assert sweep is not None
    for budget in (256, 1024, 4096):
        bounded = SimulatedPrefixCache(capacity_tokens=budget)
        reused = total = 0
        for t, units in enumerate(trace(600)):
            reuse = bounded.observe(
                "ns", units, unit_tokens=1, prompt_tokens=len(units), now_s=float(t)
            )
            reused, total = reused + reuse.reused_tokens, total + len(units)
        assert sweep.share_at(budget) == pytest.approx(reused / total, abs=0.035)


def test_the_report_shows_the_sweep_over_a_disk_budget(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = support_bot(seed=2, n=400).write(tmp_path / "log.jsonl")
    common = ["--tokenizer", "chars4", "--no-semantic", "--capacity", "disk=1MiB"]
    assert run_analyze(str(log), "--format", "json", "--kv-bytes-per-token", "256", *common) == 0
    sweep = json.loads(capsys.readouterr().out)["kv_sweep"]
    assert sweep["disk_tokens"] == 4096  # 1 MiB at 256 bytes a token
    rows = sweep["with_disk"]
    assert [r["ram_tokens"] for r in rows] == [p["budget_tokens"] for p in sweep["curve"]]
    for row, point in zip(rows, sweep["curve"], strict=True):
        assert row["token_share"] >= point["token_share"]
        assert row["disk_share"] == pytest.approx(row["token_share"] - point["token_share"])
    assert run_analyze(str(log), "--kv-bytes-per-token", "256", *common) == 0
    assert "over a disk tier of 4,096 tokens" in capsys.readouterr().out
