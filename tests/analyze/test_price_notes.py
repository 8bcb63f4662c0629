"""A price given for another model than the log's is said as such, not as "no prices given"
(analyze/reports/notes.py; issue 26 item 7): the README's `--price gpt-4o-mini=...` on a log
of the built-in model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infercache.cli import main

MODEL = "SmolLM2-135M-Instruct"


def _log(path: Path) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for i in range(12):
            body = {
                "model": MODEL,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"question {i % 4}"}],
            }
            f.write(json.dumps({"timestamp": 1_700_000_000 + i, "request": body}) + "\n")
    return path


def _report(capsys: pytest.CaptureFixture[str], log: Path, *prices: str) -> dict[str, Any]:
    argv = ["analyze", str(log), "--format", "json", "--tokenizer", "chars4", "--no-semantic"]
    for price in prices:
        argv += ["--price", price]
    assert main(argv) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def _money_notes(report: dict[str, Any]) -> list[str]:
    return [n for n in report["notes"] if "money figures are 0" in n]


def test_a_price_for_another_model_names_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _report(capsys, _log(tmp_path / "log.jsonl"), "gpt-4o-mini=0.15,0.6,0.075")
    (note,) = _money_notes(report)
    assert note.startswith(f"prices given for gpt-4o-mini, but the log's requests are for {MODEL}")
    assert "no prices given" not in note


def test_no_price_at_all_says_so_and_a_star_price_prices_every_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _log(tmp_path / "log.jsonl")
    (note,) = _money_notes(_report(capsys, log))
    assert note.startswith("no prices given")
    assert _money_notes(_report(capsys, log, "*=0.15,0.6,0.075")) == []
