"""Shadow mode and complaints through `Cache` with a stand-in upstream that answers per intent:
nothing is served before judged traffic certifies an operating point, nothing wrong is served
in shadow, the served share of wrong answers stays within the target, a changed upstream sends
the layer back to shadow, and an answer reported wrong is retired and not served again."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.semantic.embedder import HashingEmbedder
from infercache.semantic.guards import default_guards
from infercache.semantic.judges import ExactAnswerJudge
from infercache.semantic.layer import SemanticConfig, ShadowConfig
from infercache.semantic.verify import FalseHitMonitor, Verifier
from infercache.settings import Settings
from tests.semantic.support_bot import InlineExecutor, IntentUpstream, answer_of, ask, day

EMBEDDER = HashingEmbedder(dim=512)
TARGET = 0.05


def shadow_cache(tmp_path: Path, clock: ManualClock, *, window: int = 2000) -> Cache:
    cache = Cache(
        Settings(data_dir=tmp_path, store_url="memory://", default_ttl_s=10_000), clock=clock
    )
    verifier = Verifier(
        ExactAnswerJudge(),
        FalseHitMonitor(target_false_hit=TARGET),
        sample_rate=0.2,
        rng=random.Random(3),
        executor=InlineExecutor(),
    )
    shadow = ShadowConfig(target_false_hit=TARGET, min_pairs=40, window=window)
    cache.enable_semantic(
        EMBEDDER,
        config=SemanticConfig(threshold=None, shadow=shadow),
        guards=default_guards(),
        verifier=verifier,
    )
    return cache


def served(cache: Cache, upstream: IntentUpstream, text: str) -> tuple[Layer, str]:
    done = cache.complete(ask(text), upstream)
    return done.layer, done.response["choices"][0]["message"]["content"]


def test_nothing_is_served_before_the_bound_is_met_and_then_within_the_target(
    tmp_path: Path, clock: ManualClock
) -> None:
    cache = shadow_cache(tmp_path, clock)
    layer = cache.semantic
    assert layer is not None
    upstream = IntentUpstream()
    shadow_answers = semantic = wrong = 0
    started_at = None
    for index, (text, intent) in enumerate(day(1500, seed=1)):
        in_shadow = layer.threshold is None
        kind, content = served(cache, upstream, text)
        if kind is Layer.SEMANTIC:
            shadow_answers += in_shadow
            semantic += 1
            wrong += content != answer_of(intent)
        if started_at is None and layer.threshold is not None:
            started_at = index
    assert shadow_answers == 0  # no semantic answer while in shadow, so none wrong either
    assert started_at is not None
    assert started_at > 40
    assert semantic > 100
    assert wrong / semantic <= TARGET
    state = layer.state()
    calibration = state["calibration"]
    assert state["mode"] == "shadow"
    assert state["serving"] is True
    assert calibration["pairs_judged"] >= 40
    assert calibration["false_hit_upper"] <= TARGET
    assert 0 < calibration["would_be_hit_rate"] <= 1
    counters = cache.stats()["strategies"]["semantic"]["counters"]
    assert counters["calibration_started_serving"] == 1
    assert 40 <= counters["shadow_lookups"] <= started_at + 1


def test_answers_that_change_upstream_send_the_layer_back_to_shadow(
    tmp_path: Path, clock: ManualClock
) -> None:
    cache = shadow_cache(tmp_path, clock, window=120)
    layer = cache.semantic
    assert layer is not None
    upstream = IntentUpstream()
    traffic = day(2400, seed=2)
    for text, _ in traffic[:1200]:
        served(cache, upstream, text)
    assert layer.threshold is not None
    upstream.answer_of = lambda intent: f"New policy for {intent}."  # every cached answer is stale
    back_at = None
    for index, (text, _) in enumerate(traffic[1200:]):
        served(cache, upstream, text)
        if layer.threshold is None:
            back_at = index
            break
    assert back_at is not None
    counters = cache.stats()["strategies"]["semantic"]["counters"]
    assert counters["calibration_back_to_shadow"] == 1
    assert layer.state()["calibration"]["false_hit_upper"] > TARGET


def calibrated_cache(tmp_path: Path, clock: ManualClock) -> Cache:
    cache = Cache(
        Settings(data_dir=tmp_path, store_url="memory://", default_ttl_s=10_000), clock=clock
    )
    cache.enable_semantic(EMBEDDER, config=SemanticConfig(threshold=0.75), guards=default_guards())
    return cache


def test_an_answer_reported_wrong_is_retired_and_never_served_again(
    tmp_path: Path, clock: ManualClock
) -> None:
    cache = calibrated_cache(tmp_path, clock)
    layer = cache.semantic
    assert layer is not None
    upstream = IntentUpstream()
    original, rephrased = "hi, how do I reset my password", "how do I reset my password please"
    cache.complete(ask(original), upstream)
    hit, _ = layer.lookup(*_parsed(cache, ask(rephrased)))
    assert hit is not None
    done = cache.complete(ask(rephrased), upstream)
    assert (done.layer, done.key) == (Layer.SEMANTIC, hit.key)
    wrong_content = done.response["choices"][0]["message"]["content"]

    assert layer.report_wrong(hit.key, score=hit.score, group=hit.group) is True
    assert cache.backend.get(hit.key) is None  # the entry that served it, retired at once
    assert cache.backend.get("sem:" + hit.key) is None
    snapshot = cache.stats()["strategies"]["semantic"]
    assert snapshot["counters"]["complaints"] == 1
    assert snapshot["gauges"]["vectors"] == 0
    calls = upstream.calls
    again = cache.complete(ask(rephrased), upstream)
    assert again.layer is Layer.MISS
    assert upstream.calls == calls + 1
    # The original question comes back: its own entry is gone, and the rephrased question's
    # entry holds the same answer, at the very score that was reported: refused.
    back = cache.complete(ask(original), upstream)
    assert back.layer is Layer.MISS
    for _ in range(3):
        for text in (original, rephrased):
            kind, content = served(cache, upstream, text)
            assert kind is not Layer.SEMANTIC or content != wrong_content
    assert layer.report_wrong("no-such-key", score=0.9) is False


def test_a_complaint_counts_as_a_wrong_verdict_for_the_live_threshold(
    tmp_path: Path, clock: ManualClock
) -> None:
    cache = Cache(
        Settings(data_dir=tmp_path, store_url="memory://", default_ttl_s=10_000), clock=clock
    )
    monitor = FalseHitMonitor(target_false_hit=0.05, min_verified=3)
    verifier = Verifier(
        ExactAnswerJudge(), monitor, sample_rate=0.0, rng=random.Random(0),
        executor=InlineExecutor(),
    )  # fmt: skip
    cache.enable_semantic(
        EMBEDDER, config=SemanticConfig(threshold=0.75), guards=default_guards(),
        verifier=verifier,
    )  # fmt: skip
    layer = cache.semantic
    assert layer is not None
    for score in (0.8, 0.81, 0.82):
        layer.report_wrong("gone", score=score)
    assert layer.threshold is not None
    assert layer.threshold > 0.82  # three complaints: tightened above the closest
    assert monitor.verified == 0  # a complaint starts a new window once acted upon
    assert cache.stats()["strategies"]["semantic"]["counters"]["threshold_tightened"] == 1


def _parsed(cache: Cache, body: dict[str, Any]) -> tuple[Any, Any]:
    from infercache.request import parse_request

    request = parse_request(body)
    return request, cache.exact.lookup(request, read_entry=False).view


@pytest.mark.parametrize("stats", [True, False], ids=["per-answer", "one-threshold"])
def test_the_shadow_state_is_reported_and_persisted_across_restarts(
    tmp_path: Path, clock: ManualClock, stats: bool
) -> None:
    url = f"sqlite:///{tmp_path / 'shadow.db'}"

    def build() -> Cache:
        cache = Cache(Settings(data_dir=tmp_path, store_url=url, default_ttl_s=10_000), clock=clock)
        verifier = Verifier(
            ExactAnswerJudge(), FalseHitMonitor(target_false_hit=TARGET), sample_rate=0.2,
            rng=random.Random(3), executor=InlineExecutor(),
        )  # fmt: skip
        shadow = ShadowConfig(target_false_hit=TARGET, min_pairs=40, window=2000)
        config = SemanticConfig(threshold=None, shadow=shadow)
        if not stats:
            config = SemanticConfig(threshold=None, shadow=shadow, answer_stats=None)
        cache.enable_semantic(EMBEDDER, config=config, guards=default_guards(), verifier=verifier)
        return cache

    first = build()
    upstream = IntentUpstream()
    for text, _ in day(800, seed=4):
        served(first, upstream, text)
    assert first.semantic is not None
    before = first.semantic.state()["calibration"]
    first.close()
    restarted = build()
    assert restarted.semantic is not None
    after = restarted.semantic.state()["calibration"]
    assert before["pairs_judged"] - 50 < after["pairs_judged"] <= before["pairs_judged"]
    assert after["serving"] == (after["operating_point"] is not None)
