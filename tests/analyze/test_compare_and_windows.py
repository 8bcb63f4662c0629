"""Issue 10, item 6: revisit when the product changes. `--by day|hour` gives the census and the
replayed hit rates per window; `--compare OLD NEW` says which recommendation changed and why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infercache.analyze.reports.document import build_report
from tests.analyze.conftest import RunAnalysis
from tests.analyze.generators import (
    Generated,
    support_bot,
    timestamped_system,
    write_lines,
)
from tests.harness.cli import run_analyze

HOUR = 3600.0
START = 1_700_000_000.0 - 1_700_000_000.0 % HOUR  # on the hour


def changed_day() -> Generated:
    """Three hours of the support bot, then three hours after a release that put the time at
    the head of its system prompt."""
    before = support_bot(seed=41, n=540, start_s=START)  # ~20 s apart: ~3 hours
    after = support_bot(seed=42, n=540, start_s=START + 3 * HOUR, system=timestamped_system)
    before_records = [r for r in before.records if r["timestamp"] < START + 3 * HOUR]
    after_records = [r for r in after.records if r["timestamp"] < START + 6 * HOUR]
    return Generated(before_records + after_records, before.truth)


def test_by_hour_gives_the_census_and_hit_rates_per_window(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    gen = changed_day()
    report = build_report(run_analysis([gen.write(tmp_path / "log.jsonl")], by="hour")).to_dict()
    rows = report["windows"]["rows"]
    assert [r["start_s"] for r in rows] == [START + i * HOUR for i in range(6)]
    assert sum(r["requests"] for r in rows) == report["requests"] == len(gen.records)
    for row in rows:
        in_window = [
            r for r in gen.records if row["start_s"] <= r["timestamp"] < row["start_s"] + HOUR
        ]
        assert row["requests"] == len(in_window)
        assert sum(row["census"].values()) == pytest.approx(1.0)
        assert row["exact_hit_rate"] is not None
    early, late = rows[:3], rows[3:]
    assert min(r["prefix_token_share"] for r in early) > 0.8
    assert max(r["prefix_token_share"] for r in late) < 0.2  # the timestamp broke reuse
    assert max(r["prefix_token_hit_rate"] for r in late) < 0.2
    assert min(r["exact_hit_rate"] for r in early[1:]) > 0.2
    assert max(r["exact_hit_rate"] for r in late) < 0.05  # prompts now unique to the second


def test_compare_says_which_recommendation_changed_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = support_bot(seed=43, n=400)
    after = support_bot(seed=44, n=400, system=timestamped_system)
    common = ["--tokenizer", "chars4", "--no-semantic"]
    old_report = tmp_path / "old.json"
    assert run_analyze(str(before.write(tmp_path / "old.jsonl")), "--format", "json",
                   "--out", str(old_report), *common) == 0  # fmt: skip
    new_log = after.write(tmp_path / "new.jsonl")
    # one side a report written earlier, the other a log analysed now
    assert run_analyze("--compare", str(old_report), str(new_log), "--format", "json", *common) == 0
    comparison = json.loads(capsys.readouterr().out)
    assert (comparison["old_layering"], comparison["new_layering"]) == ("exact → prefix", "none")
    changes = {c["strategy"]: c for c in comparison["strategies"]}
    assert changes["prefix"]["changed"] is True
    assert (changes["prefix"]["old_enable"], changes["prefix"]["new_enable"]) == (True, False)
    assert "fix the layout first" in changes["prefix"]["new_reason"]
    figures = {f["path"]: f for f in changes["prefix"]["figures"]}
    share = figures["prefix_token_share"]
    assert share["old"] > 0.9 > 0.1 > share["new"]
    assert changes["exact"]["changed"] is True
    assert changes["semantic"]["changed"] is False
    assert run_analyze("--compare", str(old_report), str(new_log), *common) == 0
    text = capsys.readouterr().out
    assert "Recommendation: exact → prefix → none" in text
    assert "prefix: on → off" in text
    assert "prefix_token_share: " in text


def test_compare_needs_two_sides_and_no_logs_besides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_lines(tmp_path / "a.jsonl", ["{}"])
    assert run_analyze(str(log), "--compare", str(log), str(log)) == 2
    assert "not both" in capsys.readouterr().err
    assert run_analyze() == 2
    assert "no log file given" in capsys.readouterr().err
