"""The provider prompt cache section of `infercache analyze` on written logs (issue 25 item 3):
sums per upstream, a row per model where an upstream's models are priced differently, the
same figures through the reader process, an older log without the fields, a bad field. The
gateway end of it (the log a real gateway writes, the figures `/stats` shows for the same
traffic) is tests/hosted/test_prompt_cache_analyzed.py."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from infercache.analyze.report_json import from_json
from infercache.analyze.report_tree import Figures
from tests.analyze.generators import support_bot, write_lines
from tests.harness.cli import run_analyze

# USD per 1M tokens: input, output, cached input, cache write
SONNET = (3.0, 15.0, 0.3, 3.75)
HAIKU = (1.0, 5.0, 0.1, 1.25)
MINI = (0.4, 1.6, 0.1)  # no write price: writes cost what input costs
PRICES = {"claude-sonnet-4-5": SONNET, "claude-haiku-4-5": HAIKU, "gpt-4.1-mini": MINI}
CLAUDE, OPENAI = "https://claude.example/v1", "https://openai.example/v1"
PAIRS = [(CLAUDE, "claude-sonnet-4-5"), (CLAUDE, "claude-haiku-4-5"), (OPENAI, "gpt-4.1-mini")]


def price_flags() -> list[str]:
    return [
        flag
        for model, p in PRICES.items()
        for flag in ("--price", f"{model}={','.join(f'{v:g}' for v in p)}")
    ]


def logged(seed: int, n: int) -> list[dict[str, Any]]:
    """Support-bot records, each third a hit (no upstream call), the rest an upstream call
    to one of three (upstream, model) pairs with seeded usage."""
    rng = random.Random(seed)
    out = []
    for i, record in enumerate(support_bot(seed=seed, n=n).records):
        if i % 3:
            upstream, model = rng.choice(PAIRS)
            read, write, rest = rng.randrange(0, 4000), rng.randrange(0, 3000), rng.randrange(50)
            usage = {"input_tokens": read + write + rest, "read_tokens": read,
                     "write_tokens": write}  # fmt: skip
            record = {**record, "upstream": upstream, "prompt_cache": {"model": model, **usage}}
        out.append(record)
    return out


def expected(records: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """The sums per (upstream, model), priced by hand from the price list."""
    sums: dict[tuple[str, str], dict[str, float]] = {}
    for r in records:
        if "prompt_cache" not in r:
            continue
        usage = r["prompt_cache"]
        inp, _, cached, *write = PRICES[usage["model"]]
        row = sums.setdefault((r["upstream"], usage["model"]), dict.fromkeys(
            ("requests", "input_tokens", "read_tokens", "write_tokens", "saved", "premium"), 0.0
        ))  # fmt: skip
        row["requests"] += 1
        for name in ("input_tokens", "read_tokens", "write_tokens"):
            row[name] += usage[name]
        row["saved"] += usage["read_tokens"] * (inp - cached) / 1e6
        row["premium"] += usage["write_tokens"] * ((write[0] if write else inp) - inp) / 1e6
    return sums


def analyzed(capsys: pytest.CaptureFixture[str], log: Path, *extra: str) -> dict[str, Any]:
    argv = [str(log), "--format", "json", "--tokenizer", "chars4", "--no-semantic", *extra]
    assert run_analyze(*argv) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def check_row(row: dict[str, Any], want: dict[str, float]) -> None:
    for name in ("requests", "input_tokens", "read_tokens", "write_tokens"):
        assert row[name] == want[name], name
    assert row["read_rate"] == pytest.approx(want["read_tokens"] / want["input_tokens"])
    assert row["saved_usd"] == pytest.approx(want["saved"])
    assert row["write_premium_usd"] == pytest.approx(want["premium"])
    assert row["net_usd"] == pytest.approx(want["saved"] - want["premium"])
    assert ("alarm" in row) == (row["net_usd"] < 0)


@pytest.mark.parametrize("parallel", [False, True], ids=["in-process", "reader-process"])
def test_sums_per_upstream_and_per_model_where_prices_differ(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], parallel: bool
) -> None:
    records = logged(seed=5, n=120)
    log = write_lines(tmp_path / "log.jsonl", (json.dumps(r) for r in records))
    flags = ["--parallel"] if parallel else ["--no-parallel"]
    report = analyzed(capsys, log, *price_flags(), *flags)
    section = report["provider_prompt_cache"]
    want = expected(records)
    assert set(section["upstreams"]) == {CLAUDE, OPENAI}
    claude = section["upstreams"][CLAUDE]
    # two models priced differently: a row each, and the upstream's total
    assert set(claude["models"]) == {"claude-sonnet-4-5", "claude-haiku-4-5"}
    for model, row in claude["models"].items():
        check_row(row, want[(CLAUDE, model)])
    total = {k: want[(CLAUDE, "claude-sonnet-4-5")][k] + want[(CLAUDE, "claude-haiku-4-5")][k]
             for k in want[(CLAUDE, "claude-sonnet-4-5")]}  # fmt: skip
    check_row(claude["total"], total)
    # one model: its total only; writes cost nothing extra without a write price
    assert section["upstreams"][OPENAI]["models"] == {}
    check_row(section["upstreams"][OPENAI]["total"], want[(OPENAI, "gpt-4.1-mini")])
    assert section["upstreams"][OPENAI]["total"]["write_premium_usd"] == 0
    assert section["unpriced_models"] == []
    assert from_json(Figures, report).provider_prompt_cache is not None  # read back whole


def test_a_loss_is_shown_with_its_alarm_and_unpriced_models_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = support_bot(seed=3, n=10).records
    usage = {"model": "claude-sonnet-4-5", "input_tokens": 5000, "read_tokens": 0,
             "write_tokens": 4000}  # fmt: skip
    other = {"model": "mystery-model", "input_tokens": 100, "read_tokens": 90, "write_tokens": 0}
    lines = [{**records[0], "upstream": CLAUDE, "prompt_cache": usage},
             {**records[1], "upstream": OPENAI, "prompt_cache": other}, *records[2:]]  # fmt: skip
    log = write_lines(tmp_path / "log.jsonl", (json.dumps(r) for r in lines))
    section = analyzed(capsys, log, *price_flags())["provider_prompt_cache"]
    row = section["upstreams"][CLAUDE]["total"]
    assert row["net_usd"] == pytest.approx(-4000 * 0.75e-6)
    assert row["alarm"] == (
        "alert: the provider's prompt cache cost $0.0030 more than it saved (4,000 tokens "
        "written at a premium, 0 read back): its writes are not read back within the cache's "
        "lifetime; look for a prefix breaker (a varying value ahead of the shared prompt), "
        "breakpoints the client marks on prompts asked once (try `--anthropic-breakpoints "
        "strip` or `inject`), or traffic too sparse for the cache's lifetime"
    )
    assert section["unpriced_models"] == ["mystery-model"]
    assert section["upstreams"][OPENAI]["total"]["net_usd"] == 0
    argv = [str(log), "--tokenizer", "chars4", "--no-semantic", *price_flags()]
    assert run_analyze(*argv) == 0
    text = capsys.readouterr().out
    assert "-$0.0030 (loss)" in text
    assert f"alarm: {CLAUDE}: alert: the provider's prompt cache cost $0.0030" in text
    assert "no cached-input or cache-write price for mystery-model" in text


def test_an_older_log_without_the_fields_has_no_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = support_bot(seed=2, n=30).write(tmp_path / "old.jsonl")
    report = analyzed(capsys, log)
    assert report["provider_prompt_cache"] is None
    assert report["requests"] == 30
    assert run_analyze(str(log), "--tokenizer", "chars4", "--no-semantic") == 0
    assert "Provider prompt cache" not in capsys.readouterr().out


def test_a_bad_prompt_cache_field_is_a_malformed_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = support_bot(seed=4, n=5).records
    bad = {"model": "m", "input_tokens": "many", "read_tokens": 0, "write_tokens": 0}
    lines = [{**records[0], "upstream": CLAUDE, "prompt_cache": bad}, *records[1:]]
    log = write_lines(tmp_path / "log.jsonl", (json.dumps(r) for r in lines))
    report = analyzed(capsys, log)
    assert report["requests"] == 4
    (line,) = report["inputs"]["malformed"]["lines"]
    assert line["line"] == 1
    assert "input_tokens must be a non-negative integer" in line["error"]
    assert report["provider_prompt_cache"] is None


def test_a_price_takes_at_most_four_figures(tmp_path: Path) -> None:
    log = support_bot(seed=2, n=5).write(tmp_path / "log.jsonl")
    assert run_analyze(str(log), "--tokenizer", "chars4", "--price", "m=1,2,0.5,1.25,9") == 2


def test_a_redacted_log_carries_the_section_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`serve --redact` writes no text, but the counts: the section reads the same."""
    usage = {"model": "claude-sonnet-4-5", "input_tokens": 3000, "read_tokens": 2900,
             "write_tokens": 0}  # fmt: skip
    common = {"tenant": "t", "model": "claude-sonnet-4-5", "layer": "miss", "status": 200,
              "prefix_chunk_tokens": [2900, 100], "upstream": CLAUDE,
              "prompt_cache": usage}  # fmt: skip
    lines = [
        {**common, "timestamp": float(i), "key_digest": f"d{i}", "prefix_hashes": [7, 100 + i]}
        for i in range(3)
    ]
    log = write_lines(tmp_path / "redacted.jsonl", (json.dumps(r) for r in lines))
    report = analyzed(capsys, log, *price_flags())
    assert report["inputs"]["formats"] == {"redacted": 3}
    row = report["provider_prompt_cache"]["upstreams"][CLAUDE]["total"]
    assert (row["requests"], row["read_tokens"]) == (3, 3 * 2900)
    assert row["net_usd"] == pytest.approx(3 * 2900 * 2.7e-6)
