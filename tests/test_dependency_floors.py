"""The base install's dependency floors are versions the library's tests pass on, and infercache
installs beside LlamaIndex's OpenAI integration (issue 26 item 4).

- `floors_venv` (once a session): a fresh venv holding this package (`pip install <a copy of
  the source>`) with every base requirement pinned to its floor, `NAME>=X` read as `NAME==X`
  from pyproject.toml, plus the test runner at the lock's versions.
- The library's tests that need no extra run in it: the cache, the stores on real SQLite and
  Redis (one server; the cluster's runs are left to the full suite, for time), the `openai`
  wrapper, the gateway's HTTP server on hits and malformed input.
- `pip install infercache llama-index-llms-openai-like` is resolved (`--dry-run --report`, in
  that venv's pip, installed packages ignored): it must resolve, and every base requirement of
  infercache must hold for the versions chosen (LlamaIndex caps openai below 3: an infercache
  floor of openai 3 was the conflict).

Slow: they install from the configured package index (pip.conf), as `./run` does. Only the base
requirements are floored here; the extras (torch, transformers, ...) keep their own floors,
which these tests do not install.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
TEST_TOOLS = ("pytest", "pytest-timeout", "hypothesis")  # at the lock's versions
LIBRARY_TESTS = [
    "tests/test_cache.py",
    "tests/test_keys.py",
    "tests/test_policy.py",
    "tests/test_request.py",
    "tests/test_exact_guards.py",
    "tests/test_flight.py",
    "tests/test_store_guard.py",
    "tests/test_embedding_cache.py",
    "tests/test_openai_client.py",
    "tests/test_async_library.py",
    "tests/test_metrics.py",
    "tests/test_settings.py",
    "tests/test_http_errors.py",
    "tests/stores/test_contract.py",
    "tests/stores/test_redis.py",
    "tests/gateway/test_bad_input.py",
    "tests/gateway/test_hit_usage.py",
]
# starlette's own test client (tests only) names an alias newer anyio deprecates; fixed in
# starlette 1.8, below which it warns under filterwarnings=error. Not infercache's code.
TEST_CLIENT_WARNING = "ignore:The anyio.abc.BlockingPortal alias is deprecated:DeprecationWarning"
PYTEST_ARGS = ["-x", "-p", "no:cacheprovider", "-m", "not slow", "-k", "not cluster"]
PYTEST_ARGS += ["-W", TEST_CLIENT_WARNING]
RESOLVE_ONLY = ["-q", "--dry-run", "--ignore-installed", "--report"]  # then the report's path
LLAMA = "llama-index-llms-openai-like"


def base_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [Requirement(r) for r in project["dependencies"]]


def floor_pins() -> list[str]:
    """Each base requirement at its floor: `numpy>=1.26.4` → `numpy==1.26.4` (markers kept)."""
    pins = []
    for req in base_requirements():
        floors = [s.version for s in req.specifier if s.operator == ">="]
        assert len(floors) == 1, f"{req} needs exactly one >= floor"
        marker = f"; {req.marker}" if req.marker else ""
        pins.append(f"{req.name}=={floors[0]}{marker}")
    return pins


def _lock_pin(name: str) -> str:
    for line in (REPO / "requirements" / "lock.txt").read_text(encoding="utf-8").splitlines():
        if line.lower().startswith(f"{name.lower()}=="):
            return line.strip()
    raise AssertionError(f"{name} is not in requirements/lock.txt")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="session")
def floors_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv: this package with every base requirement at its floor; its python."""
    root = tmp_path_factory.mktemp("floors")
    source = root / "infercache"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    constraints = root / "floors.txt"
    constraints.write_text("\n".join(floor_pins()) + "\n", encoding="utf-8")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(source), "-c", str(constraints)]
        + [_lock_pin(tool) for tool in TEST_TOOLS],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(),
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    return python


def _installed_versions(python: Path) -> dict[str, str]:
    script = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))"
    )
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True, check=True)
    versions: dict[str, str] = json.loads(done.stdout)
    return {name.replace("_", "-"): version for name, version in versions.items()}


@pytest.mark.slow
def test_the_library_tests_pass_on_the_floors(floors_venv: Path) -> None:
    versions = _installed_versions(floors_venv)
    for pin in floor_pins():
        req = Requirement(pin)
        if req.marker is None or req.marker.evaluate():
            floor = Version(next(iter(req.specifier)).version)
            assert Version(versions[req.name.lower()]) == floor, pin
    done = subprocess.run(
        [str(floors_venv), "-m", "pytest", *PYTEST_ARGS, *LIBRARY_TESTS],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(),
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout


@pytest.mark.slow
def test_infercache_resolves_beside_llamaindex_without_losing_a_requirement(
    floors_venv: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    source = floors_venv.parents[2] / "infercache"
    done = subprocess.run(
        [str(floors_venv), "-m", "pip", "install", *RESOLVE_ONLY, str(report), str(source), LLAMA],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    chosen = {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    assert "llama-index-llms-openai" in chosen
    assert "infercache" in chosen
    for req in base_requirements():
        if req.marker is not None and not req.marker.evaluate():
            continue
        version = chosen[req.name.lower()]
        assert req.specifier.contains(version, prereleases=True), (req, version)
    assert Version(chosen["openai"]) < Version("3")  # LlamaIndex's cap, inside our range
