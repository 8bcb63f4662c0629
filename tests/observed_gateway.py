"""A real gateway on loopback after a mixed workload, as its operator's Prometheus sees it, and
the engine's exposition; shared by the exposition, dashboard and alert tests.

The workload: chat misses, an exact hit, a semantic hit (the n-gram twin embedder), a stream
and its replay, two identical requests coalesced into one upstream call, legacy completions,
embeddings batches that partly hit, a passed-through call, a refused request, two tenants."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from infercache.engine.accounting import EngineAccounting
from infercache.engine.radix import RadixStats
from infercache.gateway.build import Built, build
from infercache.gateway.config import GatewayConfig
from infercache.metrics import Metrics
from infercache.semantic.embedder import HashingEmbedder
from infercache.semantic.guards import default_guards
from infercache.semantic.layer import SemanticConfig
from infercache.settings import Settings
from tests.harness.engine_requests import request_stats
from tests.harness.servers import serve
from tests.harness.upstreams import FakeUpstream
from tests.harness.vocabulary import chat

METRICS_TOKEN = "metrics-token"
ADMIN_TOKEN = "admin-token"
KEYS = {"key-a": "team-a", "key-b": "team-b"}


@dataclass(frozen=True)
class Observed:
    metrics_text: str  # GET /metrics
    stats: dict[str, Any]  # GET /stats
    built: Built


def assert_token_hit_rates_at_most_one(strategies: dict[str, Any]) -> None:
    """Every strategy's token hit rate is a share: saved prompt tokens never exceed seen ones."""
    for name, s in strategies.items():
        assert s["prompt_tokens_saved"] <= s["prompt_tokens_seen"], (name, s)
        assert 0.0 <= s["token_hit_rate"] <= 1.0, (name, s)


def ask(content: str, **fields: Any) -> dict[str, Any]:
    return chat(content, system="You are a support bot.", **fields)


@contextlib.contextmanager
def gateway_with_traffic(tmp_path: Path) -> Iterator[Observed]:
    fake = FakeUpstream()
    with serve(fake.app) as upstream_url:
        settings = Settings(
            data_dir=tmp_path, store_url=f"sqlite:///{tmp_path / 'g.db'}", default_ttl_s=600
        )
        config = GatewayConfig(
            upstreams=(f"{upstream_url}/v1",),
            api_keys=KEYS,
            metrics_token=METRICS_TOKEN,
            admin_token=ADMIN_TOKEN,
            store_budget_s=0.5,
        )
        built = build(settings, config)
        built.cache.enable_semantic(
            HashingEmbedder(dim=512), config=SemanticConfig(threshold=0.75), guards=default_guards()
        )
        with serve(built.app) as url:
            with httpx.Client(base_url=url, timeout=30) as http:
                _workload(http, fake)
                metrics = http.get("/metrics", headers=_bearer(METRICS_TOKEN))
                assert metrics.status_code == 200, metrics.text
                stats = http.get("/stats", headers=_bearer(ADMIN_TOKEN)).json()
            yield Observed(metrics.text, stats, built)


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _workload(http: httpx.Client, fake: FakeUpstream) -> None:
    a, b = _bearer("key-a"), _bearer("key-b")

    def post(path: str, body: dict[str, Any], headers: dict[str, str] = a) -> httpx.Response:
        return http.post(path, json=body, headers=headers)

    layers = [
        post("/v1/chat/completions", ask(q)).headers["x-infercache"]
        for q in (
            "hi, how do I reset my password",
            "hi, how do I reset my password",
            "how do I reset my password please",
        )
    ]
    assert layers == ["miss", "exact-hit", "semantic-hit"]
    streamed = ask("What are your opening hours?", stream=True)
    assert [post("/v1/chat/completions", streamed).headers["x-infercache"] for _ in "ab"] == [
        "miss",
        "exact-hit",
    ]
    _coalesced(http, fake, ask("Where is my parcel?"))
    text = {"model": "test-model", "prompt": "Say hi", "temperature": 0}
    assert [post("/v1/completions", text).headers["x-infercache"] for _ in "ab"] == [
        "miss",
        "exact-hit",
    ]
    inputs = ["alpha beta", "gamma", "delta epsilon zeta"]
    embed = {"model": "embed-model", "input": inputs}
    assert post("/v1/embeddings", embed).headers["x-infercache"] == "miss"
    again = post("/v1/embeddings", {**embed, "input": [*inputs, "eta"]})
    assert again.headers["x-infercache-cached-inputs"] == "3"
    assert post("/v1/embeddings", embed).headers["x-infercache"] == "exact-hit"
    assert http.get("/v1/files", headers=a).status_code == 200
    assert post("/v1/chat/completions", {"model": "test-model"}).status_code == 400
    assert post("/v1/chat/completions", ask("Hello from team b"), b).status_code == 200


def _coalesced(http: httpx.Client, fake: FakeUpstream, body: dict[str, Any]) -> None:
    """Two identical requests while the upstream holds its answer: one call, one shared."""
    fake.hold()
    layers: list[str] = []
    calls_before = fake.calls

    def call() -> None:
        answer = http.post("/v1/chat/completions", json=body, headers=_bearer("key-a"))
        layers.append(answer.headers.get("x-infercache-coalesced", "false"))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for _ in range(20_000):  # a real /stats request each time, until both share one flight
        if http.get("/stats", headers=_bearer(ADMIN_TOKEN)).json()["waiting"] == 1:
            break
    fake.release()
    for t in threads:
        t.join(30)
    assert sorted(layers) == ["false", "true"]
    assert fake.calls == calls_before + 1


def engine_metrics_text() -> str:
    """What the built-in engine's server exports (`GET /metrics`: its Metrics, which its
    accounting feeds), after a request that reused a cached prefix and a batched step."""
    metrics = Metrics()
    accounting = EngineAccounting(metrics, prefix_cache_enabled=True)
    stats = request_stats(
        40, 32, 5, queue_s=0.01, lookup_s=0.001, prefill_s=0.02, ttft_s=0.03,
        evicted_nodes=1, evicted_tokens=16,
    )  # fmt: skip
    accounting.record(
        "tiny", stats, RadixStats(4096, 0, 4096, total_tokens=64, nodes=3, namespaces=1)
    )
    accounting.record_step(_Step(sequences=2, prefill_tokens=40, duration_s=0.02), 2, [])
    return metrics.to_prometheus().decode()


@dataclass(frozen=True)
class _Step:
    sequences: int
    prefill_tokens: int
    duration_s: float
