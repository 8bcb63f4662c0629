"""`infercache analyze` end to end through its argparse registration: the JSON contract,
malformed and unreadable inputs (acceptance 5), where the semantic threshold comes from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infercache.analyze.cli import parse_capacity, parse_size
from infercache.errors import ConfigError
from infercache.semantic.embedder import StaticEmbedder
from tests.analyze.generators import support_bot, write_lines
from tests.harness.cli import run_analyze


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    """The JSON report; near-duplicates off unless asked for (the packaged calibration loads
    MiniLM: tests/analyze/test_default_matcher.py runs it)."""
    if not any(a.startswith(("--semantic", "--config", "--no-semantic")) for a in argv):
        argv = (*argv, "--no-semantic")
    assert run_analyze(*argv, "--format", "json", "--tokenizer", "chars4") == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


@pytest.fixture
def support_log(tmp_path: Path) -> Path:
    return support_bot(seed=13, n=300).write(tmp_path / "support.jsonl")


def test_json_report_has_the_promised_keys(
    support_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = run_json(capsys, str(support_log), "--price", "gpt-4o-mini=0.15,0.6,0.075")
    assert report["requests"] == 300
    census = report["census"]
    assert set(census) == {"exact_repeat", "near_duplicate", "shared_prefix", "unique"}
    assert sum(census.values()) == pytest.approx(1.0)
    assert 0.9 < report["prefix_token_share"] <= 1.0
    assert set(report["simulation"]) == {"exact", "semantic", "prefix", "layered"}
    assert report["simulation"]["exact"]["money_saved_usd"] > 0
    rec = report["recommendation"]
    assert rec["strategies"] == ["exact", "prefix"]
    assert [r["strategy"] for r in rec["reasons"]] == ["exact", "semantic", "prefix"]
    assert report["sweeps"] is None  # json: only with --sweep
    assert report["near_duplicates"] == {"measured": False, "reason": "turned off (--no-semantic)"}
    assert report["settings"]["tokenizer"] == "chars4"
    assert report["settings"]["capacity"]["prefix_tokens"] is None  # unbounded unless given
    assert report["kv_sweep"]["knee"]["budget_tokens"] > 0
    assert report["cost_model"]["models"]["gpt-4o-mini"]["rates"] == "provider"


def test_malformed_lines_are_reported_with_line_numbers_and_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [json.dumps(r) for r in support_bot(seed=2, n=20).records]
    log = write_lines(tmp_path / "log.jsonl", [*good[:5], "{oops", *good[5:], "42"])
    report = run_json(capsys, str(log))
    assert report["requests"] == 20
    malformed = report["inputs"]["malformed"]
    assert malformed["count"] == 2
    assert [m["line"] for m in malformed["lines"]] == [6, 22]
    # stderr names them too (the JSON went to stdout, already read)
    assert run_analyze(str(log), "--tokenizer", "chars4", "--format", "json") == 0
    err = capsys.readouterr().err
    assert f"skipped {log}:6: not JSON" in err
    assert f"skipped {log}:22: a line must be a JSON object" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"", "is empty"), (b"garbage\n{}\n", "no request could be read")],
    ids=["empty", "nothing-parses"],
)
def test_an_empty_or_useless_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    log = tmp_path / "log.jsonl"
    log.write_bytes(content)
    assert run_analyze(str(log), "--tokenizer", "chars4") == 2
    err = capsys.readouterr().err
    assert err.startswith("infercache analyze: error: ")
    assert message in err
    assert str(log) in err


def test_an_unreadable_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_analyze(str(tmp_path / "missing.jsonl")) == 2
    assert "cannot read log" in capsys.readouterr().err


def test_the_threshold_can_come_from_a_tune_config(
    support_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "semantic.toml"
    name = StaticEmbedder().name
    config.write_text(  # what `infercache tune --write-config` writes
        f'[semantic]\nthreshold = 0.93\nembedder = "static"\nembedder_name = "{name}"\n'
        'target_false_hit = 0.01\nguards = ["numbers", "dates"]\n'
    )
    report = run_json(capsys, str(support_log), "--config", str(config))
    semantic = report["near_duplicates"]
    assert semantic["measured"] is True
    assert semantic["threshold"] == 0.93
    assert str(config) in semantic["threshold_source"]
    assert semantic["guards"] == ["numbers", "dates"]
    assert semantic["texts_embedded"] > 0
    assert semantic["replayed"] is True
    assert semantic["label"] is None  # the user's calibration, not the public one
    assert report["simulation"]["semantic"]["available"] is True


def test_an_explicit_threshold_wins_and_no_semantic_turns_it_off(
    support_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flag = run_json(
        capsys, str(support_log), "--semantic-threshold", "0.97", "--embedder", "static"
    )
    near = flag["near_duplicates"]
    assert (near["threshold"], near["threshold_source"]) == (0.97, "--semantic-threshold")
    off = run_json(capsys, str(support_log), "--no-semantic")
    assert off["near_duplicates"] == {"measured": False, "reason": "turned off (--no-semantic)"}


def test_text_and_html_outputs(
    support_log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_analyze(str(support_log), "--tokenizer", "chars4", "--no-semantic") == 0
    text = capsys.readouterr().out
    assert "Census" in text
    assert "Recommendation: exact → prefix" in text
    assert "tokenizer: chars4" in text
    assert "near-duplicate calibration: none" in text
    out = tmp_path / "report.txt"
    assert (
        run_analyze(str(support_log), "--tokenizer", "chars4", "--no-semantic", "--out", str(out))
        == 0
    )
    assert "\x1b[" not in out.read_text()  # no colour codes in a file


def test_sizes_and_capacities_parse_with_units() -> None:
    assert parse_size("20000") == (20000, False)
    assert parse_size("2k") == (2000, False)
    assert parse_size("1GiB") == (2**30, True)
    assert parse_size("1.5MB") == (1_500_000, True)
    assert parse_capacity(["exact=2MiB,prefix=1000", "semantic=50"], 46080) == {
        "exact": 2 * 2**20,
        "prefix": 1000,
        "semantic": 50,
    }
    assert parse_capacity(["prefix=45MiB"], 46080) == {"prefix": 45 * 2**20 // 46080}
    with pytest.raises(ConfigError, match="expected exact=SIZE"):
        parse_capacity(["disk=1G"], 1)
    with pytest.raises(ConfigError, match="bad size"):
        parse_size("lots")
