"""Issue 10, acceptance 3 (on the copy in tests/analyze/data, see its README; bench/analyze.py
runs the shared file): prefix reuse is recommended, the KV sweep spans the working set and
marks its knee, and nothing is judged against the built-in engine's memory. The prefix token
share and the simulated prefix hit rate come from `hash_ids`, checked against an independent
count: a request reuses the leading run of its blocks seen in any earlier
request (a block id names its whole prefix), capped at input_length - 1 tokens (the engine
recomputes the last prompt token), and is a hit when it reuses anything."""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from infercache.analyze.census import Class
from infercache.analyze.reports.document import build_report
from infercache.analyze.reports.text import header_lines as report_header
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
    analysis = run_analysis([MOONCAKE])  # the default: no KV bound assumed
    census = analysis.census.total
    assert census.requests == 3993
    assert (census.reused_tokens, census.prompt_tokens) == (reused, total)
    assert census.classes[Class.EXACT_REPEAT] == repeats
    prefix = analysis.replays["prefix"].strategies["prefix"]
    assert (prefix["hits"], prefix["lookups"]) == (hits, 3993)
    assert prefix["prompt_tokens_saved"] == reused
    report = build_report(analysis).to_dict()
    assert report["prefix_token_share"] == pytest.approx(reused / total)
    assert report["simulation"]["prefix"]["hit_rate"] == pytest.approx(hits / 3993)
    assert report["simulation"]["exact"] == {"available": False}
    assert any("block-hash traces" in note for note in report["notes"])
    print(f"mooncake: prefix token share {reused / total:.4f}, hit rate {hits / 3993:.4f}")


def test_prefix_reuse_is_recommended_and_never_judged_against_the_engine_memory(
    run_analysis: RunAnalysis,
) -> None:
    built = build_report(run_analysis([MOONCAKE]))
    report = built.to_dict()
    rec = report["recommendation"]
    assert rec["strategies"] == ["prefix"]
    assert report["settings"]["capacity"]["prefix_tokens"] is None
    assert "KV budget: unbounded" in " ".join(report_header(built.figures))
    [alarm] = rec["alarms"]
    assert alarm["expected"] == pytest.approx(report["prefix_token_share"], abs=1e-9)
    assert report["settings"]["tokenizer"] == "block-hash trace, 512 tokens a block"


def test_the_sweep_spans_the_working_set_and_marks_the_knee(
    run_analysis: RunAnalysis, counted: tuple[int, int, int, int]
) -> None:
    reused, total, _, _ = counted
    report = build_report(run_analysis([MOONCAKE], replay=False)).to_dict()
    sweep = report["kv_sweep"]
    curve = sweep["curve"]
    shares = [p["token_share"] for p in curve]
    assert shares == sorted(shares)
    # it ends where the share stops rising: within 0.1 point of the unbounded cache, whose
    # working set (every distinct block) it covers
    assert curve[-1]["token_share"] == pytest.approx(reused / total, abs=0.001)
    assert curve[-1]["budget_tokens"] >= sweep["working_set_tokens"] // 2
    assert curve[-2]["token_share"] < reused / total - 0.001
    knee = sweep["knee"]
    assert curve[0]["budget_tokens"] < knee["budget_tokens"] <= curve[-1]["budget_tokens"]
    assert knee["token_share"] > 0.9 * reused / total
