"""`tune --fit` end to end on CPU with the packaged static embedder: a matcher fitted on part of
the labelled texts, calibrated on the rest, written under --out and named by the config; `tune
eval --config` measures what the config serves; the layer serves with it."""

from __future__ import annotations

import json
import random
import tomllib
from pathlib import Path

import numpy as np
import pytest

from infercache.cache import Cache
from infercache.cli import main
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.errors import InvalidRequestError
from infercache.gateway.semantic_setup import enable_from_settings
from infercache.semantic.embedder import HashingEmbedder, StaticEmbedder
from infercache.semantic.matcher import (
    CosineMatcher,
    FittedMatcher,
    Head,
    NearbyAnswer,
    features,
    load_fitted,
)
from infercache.semantic.tuning.cache_sim import (
    Embedded,
    certify,
    evaluate_lookups,
    simulate_lookups,
    tune_lookups,
)
from infercache.semantic.tuning.fit import FitBase, FitOptions, fit_matcher, train_adapter
from infercache.semantic.tuning.intents import LabelledText
from infercache.settings import Settings
from tests.semantic.support_bot import IntentUpstream, answer_of, ask, day, texts_by_intent


@pytest.fixture(scope="module")
def labelled_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = ["text,label"]
    for intent, texts in texts_by_intent().items():
        lines += [f'"{t}",{intent}' for t in texts]
    path = tmp_path_factory.mktemp("intents") / "intents.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def rows() -> list[LabelledText]:
    return [LabelledText(t, i) for i, texts in texts_by_intent().items() for t in texts]


def test_features_see_the_rival_the_agreeing_neighbours_the_vote_and_the_answers_seen() -> None:
    head = Head(weights=(1.0,) * 5, bias=0.0, agree_band=0.15, temperature=0.05)
    near = [NearbyAnswer(0.9, "a", 2), NearbyAnswer(0.85, "a", 2), NearbyAnswer(0.8, "b", 9)]
    f = features(near, head)
    total = 1 + np.exp(-1) + np.exp(-2)  # exp((s - 0.9) / 0.05) for each candidate
    vote_a = (1 + np.exp(-1)) / total
    assert f[0] == pytest.approx([0.9, 0.1, 1, vote_a, 1])  # rival 0.8; one other "a" agrees
    assert f[1] == pytest.approx([0.85, 0.05, 1, vote_a, 1])
    assert f[2] == pytest.approx([0.8, -0.1, 0, 1 - vote_a, 3])  # b's rival is the best "a"
    unknown = features([NearbyAnswer(0.9, ""), NearbyAnswer(0.9, "")], head)
    assert list(unknown[:, 2]) == [0, 0]  # unknown answers agree with nothing
    assert list(unknown[:, 4]) == [0, 0]


def test_a_head_with_min_seen_never_serves_an_answer_cached_once() -> None:
    head = Head(weights=(5.0, 5.0, 0.0, 5.0, 0.0), bias=0.0, min_seen=2)
    scores = FittedMatcher(head, "f").scores(
        [NearbyAnswer(0.99, "a", 1), NearbyAnswer(0.9, "b", 4)]
    )
    assert scores[0] == 0.0
    assert scores[1] > 0.9


def test_the_adapter_pulls_each_label_together() -> None:
    data = rows()
    embedder = HashingEmbedder(dim=64)
    vectors = embedder.embed([r.text for r in data])
    labels = [r.label for r in data]
    adapter = train_adapter(vectors, labels, FitOptions(epochs=20))
    assert adapter.shape == (64, 64)

    def separation(v: np.ndarray) -> float:
        v = v / np.linalg.norm(v, axis=1, keepdims=True)
        s = v @ v.T
        same = np.equal.outer(labels, labels)
        return float(s[same].mean() - s[~same].mean())

    assert separation(vectors @ adapter.T) > separation(vectors) + 0.05


def test_a_fitted_matcher_beats_the_plain_cosine_on_held_out_lookups(tmp_path: Path) -> None:
    data = rows()
    result = fit_matcher(
        data, FitBase(HashingEmbedder(dim=128), "hashing", tmp_path / "m"),
        options=FitOptions(target_false_hit=0.1, epochs=20),
    )  # fmt: skip
    assert result.fitted.evaluation.false_hit_upper is not None
    assert result.fitted.evaluation.false_hit_upper <= 0.1
    report = json.loads((tmp_path / "m" / "matcher.json").read_text())["fit"]
    assert sum(report["split"].values()) == len(data)
    assert report["calibration"]["threshold"] == result.fitted.evaluation.threshold
    parts = load_fitted(tmp_path / "m", HashingEmbedder(dim=128))
    assert parts.matcher.name == result.matcher.name
    assert isinstance(parts.matcher, FittedMatcher)
    with pytest.raises(ValueError, match="fitted on"):
        load_fitted(tmp_path / "m", HashingEmbedder(dim=64))


def test_lookups_are_served_at_the_threshold_tuned_for_them() -> None:
    data = rows()
    vectors = HashingEmbedder(dim=128).embed([r.text for r in data])
    held = Embedded(data, vectors)
    cases = simulate_lookups(held, held, k=4)
    assert len(cases) == len(data)
    assert all(r.query not in [c for c, _ in r.candidates] for r in cases)
    tuned = tune_lookups(cases, CosineMatcher(), target_false_hit=0.2)
    assert tuned.false_hit_upper is not None
    assert tuned.false_hit_upper <= 0.2
    looser = evaluate_lookups(cases, CosineMatcher(), tuned.threshold - 0.05)
    assert looser.served >= tuned.served
    assert looser.to_dict().keys() >= {"pairs", "positives", "negatives", "hit_rate"}


@pytest.mark.parametrize("fitted", [False, True])
def test_a_refusal_suggests_fitting_only_to_a_plain_matcher(fitted: bool) -> None:
    """400 served answers, one wrong among the 300 most certain: 1% cannot be certified."""
    outcomes = [(1.0 - i / 1000, i != 10) for i in range(400)]
    with pytest.raises(InvalidRequestError) as refused:
        certify(outcomes, target_false_hit=0.01, fitted=fitted)
    message = str(refused.value)
    assert "1 were wrong" in message
    assert ("--fit" in message) is not fitted


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_tune_fit_writes_a_config_that_tune_eval_and_the_layer_use(
    tmp_path: Path, labelled_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, out = tmp_path / "semantic.toml", tmp_path / "matcher"
    code, stdout, err = run(
        capsys, "tune", str(labelled_file), "--fit", "--embedder", "static",
        "--target-false-hit", "0.1", "--write-config", str(config), "--out", str(out),
        "--format", "json", "--epochs", "20",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(stdout)
    assert report["kind"] == "lookups"
    assert report["matcher"] == str(out.resolve())
    assert report["false_hit_upper"] <= 0.1
    assert report["fit"]["split"]["calibration"] > 0
    semantic = tomllib.loads(config.read_text())["semantic"]
    assert semantic["matcher"] == str(out.resolve())
    assert semantic["threshold"] == report["threshold"]
    assert semantic["embedder_name"].startswith(StaticEmbedder().name + ";adapter=")

    code, stdout, err = run(
        capsys, "tune", "eval", str(labelled_file), "--config", str(config), "--format", "json",
        "--ood", "none",
    )  # fmt: skip
    assert code == 0, err
    evaluation = json.loads(stdout)
    assert {"pairs", "positives", "negatives", "false_hit_rate", "hit_rate"} <= evaluation.keys()
    assert evaluation["threshold"] == report["threshold"]
    assert 0 < evaluation["pairs"] < len(rows())  # replayed: the first text has no candidate

    clock = ManualClock()
    settings = Settings.load(environ={"INFERCACHE_DATA_DIR": str(tmp_path)}, config_file=config)
    cache = Cache(
        settings.__class__(**{**_fields(settings), "store_url": "memory://"}), clock=clock
    )
    layer = enable_from_settings(cache, settings.semantic, rng=random.Random(0))
    assert layer.matcher.name.startswith("fitted:")
    upstream = IntentUpstream()
    hits = wrong = 0
    for text, intent in day(600, seed=5):
        done = cache.complete(ask(text), upstream)
        if done.layer is Layer.SEMANTIC:
            hits += 1
            wrong += done.response["choices"][0]["message"]["content"] != answer_of(intent)
    assert hits > 20
    assert wrong / hits <= 0.1


def _fields(settings: Settings) -> dict[str, object]:
    return {name: getattr(settings, name) for name in settings.__dataclass_fields__}
