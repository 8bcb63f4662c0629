"""The `infercache` command line as a user meets it: `--version`, a sub-command's own usage on a
bad flag, and `./run` without arguments printing clean usage."""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
from pathlib import Path

import pytest

from infercache.cli import build_parser, main

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
