"""Issue 10, item 5: a redacted log (redaction.py's fields instead of the text) gives the same
exact-repeat share, the same prefix share within a point and the same recommendation as the
plain log of the same traffic, and says plainly that near-duplicates cannot be measured
without text. Each day is written twice from the same generated records (generators.py
`write_twins`, which calls `redact_request` as the gateway's request log will)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infercache.analyze.options import SemanticOptions
from infercache.analyze.reports.document import build_report
from infercache.semantic.embedder import HashingEmbedder
from infercache.settings import Settings
from infercache.tokenizing.tokenizers import Chars4Tokenizer, PromptTokenizer
from tests.analyze.conftest import RunAnalysis
from tests.analyze.generators import (
    Generated,
    document_qa,
    multi_turn_chat,
    short_support_bot,
    support_bot,
    write_lines,
    write_twins,
)
from tests.harness.cli import run_analyze

DAYS = {
    "support": lambda: short_support_bot(seed=31, n=1200),
    "long-support": lambda: support_bot(seed=31, n=600),
    "chat": lambda: multi_turn_chat(seed=31, conversations=80),
    "docqa": lambda: document_qa(seed=31, n=150),
}
SEMANTIC = SemanticOptions(threshold=0.8, source="test", embedder="hashing")


def twins(gen: Generated, tmp_path: Path, settings: Settings, tokenizer: PromptTokenizer) -> Any:
    return write_twins(
        gen, tmp_path, secret=b"k" * 32, tokenizer=tokenizer, policy=settings.policy()
    )


@pytest.mark.parametrize(
    "tokenizer_name", ["chars4", pytest.param("smollm2", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("day", list(DAYS))
def test_a_redacted_day_gives_the_plain_days_figures_and_advice(
    tmp_path: Path,
    run_analysis: RunAnalysis,
    settings: Settings,
    day: str,
    tokenizer_name: str,
    request: pytest.FixtureRequest,
) -> None:
    tokenizer: PromptTokenizer = (
        Chars4Tokenizer() if tokenizer_name == "chars4" else request.getfixturevalue("smollm2")
    )
    plain_log, redacted_log = twins(DAYS[day](), tmp_path, settings, tokenizer)
    plain = build_report(run_analysis([plain_log], tokenizer=tokenizer)).to_dict()
    redacted = build_report(run_analysis([redacted_log], tokenizer=tokenizer)).to_dict()
    assert redacted["requests"] == plain["requests"]
    assert redacted["census"]["exact_repeat"] == plain["census"]["exact_repeat"]
    assert redacted["prefix_token_share"] == pytest.approx(plain["prefix_token_share"], abs=0.01)
    assert redacted["prompt_tokens"] == plain["prompt_tokens"]  # same tokenizer, same counts
    assert redacted["recommendation"]["strategies"] == plain["recommendation"]["strategies"]
    exact_plain, exact_redacted = (r["simulation"]["exact"] for r in (plain, redacted))
    assert exact_redacted["hits"] == exact_plain["hits"]  # the cache serves the same repeats
    # asked to measure near-duplicates, the plain log can and the redacted one cannot
    kw: dict[str, Any] = {"tokenizer": tokenizer, "embedder": HashingEmbedder(dim=128)}
    measured = build_report(
        run_analysis([plain_log], semantic=SEMANTIC, replay=False, **kw)
    ).to_dict()
    blind = build_report(
        run_analysis([redacted_log], semantic=SEMANTIC, replay=False, **kw)
    ).to_dict()
    assert measured["near_duplicates"]["measured"] is True
    near = blind["near_duplicates"]
    assert near["measured"] is False
    assert near["reason"].startswith("near-duplicates cannot be measured without text")
    [semantic] = [r for r in blind["recommendation"]["reasons"] if r["strategy"] == "semantic"]
    assert "cannot be measured without text" in semantic["text"]
    assert (
        f"{tokenizer.name} (the redacted log's prefix hashes)" in redacted["settings"]["tokenizer"]
    )
    assert any("redacted line(s)" in note for note in redacted["notes"])


def test_the_command_on_a_redacted_log_loads_no_embedder_and_says_why(
    tmp_path: Path, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    _, redacted_log = twins(short_support_bot(seed=2, n=200), tmp_path, settings, Chars4Tokenizer())
    # the packaged calibration by default: with no text nothing is embedded, MiniLM never loads
    assert run_analyze(str(redacted_log), "--format", "json", "--tokenizer", "chars4") == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["near_duplicates"]["measured"] is False
    assert "cannot be measured without text" in report["near_duplicates"]["reason"]
    assert "Loading" not in captured.err
    assert report["recommendation"]["strategies"] == ["exact", "prefix"]
    # nothing was measured, so no note labels a near-duplicate share with its calibration
    assert not any(n.startswith("near-duplicates: public calibration") for n in report["notes"])


def test_an_older_redacted_line_counts_exact_repeats_only(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    lines = [
        json.dumps({"timestamp": float(i), "tenant": "t", "model": "m",
                    "request_digest": f"sha256:{i % 3}", "prompt_tokens": 50})
        for i in range(9)
    ]  # fmt: skip
    analysis = run_analysis([write_lines(tmp_path / "old.jsonl", lines)])
    assert analysis.census.total.classes["exact_repeat"] == 6
    assert analysis.census.without_prompt == 9
    assert analysis.replays["layered"].served["exact"] == 6
