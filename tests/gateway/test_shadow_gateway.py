"""Shadow mode through a real gateway (issue 11, acceptance 2): a support-bot day over HTTP, in
front of a stand-in provider that answers every question with its intent's answer.

The gateway is built as `infercache serve --semantic=shadow` builds it (SQLite store, real
HTTP on loopback), with the packaged static embedder and the `exact` judge; the judge runs
inline (instead of on the verifier's thread) so each request sees the calibration its
predecessors left, which makes "nothing served before the bound is met" checkable request by
request. The day (tests/semantic/support_bot.py): ten intents in 36 phrasings, Zipf over
intents, half exact repeats; two intents differ by one word.
- no semantic answer is served while the layer is in shadow (so none wrong either);
- it leaves shadow once the 95% upper bound of the false-hit rate meets the target over at
  least `shadow_min_pairs` judged pairs, and `/stats` says so;
- of the semantic answers served afterwards, the wrong share is within the target.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infercache.gateway.build import build
from infercache.gateway.config import GatewayConfig
from infercache.semantic.embedder import StaticEmbedder
from infercache.semantic.setup import enable_from_settings
from infercache.settings import SemanticSettings, Settings
from tests.gateway.servers import FakeUpstream, serve
from tests.semantic.support_bot import InlineExecutor, answer_of, ask, day, texts_by_intent

TARGET = 0.05
MIN_PAIRS = 40


class IntentProvider(FakeUpstream):
    """The stand-in provider, answering each question with its intent's answer."""

    def __init__(self) -> None:
        super().__init__()
        self.intent_of = {t: i for i, texts in texts_by_intent().items() for t in texts}

    def completion(self, body: dict[str, Any], n: int) -> dict[str, Any]:
        out = super().completion(body, n)
        intent = self.intent_of[body["messages"][-1]["content"]]
        out["choices"][0]["message"]["content"] = answer_of(intent)
        return out


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[httpx.Client, Any]]:
    provider = IntentProvider()
    with serve(provider.app) as provider_url:
        settings = Settings(data_dir=tmp_path, store_url=f"sqlite:///{tmp_path / 'g.db'}")
        config = GatewayConfig(upstreams=(f"{provider_url}/v1",), store_budget_s=0.5)
        built = build(settings, config)
        semantic = SemanticSettings(
            enabled=True,
            mode="shadow",
            judge="exact",
            embedder="static",
            target_false_hit=TARGET,
            shadow_min_pairs=MIN_PAIRS,
            verify_sample_rate=0.2,
        )
        layer = enable_from_settings(
            built.cache,
            semantic,
            embedder=StaticEmbedder(),
            rng=random.Random(3),
            executor=InlineExecutor(),
        )
        with serve(built.app) as url, httpx.Client(base_url=url, timeout=60) as client:
            yield client, layer


def test_shadow_serves_nothing_until_the_bound_is_met_then_stays_within_the_target(
    gateway: tuple[httpx.Client, Any],
) -> None:
    client, layer = gateway
    before = client.get("/stats").json()["semantic"]
    assert (before["mode"], before["serving"], before["threshold"]) == ("shadow", False, None)
    in_shadow_served = semantic = wrong = 0
    started_at = None
    for index, (text, intent) in enumerate(day(600, seed=1)):
        shadow = layer.threshold is None
        reply = client.post("/v1/chat/completions", json=ask(text))
        assert reply.status_code == 200, reply.text
        if reply.headers["x-infercache"] == "semantic-hit":
            in_shadow_served += shadow
            semantic += 1
            wrong += reply.json()["choices"][0]["message"]["content"] != answer_of(intent)
        if started_at is None and layer.threshold is not None:
            started_at = index
            stats = client.get("/stats").json()["semantic"]
            assert stats["serving"] is True
            assert stats["calibration"]["pairs_judged"] >= MIN_PAIRS
            assert stats["calibration"]["false_hit_upper"] <= TARGET
    assert in_shadow_served == 0  # no semantic answer (so no wrong one) before the bound
    assert started_at is not None
    assert started_at >= MIN_PAIRS
    assert semantic > 100
    assert wrong / semantic <= TARGET
    final = client.get("/stats").json()
    calibration = final["semantic"]["calibration"]
    assert calibration["serving"] is True
    assert 0 < calibration["would_be_hit_rate"] <= 1
    assert final["strategies"]["semantic"]["counters"]["calibration_started_serving"] >= 1
    assert final["strategies"]["semantic"]["hits"] == semantic
