"""Issue 10, acceptance 1: generated days with known truth get the right advice. Support bot
(~150-token system prompt, Zipf-popular FAQ repeats, short unique questions): exact and prefix
on. Drafting tool (long unique prompts, nothing shared): exact off and prefix off. Document
Q&A (one long document, different questions): prefix on, exact off. A timestamp at the head of
the system prompt: the breaker is reported, and prefix reuse is recommended once the layout is
fixed. (Every reason's figures against the census: test_recommend_figures.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infercache.analyze.options import SemanticOptions
from infercache.analyze.reports.document import build_report
from infercache.semantic.embedder import HashingEmbedder
from tests.analyze.conftest import RunAnalysis
from tests.analyze.generators import (
    document_qa,
    drafting_tool,
    short_support_bot,
    support_bot,
    timestamp_at_end,
    timestamped_support,
    unique_drafts,
    write_lines,
)

TOKENIZERS = ["chars4", pytest.param("smollm2", marks=pytest.mark.slow)]


def report_of(run_analysis: RunAnalysis, log: Path, **kw: Any) -> dict[str, Any]:
    return build_report(run_analysis([log], **kw)).to_dict()


def reasons(report: dict[str, Any]) -> dict[str, tuple[bool, str]]:
    return {r["strategy"]: (r["enable"], r["text"]) for r in report["recommendation"]["reasons"]}


def tokenizer_for(name: str, request: pytest.FixtureRequest) -> Any:
    return request.getfixturevalue("smollm2") if name == "smollm2" else None


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_support_bot_gets_exact_and_kv_reuse(
    tmp_path: Path, run_analysis: RunAnalysis, tokenizer: str, request: pytest.FixtureRequest
) -> None:
    gen = short_support_bot(seed=21, n=1500)
    semantic = SemanticOptions(threshold=0.8, source="test", embedder="hashing")
    report = report_of(
        run_analysis,
        gen.write(tmp_path / "log.jsonl"),
        tokenizer=tokenizer_for(tokenizer, request),
        embedder=HashingEmbedder(dim=256),
        semantic=semantic,
    )
    rec = report["recommendation"]
    assert rec["strategies"] == ["exact", "prefix"]
    assert rec["layering"] == "exact → prefix"
    why = reasons(report)
    repeats = sum(gen.truth.exact_repeat) / 1500
    assert why["exact"][1].startswith(f"{100 * repeats:.1f}% exact repeats")
    assert "saves" in why["exact"][1]
    assert why["prefix"][1].startswith(f"{100 * report['prefix_token_share']:.1f}% of prompt")
    assert report["prefix_token_share"] > 0.8  # the ~150-token system prompt, most of each prompt
    assert "semantic not worth its risk" in why["semantic"][1]  # repeats of paraphrases are exact
    assert rec["prefix_scope"] == []
    alarms = {a["strategy"]: a for a in rec["alarms"]}
    assert set(alarms) == {"exact", "prefix"}
    assert alarms["exact"]["alert_below"] == alarms["exact"]["expected"] / 2 > 0.2
    # the prefix alarm watches what reaches the engine under the exact cache
    under = report["simulation"]["layered"]["prefix_under_caches"]["token_hit_rate"]
    assert alarms["prefix"]["expected"] == pytest.approx(under)


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_drafting_tool_gets_neither_exact_nor_kv_reuse(
    tmp_path: Path, run_analysis: RunAnalysis, tokenizer: str, request: pytest.FixtureRequest
) -> None:
    # SmolLM2's template adds a default system prompt: a short shared preamble, a few
    # percent of these long prompts, which must not count as worth a KV cache.
    report = report_of(
        run_analysis,
        unique_drafts(seed=3, n=300).write(tmp_path / "log.jsonl"),
        tokenizer=tokenizer_for(tokenizer, request),
    )
    assert report["recommendation"]["strategies"] == []
    why = reasons(report)
    assert why["exact"][1].startswith("0.0% exact repeats")
    assert "not worth running" in why["exact"][1]
    assert report["prefix_token_share"] < 0.1
    assert why["prefix"][1].startswith("only ")
    assert "would save little" in why["prefix"][1]


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
def test_document_qa_gets_kv_reuse_and_no_exact_cache(
    tmp_path: Path, run_analysis: RunAnalysis, tokenizer: str, request: pytest.FixtureRequest
) -> None:
    report = report_of(
        run_analysis,
        document_qa(seed=4, n=200).write(tmp_path / "log.jsonl"),
        tokenizer=tokenizer_for(tokenizer, request),
    )
    assert report["recommendation"]["strategies"] == ["prefix"]
    assert report["prefix_token_share"] > 0.9
    assert report["census"]["shared_prefix"] > 0.99
    assert report["shared_prefix"]["mean_tokens"] > 2000
    prefix = report["simulation"]["prefix"]
    assert prefix["upstream_s_saved"] > 0
    assert prefix["ttft_saved_ms_mean"] > 100  # thousands of tokens of prefill a request
    assert "0.0% exact repeats" in reasons(report)["exact"][1]


def test_a_timestamp_up_front_is_reported_and_prefix_reuse_follows_the_fixed_layout(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    broken = report_of(run_analysis, timestamped_support(seed=6, n=300).write(tmp_path / "a"))
    [breaker] = broken["prefix_breakers"]
    assert (breaker["kind"], breaker["role"]) == ("timestamp", "system")
    enable, text = reasons(broken)["prefix"]
    assert not enable
    assert "moving the timestamp in the system message to the end" in text
    assert "fix the layout first, then turn on KV reuse" in text
    fixed_share = broken["prefix_breakers_summary"]["share_if_fixed"]
    assert f"{100 * fixed_share:.1f}%" in text
    fixed = report_of(
        run_analysis,
        support_bot(seed=6, n=300, system=timestamp_at_end).write(tmp_path / "b"),
    )
    assert fixed["prefix_breakers"] == []
    assert "prefix" in fixed["recommendation"]["strategies"]
    # what the breaker promised is what the fixed layout gets, within a point
    assert fixed["prefix_token_share"] == pytest.approx(fixed_share, abs=0.01)


def test_kv_reuse_is_scoped_to_the_tenants_that_share_prefixes(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    report = report_of(run_analysis, drafting_tool(seed=3, n=600).write(tmp_path / "log.jsonl"))
    rec = report["recommendation"]
    assert rec["strategies"] == ["prefix"]
    assert rec["prefix_scope"] == ["docs"]
    text = reasons(report)["prefix"][1]
    assert "only where prefixes are shared: tenant(s) docs" in text
    assert "not notes" in text
    assert any("not cacheable (sampled without a seed)" in a for a in rec["advice"])


def test_repeats_returning_after_the_ttl_get_ttl_advice(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "daily report"}],
            "temperature": 0}  # fmt: skip
    lines = [json.dumps({"timestamp": 7200.0 * i, "request": body}) for i in range(10)]
    report = report_of(run_analysis, write_lines(tmp_path / "log.jsonl", lines), ttl_s=3600)
    rec = report["recommendation"]
    assert any("come back within the 1.0 h TTL" in a for a in rec["advice"])
    assert "exact" not in rec["strategies"]  # every repeat arrives after its entry expired
