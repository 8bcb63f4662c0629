"""`infercache tune REQUEST_LOG`: a gateway request log as the training data — labels from a
judge, replayed in time order, a config that says what it was calibrated on, refusals that say
what is missing. Small generated logs and the packaged static embedder (fast, real)."""

from __future__ import annotations

import json
import random
import tomllib
from pathlib import Path
from typing import Any

import pytest

from infercache.cli import main
from infercache.semantic.embedder import HashingEmbedder
from infercache.semantic.judges import EmbeddingJudge, ExactAnswerJudge
from infercache.semantic.tuning.request_log import Logged, is_request_log, label_answers, read_log
from infercache.semantic.tuning.tune import load_served
from tests.semantic.support_bot import answer_of, texts_by_intent

SYSTEM = "You are the support assistant of a shop."
ONE_OFF = [f"what is the {w} of the {n}" for w in ("capital", "height", "age") for n in
           ("eiffel tower", "nile", "moon", "sahara", "louvre", "everest", "danube")]  # fmt: skip


def chat(text: str) -> dict[str, Any]:
    return {"model": "m", "temperature": 0,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": text}]}  # fmt: skip


def reply(text: str) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}]}  # fmt: skip


def write_log(path: Path, requests: int, seed: int) -> Path:
    """A day through a gateway with the semantic layer off: intents drawn by a Zipf law, half of
    them exact repeats; one-off questions; a semantic hit and an error line (both ignored)."""
    rng = random.Random(seed)
    intents = texts_by_intent()
    names = sorted(intents)
    weights = [1 / (r + 1) for r in range(len(names))]
    asked: list[tuple[str, str]] = []
    lines = []
    for i in range(requests):
        if rng.random() < 0.05:
            text = rng.choice(ONE_OFF)
            answer = f"A fact about {text}."
        elif asked and rng.random() < 0.5:
            text, answer = rng.choice(asked)
        else:
            intent = rng.choices(names, weights)[0]
            text, answer = rng.choice(intents[intent]), answer_of(intent)
            asked.append((text, answer))
        lines.append({"timestamp": 1000.0 + i, "tenant": "", "model": "m", "layer": "miss",
                      "status": 200, "request": chat(text), "response": reply(answer)})  # fmt: skip
    lines.append({"timestamp": 5.0, "tenant": "", "model": "m", "layer": "semantic-hit",
                  "status": 200, "request": chat("x"), "response": reply("y")})  # fmt: skip
    lines.append({"timestamp": 6.0, "tenant": "", "model": "m", "layer": "miss", "status": 502,
                  "request": chat("x"), "response": None})  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def day_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_log(tmp_path_factory.mktemp("log") / "requests.jsonl", 1600, seed=1)


OOD = [
    "who painted the ceiling of the sistine chapel", "how tall is mount kilimanjaro",
    "write a haiku about autumn leaves", "what causes the northern lights",
    "translate good morning into japanese", "explain quantum entanglement simply",
    "best way to learn the violin as an adult", "why is the sky blue",
    "recommend a thriller novel", "how do volcanoes form", "what is the speed of sound",
    "give me a recipe for lentil soup", "who won the world cup in football",
    "how many moons does jupiter have", "summarise the plot of hamlet",
    "what is photosynthesis", "tips for running a marathon", "how do bees make honey",
    "what language is spoken in brazil", "describe the rules of chess",
    "when was the printing press invented", "how deep is the pacific ocean",
    "write a limerick about a cat", "what is the boiling point of water at altitude",
    "who discovered penicillin", "explain how a rainbow forms", "plan a weekend in rome",
    "what do koalas eat", "how are glaciers formed", "what is a black hole",
    "suggest names for a golden retriever", "how does a jet engine work",
    "what is the tallest tree species", "how to fold a paper crane",
    "who composed the four seasons", "what is the population of canada",
    "explain the offside rule", "how long do tortoises live",
    "what is the difference between weather and climate", "how to brew green tea",
]  # fmt: skip


@pytest.fixture(scope="module")
def ood_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ood") / "ood.txt"
    path.write_text("\n".join(OOD) + "\n", encoding="utf-8")
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_request_log_is_read_in_time_order_with_labels_from_the_judge(day_log: Path) -> None:
    assert is_request_log(day_log)
    logged = read_log([day_log], ExactAnswerJudge())
    assert logged.skipped == 2  # the semantic hit and the error
    assert logged.timestamps_s == sorted(logged.timestamps_s)
    by_label: dict[str, set[str]] = {}
    for row in logged.rows:
        by_label.setdefault(row.label, set()).add(row.text)
    intents = texts_by_intent()
    for texts in by_label.values():  # one label = one intent's texts, or one one-off question
        owners = {name for name, phrasings in intents.items() if texts <= set(phrasings)}
        assert len(owners) == 1 or (len(texts) == 1 and next(iter(texts)) in ONE_OFF)


def test_the_embedding_judge_keeps_template_answers_about_different_things_apart() -> None:
    template = "Thanks for asking about {}. Open the app, choose Help, then {}, and follow it."
    other = "For {}: go to Help in the app, pick {} and follow the steps; that settles it."
    logged = [
        Logged(1.0, "s", "q1", reply(template.format("card arrival", "card arrival"))),
        Logged(2.0, "s", "q2", reply(template.format("card linking", "card linking"))),
        Logged(3.0, "s", "q3", reply(other.format("card arrival", "card arrival"))),
        Logged(4.0, "t", "q4", reply(template.format("card arrival", "card arrival"))),
    ]
    labels = label_answers(logged, EmbeddingJudge(HashingEmbedder(dim=256), 0.5))
    assert labels[0] != labels[1]  # one template, another topic: different answers
    assert labels[3] not in labels[:3]  # another scope never shares a label


def test_tune_log_writes_a_config_that_says_what_it_was_calibrated_on(
    day_log: Path, ood_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "semantic.toml"
    code, out, err = run(
        capsys, "tune", str(day_log), "--embedder", "static", "--judge", "exact",
        "--target-false-hit", "0.05", "--ood", str(ood_file), "--format", "json",
        "--write-config", str(config),
    )  # fmt: skip
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["source"] == "request log"
    assert report["false_hit_upper"] <= 0.05
    assert report["ood_in_stream"] > 0
    settings = tomllib.loads(config.read_text())["semantic"]
    assert settings["threshold"] == report["threshold"]
    assert settings["floor"] == report["floor"]
    assert settings["min_seen"] == report["min_seen"] == 2  # a one-off answer is never served
    assert report["threshold"] >= report["floor"]
    assert str(day_log) in settings["calibrated_on"]
    assert "replayed in order from an empty cache" in settings["calibrated_on"]
    served = load_served(config)
    assert served.threshold == report["threshold"]
    assert served.matcher.name == "cosine;min_seen=2"
    code, out, err = run(
        capsys, "tune", "eval", str(day_log), "--config", str(config), "--judge", "exact",
        "--ood", str(ood_file), "--format", "json",
    )  # fmt: skip
    assert (code, err) == (0, "")
    measured = json.loads(out)
    assert measured["threshold"] == report["threshold"]
    assert measured["served"] == report["served"]  # the same replay, the same decisions


def test_tune_log_refuses_a_target_the_log_cannot_support(
    day_log: Path, ood_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(
        capsys, "tune", str(day_log), "--embedder", "static", "--judge", "exact",
        "--target-false-hit", "0.0005", "--ood", str(ood_file),
    )  # fmt: skip
    assert (code, out) == (2, "")
    assert "needs at least" in err
    assert "Add labelled texts or a longer log" in err


def test_tune_log_fit_writes_a_matcher_the_config_serves(
    day_log: Path, ood_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "fitted.toml"
    code, out, err = run(
        capsys, "tune", str(day_log), "--fit", "--embedder", "static", "--judge", "exact",
        "--epochs", "3", "--target-false-hit", "0.1", "--ood", str(ood_file),
        "--out", str(tmp_path / "matcher"), "--format", "json", "--write-config", str(config),
    )  # fmt: skip
    assert (code, err) == (0, "")
    report = json.loads(out)
    assert report["cross_fit"] is True
    assert report["split"]["earlier"] + report["split"]["later"] == report["requests"]
    assert report["false_hit_upper"] <= 0.1
    served = load_served(config)
    assert served.matcher_dir == str((tmp_path / "matcher").resolve())
    assert served.threshold == report["threshold"]
