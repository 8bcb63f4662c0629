"""`infercache stats | invalidate | set-model-version | purge` act on a shared store."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infercache.cache import Cache
from infercache.cli import main
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.settings import Settings
from tests.harness.upstreams import CountingUpstream
from tests.harness.vocabulary import chat


def cli_exe() -> list[str]:
    exe = shutil.which("infercache", path=str(Path(sys.executable).parent))
    assert exe is not None, "the infercache entry point is not installed in this venv"
    return [exe]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cli_exe(), *args], capture_output=True, text=True, timeout=60, check=False
    )


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


@pytest.mark.parametrize("command", [["stats"], ["purge"], ["invalidate", "--tag", "kb"]])
def test_a_store_that_does_not_exist_is_an_error_and_nothing_is_created(
    command: list[str], tmp_path: Path
) -> None:
    relative = subprocess.run(
        [*cli_exe(), *command, "--store", "sqlite:///typo/path"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
    )
    assert relative.returncode == 1
    assert "no store at sqlite:///typo/path" in relative.stderr
    absolute = cli(*command, "--store", f"sqlite:///{tmp_path / 'nope' / 'c.db'}")
    assert absolute.returncode == 1
    assert "does not exist" in absolute.stderr
    assert list(tmp_path.iterdir()) == []  # no database, no directory


def test_the_default_store_must_exist_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INFERCACHE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("INFERCACHE_STORE", raising=False)
    assert main(["stats"]) == 1
    assert "no store at sqlite:///" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()


def test_a_memory_store_is_refused_it_lives_in_one_process(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["purge", "--store", "memory://"]) == 1
    assert "inside one process" in capsys.readouterr().err


def test_set_model_version_may_create_the_store_a_gateway_will_read(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    assert cli("set-model-version", "m", "v1", "--store", url).returncode == 0
    stats = cli("stats", "--store", url, "--model", "m")
    assert json.loads(stats.stdout)["model_versions"] == {"m": "v1"}
