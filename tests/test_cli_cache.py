"""`infercache stats | invalidate | set-model-version | purge` act on a shared store."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infercache.cache import Cache, Layer
from infercache.cli import main
from infercache.clock import ManualClock
from infercache.settings import Settings
from tests.conftest import CountingUpstream, chat


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("infercache", path=str(Path(sys.executable).parent))
    assert exe is not None, "the infercache entry point is not installed in this venv"
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, check=False)


def test_another_process_invalidates_and_swaps_versions_of_a_shared_sqlite_store(
    tmp_path: Path, clock: ManualClock, upstream: CountingUpstream
) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    cache = Cache(Settings(data_dir=tmp_path, store_url=url), clock=clock)
    tagged, other = chat("t", infercache={"tags": ["kb"]}), chat("o", model="m2")
    cache.complete(tagged, upstream)
    cache.complete(other, upstream)

    done = cli("invalidate", "--tag", "kb", "--store", url)
    assert done.returncode == 0, done.stderr
    assert cache.complete(tagged, upstream).layer == Layer.MISS
    assert cache.complete(other, upstream).layer == Layer.EXACT

    done = cli("set-model-version", "m2", "v9", "--store", url)
    assert done.returncode == 0, done.stderr
    assert cache.complete(other, upstream).layer == Layer.MISS

    stats = cli("stats", "--store", url, "--model", "m2")
    assert json.loads(stats.stdout)["model_versions"] == {"m2": "v9"}
    assert json.loads(stats.stdout)["entries"] == 2

    assert cli("purge", "--store", url).returncode == 0
    assert cache.complete(tagged, upstream).layer == Layer.MISS
    cache.close()


@pytest.mark.parametrize("command", ["stats", "invalidate", "set-model-version", "purge"])
def test_every_command_has_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "--store" in capsys.readouterr().out


def test_a_bad_store_url_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "--store", "ftp://nope"]) == 1
    assert "unknown store URL" in capsys.readouterr().err
