"""Acceptance 1 (the recommendation part): the support bot gets exact + KV reuse, the drafting
tool no exact cache and KV reuse only where prefixes are shared, each with measured reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infercache.analyze.options import SemanticOptions
from infercache.analyze.recommend import recommend
from infercache.semantic.embedder import HashingEmbedder
from tests.analyze.conftest import RunAnalysis
from tests.analyze.generators import drafting_tool, support_bot, write_lines


def reasons(rec: object) -> dict[str, tuple[bool, str]]:
    return {r.strategy: (r.enable, r.text) for r in rec.reasons}  # type: ignore[attr-defined]


def test_support_bot_gets_exact_and_kv_reuse(tmp_path: Path, run_analysis: RunAnalysis) -> None:
    gen = support_bot(seed=21, n=1500)
    semantic = SemanticOptions(threshold=0.8, source="test", embedder="hashing")
    analysis = run_analysis(
        [gen.write(tmp_path / "log.jsonl")], embedder=HashingEmbedder(dim=256), semantic=semantic
    )
    rec = recommend(analysis)
    assert rec.strategies == ("exact", "prefix")
    why = reasons(rec)
    assert why["exact"][1].startswith(f"{round(100 * sum(gen.truth.exact_repeat) / 1500)}% exact")
    assert "saves" in why["exact"][1]
    assert "of prompt tokens sit in shared prefixes → KV reuse" in why["prefix"][1]
    assert "semantic not worth its risk" in why["semantic"][1]  # repeats of paraphrases are exact
    assert rec.prefix_scope == ()
    alarms = {a.strategy: a for a in rec.alarms}
    assert set(alarms) == {"exact", "prefix"}
    assert alarms["exact"].alert_below == alarms["exact"].expected / 2 > 0.2


@pytest.mark.parametrize("tokenizer", ["chars4", pytest.param("smollm2", marks=pytest.mark.slow)])
def test_drafting_tool_gets_no_exact_cache_and_kv_reuse_only_where_shared(
    tmp_path: Path, run_analysis: RunAnalysis, tokenizer: str, request: pytest.FixtureRequest
) -> None:
    # SmolLM2's template adds a default system prompt to `notes` requests: a short shared
    # preamble that must not count as "prefixes are shared".
    chosen = request.getfixturevalue("smollm2") if tokenizer == "smollm2" else None
    log = drafting_tool(seed=3, n=600).write(tmp_path / "log.jsonl")
    analysis = run_analysis([log], tokenizer=chosen)
    rec = recommend(analysis)
    assert rec.strategies == ("prefix",)
    assert rec.prefix_scope == ("docs",)
    why = reasons(rec)
    assert why["exact"] == (False, why["exact"][1])
    assert "0% exact repeats" in why["exact"][1]
    assert "only where prefixes are shared: tenant(s) docs" in why["prefix"][1]
    assert "not notes" in why["prefix"][1]
    assert "not measured" in why["semantic"][1]
    assert any("not cacheable (sampled without a seed)" in a for a in rec.advice)


def test_repeats_returning_after_the_ttl_get_ttl_advice(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "daily report"}],
            "temperature": 0}  # fmt: skip
    lines = [json.dumps({"timestamp": 7200.0 * i, "request": body}) for i in range(10)]
    analysis = run_analysis([write_lines(tmp_path / "log.jsonl", lines)], ttl_s=3600)
    rec = recommend(analysis)
    assert any("come back within the 3600 s TTL" in a for a in rec.advice)
    assert "exact" not in rec.strategies  # every repeat arrives after its entry expired
