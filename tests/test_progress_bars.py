"""Third-party progress bars (transformers, huggingface_hub, tqdm) only on a terminal: off a
terminal they would write `\\r`-joined lines into logs (progress_bars.py; issue 26 item 8;
the real `tune` and `analyze` off a terminal: tests/test_run_script.py)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from infercache.progress_bars import OFF, quiet_off_terminal


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_the_bars_are_turned_off_and_a_users_choice_is_kept() -> None:
    environ: dict[str, str] = {"TQDM_DISABLE": "0"}
    assert quiet_off_terminal(io.StringIO(), environ)
    assert environ == {**OFF, "TQDM_DISABLE": "0"}
    on_terminal: dict[str, str] = {}
    assert not quiet_off_terminal(_Terminal(), on_terminal)
    assert on_terminal == {}


def test_a_transformers_bar_writes_nothing_into_a_piped_stderr() -> None:
    script = (
        "import os, sys\n"
        "from infercache.progress_bars import quiet_off_terminal\n"
        "quiet_off_terminal(sys.stderr, os.environ)\n"
        "from transformers.utils.logging import tqdm\n"
        "for _ in tqdm(range(50), desc='Loading weights'): pass\n"
        "from tqdm import tqdm as plain\n"
        "for _ in plain(range(50), desc='another library'): pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in OFF}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Loading weights" not in done.stderr
    assert "\r" not in done.stderr
