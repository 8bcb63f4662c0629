"""Acceptance 3: a log whose system prompt starts with a timestamp gets a prefix-breaker finding
naming it; other varying values are named too; layouts that do not break reuse are left alone."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infercache.prefix_breakers import (
    BreakerFinder,
    classify,
    common_prefix_len,
    common_suffix_len,
)
from infercache.tokenizing.tokenizers import Chars4Tokenizer
from tests.analyze.conftest import RunAnalysis
from tests.analyze.generators import SUPPORT_SYSTEM, timestamped_support


def test_a_timestamp_at_the_start_of_the_system_prompt_is_named(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    gen = timestamped_support(seed=1, n=200)
    analysis = run_analysis([gen.write(tmp_path / "log.jsonl")], replay=False)
    [finding] = analysis.breakers
    assert (finding.kind, finding.role, finding.tenant) == ("timestamp", "system", "acme")
    assert finding.break_char < len("Current time: 2023-11-14T23:")
    distinct = {r["request"]["messages"][0]["content"] for r in gen.records}
    assert finding.requests == len(distinct) - 1  # every new variant after the first
    assert finding.requests > 150
    tail = Chars4Tokenizer().count(SUPPORT_SYSTEM)
    assert tail - 5 <= finding.tail_tokens <= tail + 5
    assert all(e.startswith("20") and "T" in e for e in finding.examples)
    # the prefix census sees the damage the finding explains
    total = analysis.census.total
    assert total.reused_tokens / total.prompt_tokens < 0.1
    assert (total.reused_tokens + finding.tokens_lost) / total.prompt_tokens > 0.8


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda rng, i: f"Request id req_{rng.getrandbits(40):010x}. ", "request id"),
        (lambda rng, i: f"Session {rng.getrandbits(32):08x}-1a2b-4c3d-8e9f-{i:012d}: ", "uuid"),
        (
            lambda rng, i: f"You are helping {rng.choice(['Alice', 'Bob', 'Chen', 'Dana'])}. ",
            "name",
        ),
        (lambda rng, i: f"Today is {rng.choice(['Monday', 'Tuesday', 'Friday'])}. ", "date"),
    ],
)
def test_other_varying_values_near_the_start_are_named(make: object, kind: str) -> None:
    rng = random.Random(0)
    finder = BreakerFinder(Chars4Tokenizer().count)
    texts = [make(rng, i) + SUPPORT_SYSTEM for i in range(30)]  # type: ignore[operator]
    for text in texts:
        finder.observe("ns", "t", "m", "system", text)
    [finding] = finder.findings()
    assert finding.kind == kind
    # A variant seen before is cached as it is: only new variants lose the shared tail.
    assert finding.requests == len(set(texts)) - 1


def test_varying_text_at_the_end_or_unrelated_prompts_are_not_breakers() -> None:
    finder = BreakerFinder(Chars4Tokenizer().count)
    for name in ("Alice", "Bob", "Chen"):
        finder.observe("ns", "t", "m", "system", f"{SUPPORT_SYSTEM}\nThe customer is {name}.")
    finder.observe("ns", "t", "m", "system", "You translate English to French. " * 20)
    finder.observe("ns", "t", "m", "system", "You write SQL for a Postgres database. " * 20)
    assert finder.findings() == []


def test_breaker_findings_reach_the_report_and_the_advice(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    from infercache.analyze.reports.document import build_report

    analysis = run_analysis([timestamped_support(seed=2, n=120).write(tmp_path / "l.jsonl")])
    report = build_report(analysis).to_dict()
    assert report["prefix_breakers"][0]["kind"] == "timestamp"
    assert "⟦" in report["prefix_breakers"][0]["context"]
    assert any("timestamp" in line for line in report["recommendation"]["advice"])
    [prefix] = [r for r in report["recommendation"]["reasons"] if r["strategy"] == "prefix"]
    assert not prefix["enable"]
    assert "moving the timestamp in the system message to the end" in prefix["text"]


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("2024-05-01T10:00:03Z", "timestamp"),
        ("10:00:03.", "timestamp"),
        ("1714557603", "timestamp"),
        ("2024-05-01", "date"),
        ("9f1c2b3a-1a2b-4c3d-8e9f-0123456789ab", "uuid"),
        ("ops@acme.example", "email"),
        ("req_8f3a2b1c", "request id"),
        ("#42", "number"),
        ("Alice", "name"),
        ("foo", "other"),
    ],
)
def test_varying_values_are_classified(text: str, kind: str) -> None:
    assert classify(text) == kind


@given(st.text("ab", max_size=12), st.text("ab", max_size=12))
def test_common_prefix_and_suffix_lengths_match_a_naive_count(a: str, b: str) -> None:
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    assert common_prefix_len(a, b) == p
    limit = min(len(a), len(b)) - p
    s = 0
    while s < limit and a[len(a) - 1 - s] == b[len(b) - 1 - s]:
        s += 1
    assert common_suffix_len(a, b, limit) == s
