"""The semantic layer's command lines as a user runs them (issue 11, acceptance 5):

    infercache tune FILE --fit --target-false-hit 0.05 --write-config semantic.toml
    infercache tune eval FILE --config semantic.toml --format json
    infercache serve --semantic --config semantic.toml      serves with the fitted matcher
    infercache serve --semantic=shadow ...                  starts in shadow mode

The labelled texts are the support bot's intents (tests/semantic/support_bot.py) in 120
phrasings each, embedded with the packaged static model; the gateways are real processes in
front of the stand-in provider. Without a calibration, `--semantic` alone means shadow.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infercache.cli import build_parser, main
from infercache.errors import ConfigError
from infercache.gateway.cli import serve_settings
from tests.gateway.conftest import body
from tests.harness.processes import start, stop
from tests.harness.servers import free_port, serve
from tests.harness.upstreams import FakeUpstream
from tests.semantic.support_bot import CORES

OPENERS = ["", "hi, ", "hello, ", "quick question: ", "please tell me ", "can you explain "]
OPENERS += ["hey there, ", "good morning, ", "I need to know ", "help me "]
CLOSERS = ["", "?", " please", " thanks", " for me", " if possible", " today", " now"]
CLOSERS += [" asap", " quickly", " thank you", " right away"]


def serve_args(*argv: str) -> Any:
    return build_parser().parse_args(["serve", *argv])


def test_semantic_alone_is_shadow_without_a_calibration_and_calibrated_with_one(
    tmp_path: Path,
) -> None:
    assert serve_settings(serve_args()).semantic.enabled is False
    bare = serve_settings(serve_args("--semantic")).semantic
    assert (bare.enabled, bare.shadow) == (True, True)
    tuned = tmp_path / "semantic.toml"
    tuned.write_text("[semantic]\nthreshold = 0.9\n")
    calibrated = serve_settings(serve_args("--semantic", "--config", str(tuned))).semantic
    assert (calibrated.enabled, calibrated.shadow) == (True, False)
    forced = serve_settings(serve_args("--semantic=shadow", "--config", str(tuned))).semantic
    assert (forced.enabled, forced.shadow, forced.threshold) == (True, True, 0.9)
    with pytest.raises(ConfigError, match="needs a threshold"):
        serve_settings(serve_args("--semantic=calibrated"))


def test_an_unknown_semantic_mode_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        serve_args("--semantic=sometimes")
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def labelled_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = ["text,label"]
    for intent, core in CORES.items():
        lines += [f'"{o}{core}{c}",{intent}' for o in OPENERS for c in CLOSERS]
    path = tmp_path_factory.mktemp("intents") / "intents.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def upstream() -> Iterator[str]:
    fake = FakeUpstream()
    with serve(fake.app) as url:
        yield f"{url}/v1"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


class Served:
    def __init__(self, process: subprocess.Popen[str], url: str, ready: str) -> None:
        self.process, self.url, self.ready = process, url, ready

    def ask(self, text: str) -> str:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            reply = client.post("/v1/chat/completions", json=body(text))
        assert reply.status_code == 200, reply.text
        return reply.headers["x-infercache"]

    def semantic(self) -> dict[str, Any]:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            state: dict[str, Any] = client.get("/stats").json()["semantic"]
        return state


@pytest.fixture
def launch(tmp_path: Path, upstream: str) -> Iterator[Any]:
    started: list[Served] = []

    def launch_one(*flags: str) -> Served:
        port = free_port()
        store = f"sqlite:///{tmp_path / f'gateway-{port}.db'}"
        process, ready = start(
            ["serve", "--port", str(port), "--store", store, "--upstream", upstream, *flags],
            "gateway ready",
            on_stderr=False,
            env={"INFERCACHE_DATA_DIR": str(tmp_path / "data")},
        )
        started.append(Served(process, f"http://127.0.0.1:{port}", ready))
        return started[-1]

    yield launch_one
    for served in started:
        stop(served.process)


@pytest.mark.slow
def test_tune_fit_writes_a_config_that_tune_eval_measures_and_serve_serves(
    tmp_path: Path, labelled_file: Path, capsys: pytest.CaptureFixture[str], launch: Any
) -> None:
    config = tmp_path / "semantic.toml"
    report = run(
        capsys, "tune", str(labelled_file), "--fit", "--embedder", "static",
        "--target-false-hit", "0.05", "--write-config", str(config),
        "--out", str(tmp_path / "matcher"), "--format", "json",
    )  # fmt: skip
    # 1% is out of reach here: replayed as served (out-of-domain questions mixed in), these
    # 1,200 texts serve about 240 answers, and a bound of 1% needs about 300 with none wrong.
    assert report["false_hit_upper"] <= 0.05
    evaluation = run(
        capsys, "tune", "eval", str(labelled_file), "--config", str(config), "--format", "json"
    )
    assert {"pairs", "positives", "negatives", "false_hit_rate", "hit_rate"} <= evaluation.keys()
    # Replayed as served: every labelled text once, with out-of-domain questions mixed in.
    labelled = len(CORES) * len(OPENERS) * len(CLOSERS)
    assert evaluation["replayed"] == labelled + evaluation["ood_in_stream"] > labelled
    assert evaluation["threshold"] == report["threshold"]

    calibrated = launch("--semantic", "--config", str(config))
    assert "semantic: calibrated" in calibrated.ready
    state = calibrated.semantic()
    assert (state["mode"], state["serving"]) == ("calibrated", True)
    assert state["matcher"].startswith("fitted:")
    assert calibrated.ask("how do I reset my password") == "miss"
    assert calibrated.ask("hi, how do I reset my password?") == "semantic-hit"
    assert calibrated.ask("hi, how do I reset my card pin?") == "miss"

    shadow = launch("--semantic=shadow", "--config", str(config))
    assert "semantic: shadow" in shadow.ready
    state = shadow.semantic()
    assert (state["mode"], state["serving"], state["threshold"]) == ("shadow", False, None)
    assert state["matcher"].startswith("fitted:")
    assert shadow.ask("how do I reset my password") == "miss"
    assert shadow.ask("hi, how do I reset my password?") == "miss"  # judged, not served
    deadline = time.monotonic() + 30
    while shadow.semantic()["calibration"]["pairs_judged"] < 1:  # the judge runs in background
        assert time.monotonic() < deadline, "the shadow judge never labelled the pair"
    calibration = shadow.semantic()["calibration"]
    assert calibration["pairs_judged"] == 1
    assert calibration["serving"] is False
