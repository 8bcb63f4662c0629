"""`infercache tune` and `infercache tune eval`, end to end through `infercache.cli.main`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from infercache.cli import main
from infercache.semantic.embedder import StaticEmbedder
from infercache.semantic.guards import default_guards
from infercache.semantic.tuning.calibrate import evaluate, score_pairs
from infercache.semantic.tuning.pairs import read_pairs
from tests.harness.vocabulary import write_pairs
from tests.semantic.conftest import HARD_CASES


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 near-duplicate positives and 240 unrelated negatives, as a TSV."""
    path = tmp_path_factory.mktemp("pairs") / "pairs.tsv"
    return write_pairs(path, positives=120, negatives=240, seed=3)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tune_prints_json_writes_a_toml_config_and_a_plot(
    tmp_path: Path, pairs_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, png = tmp_path / "semantic.toml", tmp_path / "curve.png"
    code, out, err = run(
        capsys, "tune", str(pairs_file), "--embedder", "static", "--target-false-hit", "0.05",
        "--format", "json", "--write-config", str(config), "--plot", str(png),
    )  # fmt: skip
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert (report["pairs"], report["positives"], report["negatives"]) == (360, 120, 240)
    assert report["false_hit_upper"] <= 0.05
    assert 0.0 < report["hit_rate"] <= 1.0
    assert report["embedder"] == "static"
    assert report["guards"] == [g.name for g in default_guards()]
    settings = tomllib.loads(config.read_text())["semantic"]
    on = settings.pop("calibrated_on")
    assert str(pairs_file) in on
    assert "360 pairs" in on
    assert "95% upper bound" in on
    assert settings.pop("floor", None) == report["floor"]
    assert settings == {
        "threshold": report["threshold"],
        "embedder": "static",
        "embedder_name": StaticEmbedder().name,
        "target_false_hit": 0.05,
        "guards": report["guards"],
    }
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_tune_eval_reports_the_figures_at_a_given_threshold(
    pairs_file: Path, capsys: pytest.CaptureFixture[str], static_embedder: StaticEmbedder
) -> None:
    code, out, _ = run(
        capsys, "tune", "eval", str(pairs_file), "--threshold", "0.6", "--embedder", "static",
        "--format", "json",
    )  # fmt: skip
    assert code == 0
    report = json.loads(out)
    expected = evaluate(
        score_pairs(read_pairs(pairs_file), static_embedder), 0.6, guards=default_guards()
    )
    assert {k: report[k] for k in ("pairs", "positives", "negatives", "threshold")} == {
        "pairs": 360,
        "positives": 120,
        "negatives": 240,
        "threshold": 0.6,
    }
    assert report["false_hit_rate"] == expected.false_hit_rate
    assert report["hit_rate"] == expected.hit_rate


def test_tune_text_output_names_threshold_rates_and_guards(
    pairs_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        capsys, "tune", str(pairs_file), "--embedder", "static", "--target-false-hit", "0.05",
        "--guards", "none",
    )  # fmt: skip
    assert code == 0
    lines = out.splitlines()
    assert [line[:16].strip() for line in lines] == [
        "threshold", "false-hit rate", "hit rate", "pairs", "guards", "embedder",
    ]  # fmt: skip
    assert "of 240 negatives accepted; 95% upper bound" in lines[1]
    assert "of 120 positives accepted" in lines[2]
    assert lines[3].split() == ["pairs", "360"]
    assert lines[4].split() == ["guards", "none"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["tune", "eval", "{pairs}", "--embedder", "static"], "needs --threshold X or --config"),
        (["tune", "eval", "--threshold", "0.5"], "needs at least one PAIRS file"),
        (
            ["tune", "{pairs}", "--threshold", "0.5"],
            "--threshold and --config belong to `infercache tune eval`",
        ),
        (
            ["tune", "eval", "{pairs}", "--threshold", "0.5", "--write-config", "x.toml"],
            "belong to `infercache tune`",
        ),
        (["tune", "{pairs}", "--embedder", "static"], "240 negative pairs cannot show"),
        (["tune", "{pairs}", "--embedder", "static", "--guards", "colours"], "'colours'"),
        (["tune", "{missing}", "--embedder", "static"], "missing.tsv: cannot read"),
        (
            [
                "tune",
                "{pairs}",
                "--embedder",
                "static",
                "--target-false-hit",
                "0.05",
                "--plot",
                "{missing}/no/such/dir/plot.png",
            ],
            "cannot write the plot",
        ),
    ],
)
def test_misuse_exits_2_with_a_one_line_message(
    tmp_path: Path,
    pairs_file: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    filled = [a.format(pairs=pairs_file, missing=tmp_path / "missing.tsv") for a in argv]
    code, out, err = run(capsys, *filled)
    assert code == 2
    assert out == ""
    assert err.startswith("infercache tune: error: ")
    assert message in err
    assert err.count("\n") == 1


def test_help_shows_both_forms(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["tune", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "infercache tune PAIRS..." in out
    assert "infercache tune eval PAIRS..." in out


@pytest.mark.slow
def test_tune_with_the_default_minilm_embedder_and_every_guard_on_the_hard_cases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    every_guard = "numbers,dates,currencies,negation,entities:conflict"
    code, out, err = run(capsys, "tune", str(HARD_CASES), "--target-false-hit", "0.1",
                         "--format", "json", "--threads", "2", "--guards", every_guard,
                         "--ood", "none")  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert "all-MiniLM-L6-v2" in report["embedder_name"]
    # Every hard negative is vetoed and no floor is measured (--ood none), so nothing holds the
    # threshold up: it drops to the lowest similarity and every pair reaches the guards. The
    # one positive lost is the known negation-guard cost (see test_guards).
    assert report["false_hits"] == 0
    assert report["guard_vetoes"] == report["negatives"] + 1
    assert report["hits"] == report["positives"] - 1
