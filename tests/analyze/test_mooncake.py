"""Acceptance 2: on Mooncake's synthetic trace (a copy in tests/analyze/data, see its README)
the prefix token share and the simulated prefix hit rate come from `hash_ids`, checked against
an independent count: a request reuses the leading run of its blocks seen in any earlier
request (a block id names its whole prefix), capped at input_length - 1 tokens (the engine
recomputes the last prompt token), and is a hit when it reuses anything."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from infercache.analyze.census import Class
from infercache.analyze.recommend import recommend
from infercache.analyze.reports.document import build_report
from tests.analyze.conftest import MOONCAKE, RunAnalysis

BLOCK = 512


def trace() -> list[dict[str, Any]]:
    with gzip.open(MOONCAKE, "rt") as f:
        return [json.loads(line) for line in f]


def independent_count(rows: list[dict[str, Any]]) -> tuple[int, int, int, int]:
    """(reused tokens, prompt tokens, requests reusing anything, repeated prompts)."""
    seen: set[int] = set()
    prompts: set[tuple[int, tuple[int, ...]]] = set()
    reused = total = hits = repeats = 0
    for row in rows:
        run = 0
        for block in row["hash_ids"]:
            if block not in seen:
                break
            run += 1
        tokens = min(run * BLOCK, row["input_length"] - 1)
        reused += tokens
        hits += tokens > 0
        total += row["input_length"]
        identity = (row["input_length"], tuple(row["hash_ids"]))
        repeats += identity in prompts
        prompts.add(identity)
        seen.update(row["hash_ids"])
    return reused, total, hits, repeats


@pytest.fixture(scope="module")
def counted() -> tuple[int, int, int, int]:
    rows = trace()
    assert len(rows) == 3993
    return independent_count(rows)


def test_prefix_token_share_and_hit_rate_match_an_independent_count(
    run_analysis: RunAnalysis, counted: tuple[int, int, int, int]
) -> None:
    reused, total, hits, repeats = counted
    analysis = run_analysis([MOONCAKE], prefix_capacity_tokens=10**12)
    census = analysis.census.total
    assert census.requests == 3993
    assert (census.reused_tokens, census.prompt_tokens) == (reused, total)
    assert census.classes[Class.EXACT_REPEAT] == repeats
    prefix = analysis.replays["prefix"].strategies["prefix"]
    assert (prefix["hits"], prefix["lookups"]) == (hits, 3993)
    assert prefix["prompt_tokens_saved"] == reused
    report = build_report(analysis, recommend(analysis))
    assert report["prefix_token_share"] == pytest.approx(reused / total)
    assert report["simulation"]["prefix"]["hit_rate"] == pytest.approx(hits / 3993)
    assert report["simulation"]["exact"] == {"available": False}
    assert any("block-hash traces" in note for note in report["notes"])
    print(f"mooncake: prefix token share {reused / total:.4f}, hit rate {hits / 3993:.4f}")


def test_a_smaller_kv_budget_never_reuses_more(run_analysis: RunAnalysis) -> None:
    analysis = run_analysis(
        [MOONCAKE], prefix_capacity_tokens=2_000_000, sweep=True, capacity_factors=(0.25, 1.0)
    )
    saved = {
        name: r.strategies["prefix"]["prompt_tokens_saved"]
        for name, r in analysis.replays.items()
        if name.startswith("prefix_capacity:")
    }
    assert 0 < saved["prefix_capacity:0.25"] < saved["prefix_capacity:1"]
    assert saved["prefix_capacity:1"] < analysis.census.total.reused_tokens
