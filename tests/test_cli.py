"""The `infercache` command line as a user meets it: `--version`, a sub-command's own usage on a
bad flag, `./run` without arguments printing clean usage, progress bars on `tune` and `tune
eval`, and `tune eval --target P` failing a result above P. (`stats`, `purge` and `invalidate`
on a store that does not exist: tests/test_cli_cache.py.)"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import pty
import subprocess
import threading
from pathlib import Path

import pytest

from infercache.cli import build_parser, main
from tests.harness.processes import infercache_exe
from tests.harness.vocabulary import WORDS, write_pairs

REPO = Path(__file__).resolve().parents[1]


def commands() -> list[str]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert (
        capsys.readouterr().out.strip() == f"infercache {importlib.metadata.version('infercache')}"
    )


def test_every_command_is_registered() -> None:
    assert {"serve", "stats", "invalidate", "set-model-version", "purge", "tune", "analyze"} <= set(
        commands()
    )


@pytest.mark.parametrize("command", commands())
def test_a_bad_flag_shows_the_commands_own_usage(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--no-such-flag"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: infercache [-h]" not in err  # not the top-level usage
    assert f"infercache {command}" in err.split("\n", 1)[0]  # the command's usage line
    assert f"infercache {command}: error:" in err


def test_serve_names_the_bad_flag_under_its_own_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--bogus"])
    err = capsys.readouterr().err
    assert err.startswith("usage: infercache serve")
    assert "infercache serve: error: unrecognized arguments: --bogus" in err


def test_a_good_command_line_still_parses() -> None:
    args = build_parser().parse_args(["stats", "--store", "memory://", "--model", "m"])
    assert (args.command, args.store, args.model) == ("stats", "memory://", ["m"])


def test_run_without_arguments_prints_clean_usage() -> None:
    done = subprocess.run(
        ["bash", str(REPO / "run")], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0].startswith("usage: ./run test")
    assert all(not line.startswith(("#", "set ", "here=")) for line in lines)
    assert any("./run COMMAND [ARGS...]" in line for line in lines)


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 near-duplicate positives and 80 unrelated negatives over a small vocabulary."""
    path = tmp_path_factory.mktemp("pairs") / "pairs.tsv"
    return write_pairs(path, positives=40, negatives=80, seed=7, words=WORDS[:21])


def on_a_terminal(*argv: str) -> tuple[int, str, str]:
    """`infercache ARGV...` with stderr on a pseudo-terminal, as at a user's shell: (exit
    status, stdout, what the terminal showed)."""
    master, slave = pty.openpty()
    shown: list[bytes] = []

    def read() -> None:  # drains the terminal while the process runs, so it never blocks
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the process side closed
                return
            if not data:
                return
            shown.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        done = subprocess.run(
            [infercache_exe(), *argv],
            stdout=subprocess.PIPE,
            stderr=slave,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "100"},
        )
    finally:
        os.close(slave)
        reader.join(30)
        os.close(master)
    return done.returncode, done.stdout, b"".join(shown).decode(errors="replace")


@pytest.mark.parametrize(
    "form",
    [
        ["tune", "{file}", "--target-false-hit", "0.2"],
        ["tune", "eval", "{file}", "--threshold", "0.7"],
    ],
)
def test_tune_and_tune_eval_show_a_progress_bar_on_a_terminal(
    form: list[str], pairs_file: Path
) -> None:
    argv = [a.format(file=pairs_file) for a in form]
    code, out, shown = on_a_terminal(*argv, "--embedder", "static", "--format", "json")
    assert code == 0, shown
    assert "embedding texts" in shown
    assert "100%" in shown
    assert json.loads(out)["pairs"] == 120  # stdout is the report alone


def test_no_progress_bar_when_stderr_is_not_a_terminal(
    pairs_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["tune", "eval", str(pairs_file), "--threshold", "0.7", "--embedder", "static"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith("threshold ")


def test_tune_eval_target_marks_a_result_above_it_and_exits_non_zero(
    pairs_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["tune", "eval", str(pairs_file), "--threshold", "0.6", "--embedder", "static"]
    assert main([*argv, "--format", "json"]) == 0  # no target: nothing to hold
    report = json.loads(capsys.readouterr().out)
    assert "above_target" not in report
    upper = report["false_hit_upper"]
    assert 0.05 < upper < 0.95

    assert main([*argv, "--target", f"{upper / 2:.4f}", "--format", "json"]) == 1
    above = json.loads(capsys.readouterr().out)
    assert (above["above_target"], above["target_false_hit"]) == (True, round(upper / 2, 4))
    assert main([*argv, "--target", f"{upper / 2:.4f}"]) == 1
    assert "ABOVE TARGET" in capsys.readouterr().out

    assert main([*argv, "--target", f"{min(0.99, upper + 0.01):.4f}"]) == 0
    assert "within target" in capsys.readouterr().out


def test_target_belongs_to_tune_eval(pairs_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", str(pairs_file), "--embedder", "static", "--target", "0.1"]) == 2
    assert "--target belongs to `infercache tune eval`" in capsys.readouterr().err
    assert main(["tune", "eval", str(pairs_file), "--threshold", "0.5", "--target", "2"]) == 2
    assert "--target must lie in (0, 1)" in capsys.readouterr().err
