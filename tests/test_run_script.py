"""`./run COMMAND` keeps the caller's directory: the README's serve, analyze and tune commands,
run from a directory outside the checkout, read and write the caller's files (issue 26 item 3).

`./run` installs into the checkout's `.venv` when its stamp (a hash of the pins, pyproject.toml
and `run` itself) is missing. These tests never install: they run a copy of `run` in a scratch
checkout whose `.venv` holds the stamp `run` computes for that copy and a `bin/infercache` that
starts this interpreter's infercache, and set `PYTHON=false`, so an install attempt fails at
once instead of installing anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.harness.processes import stop, wait_for_line
from tests.harness.servers import serve
from tests.harness.upstreams import FakeUpstream

REPO = Path(__file__).resolve().parents[1]
# The README's commands, as it gives them (serve with a relative SQLite store besides)
SERVE = ["--store", "sqlite:///cache.db", "--request-log", "requests.jsonl"]
ANALYZE = ["analyze", "requests.jsonl", "--format", "html", "--out", "report.html"]
ANALYZE += ["--price", "gpt-4o-mini=0.15,0.6,0.075"]
TUNE = "tune pairs.tsv --target-false-hit 0.01 --write-config semantic.toml --plot curves.png"
TUNE_ARGS = [*TUNE.split(), "--embedder", "static"]  # the paths are the point: a fast embedder


def scratch_checkout(root: Path, infercache: str) -> Path:
    """A copy of `run` and the files its stamp hashes, with a `.venv` already stamped whose
    `bin/infercache` is the script `infercache` (shell)."""
    checkout = root / "checkout"
    (checkout / "requirements").mkdir(parents=True)
    for name in ("run", "pyproject.toml", *(f"requirements/{p.name}" for p in _pins())):
        shutil.copy2(REPO / name, checkout / name)
    hashed = b"".join((checkout / "requirements" / p.name).read_bytes() for p in _pins())
    hashed += (checkout / "pyproject.toml").read_bytes() + (checkout / "run").read_bytes()
    bin_dir = checkout / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (checkout / ".venv" / f".installed-{hashlib.sha256(hashed).hexdigest()[:16]}").touch()
    exe = bin_dir / "infercache"
    exe.write_text(f"#!/bin/sh\n{infercache}\n", encoding="utf-8")
    exe.chmod(0o755)
    return checkout


def _pins() -> list[Path]:
    return sorted((REPO / "requirements").glob("*.txt"))  # as bash expands requirements/*.txt


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHON": "false", "HF_HUB_OFFLINE": "1"}


def test_run_passes_the_callers_directory_and_arguments_through(tmp_path: Path) -> None:
    checkout = scratch_checkout(tmp_path, 'pwd; printf "%s\\n" "$@"')
    caller = tmp_path / "elsewhere"
    caller.mkdir()
    args = ["analyze", "requests.jsonl", "--out", "report.html", "--price", "m=1,2"]
    done = subprocess.run(
        [str(checkout / "run"), *args], cwd=caller, capture_output=True, text=True, env=_env()
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(caller), *args]
    assert "installing" not in done.stderr  # the stamp held: nothing was installed


def test_a_changed_pin_would_install_and_this_test_would_see_it(tmp_path: Path) -> None:
    """The guard of the test above: a stamp that does not match makes `run` try to install,
    which PYTHON=false stops at once."""
    checkout = scratch_checkout(tmp_path, "echo ran")
    with (checkout / "pyproject.toml").open("a") as f:
        f.write("\n# changed\n")
    done = subprocess.run(
        [str(checkout / "run"), "--version"], capture_output=True, text=True, env=_env()
    )
    assert done.returncode != 0
    assert "installing into" in done.stderr
    assert "ran" not in done.stdout


def _pairs(path: Path) -> Path:
    """Near-duplicate and unrelated questions: enough negatives for a 1% bound."""
    words = [
        *("card", "payment", "transfer", "account", "balance", "refund", "fee", "limit"),
        *("password", "login", "phone", "address", "travel", "holiday", "weather", "music"),
        *("alarm", "timer", "recipe", "dinner", "flight"),
    ]
    rng = random.Random(5)
    lines = ["a\tb\tsame"]
    for _ in range(60):
        picked = rng.sample(words, 6)
        lines.append(f"{' '.join(picked)}\t{' '.join([*picked[:5], rng.choice(words)])}\t1")
    for _ in range(400):
        lines.append(f"{' '.join(rng.sample(words, 6))}\t{' '.join(rng.sample(words, 6))}\t0")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow  # the real commands: the analyzer loads the packaged MiniLM
def test_the_readmes_commands_from_another_directory_use_the_callers_files(
    tmp_path: Path,
) -> None:
    checkout = scratch_checkout(tmp_path, f'exec {sys.executable} -m infercache.cli "$@"')
    caller = tmp_path / "elsewhere"
    caller.mkdir()
    run = str(checkout / "run")
    env = {**_env(), "INFERCACHE_DATA_DIR": str(tmp_path / "data")}

    # ./run serve ... --request-log requests.jsonl (and a relative SQLite store)
    fake, port = FakeUpstream(), free_port()
    with serve(fake.app) as upstream:
        process = subprocess.Popen(
            [run, "serve", "--upstream", f"{upstream}/v1", "--port", str(port), *SERVE],
            cwd=caller,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert process.stdout is not None
            wait_for_line(process.stdout, "gateway ready", process)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}/v1", timeout=30) as client:
                for question in ("What is the capital of France?", "Reset my password") * 2:
                    chat = {"model": "gpt-4o-mini", "temperature": 0}
                    chat["messages"] = [{"role": "user", "content": question}]
                    assert client.post("/chat/completions", json=chat).status_code == 200
        finally:
            stop(process)
    assert len((caller / "requests.jsonl").read_text().splitlines()) == 4
    assert (caller / "cache.db").is_file()

    # ./run analyze requests.jsonl --format html --out report.html --price gpt-4o-mini=...
    done = _ran([run, *ANALYZE], caller, env)
    assert "<html" in (caller / "report.html").read_text(encoding="utf-8").lower()
    assert "\r" not in done.stderr  # no progress bar off a terminal (progress_bars.py)

    # ./run tune pairs.tsv --target-false-hit 0.01 --write-config semantic.toml --plot curves.png
    _pairs(caller / "pairs.tsv")
    done = _ran([run, *TUNE_ARGS, "--format", "json"], caller, env)
    assert json.loads(done.stdout)["pairs"] == 460
    assert "\r" not in done.stderr
    assert "threshold" in (caller / "semantic.toml").read_text(encoding="utf-8")
    assert (caller / "curves.png").read_bytes()[:4] == b"\x89PNG"
    leftovers = {"requests.jsonl", "report.html", "semantic.toml", "curves.png", "cache.db"}
    assert not leftovers & {p.name for p in checkout.iterdir()}  # nothing written there


def _ran(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`args` run to the end in `cwd`; their output, once they exited 0."""
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done
