"""Several live versions of one model behind one gateway (issue 29 acceptance 1, 2, 3, 5): two
replicas at two versions keep their own entries, a canary takes a sticky share of tenants and
conversations, shadow traffic is mirrored and never served, and an upgrade under a hit-only load
is noticed without a miss."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infercache.gateway.stats import gateway_stats
from tests.gateway.conftest import MakeGateway, Running
from tests.harness.servers import serve
from tests.harness.upstreams import FakeUpstream
from tests.harness.vocabulary import chat

QUESTIONS = [(f"You are assistant {i % 5}.", f"question {i}?") for i in range(20)]


@pytest.fixture
def second() -> Iterator[tuple[FakeUpstream, str]]:
    upstream = FakeUpstream()
    with serve(upstream.app) as url:
        yield upstream, url


def two_replicas(
    make_gateway: MakeGateway,
    fake: tuple[FakeUpstream, str],
    second: tuple[FakeUpstream, str],
    **config: Any,
) -> tuple[Running, FakeUpstream, FakeUpstream]:
    (one, one_url), (two, two_url) = fake, second
    one.version, two.version = "fp_v1", "fp_v2"
    config.setdefault("version_poll_s", None)  # the tests read versions again themselves
    running = make_gateway(upstreams=(f"{one_url}/v1", f"{two_url}/v1"), **config)
    return running, one, two


def version_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "infercache.gateway.versions" and r.levelno >= logging.INFO
    ]


def asked_of(upstream: FakeUpstream) -> set[str]:
    return {b["messages"][-1]["content"] for b in upstream.bodies}


def test_two_replicas_at_two_versions_keep_their_own_entries(
    make_gateway: MakeGateway,
    fake: tuple[FakeUpstream, str],
    second: tuple[FakeUpstream, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="infercache.gateway.versions")
    running, one, two = two_replicas(make_gateway, fake, second)
    layers: list[str] = []
    fingerprints: dict[str, set[str]] = {q: set() for _, q in QUESTIONS}
    with running.client() as client:
        for _ in range(10):
            for system, question in QUESTIONS:
                response = client.post("/v1/chat/completions", json=chat(question, system=system))
                assert response.status_code == 200
                layers.append(response.headers["x-infercache"])
                fingerprints[question].add(response.json()["system_fingerprint"])
    assert layers.count("exact-hit") >= 150, layers.count("exact-hit")
    on_one, on_two = asked_of(one), asked_of(two)
    assert on_one, "the router sent every question to one replica"
    assert on_two, "the router sent every question to one replica"
    for question, seen in fingerprints.items():  # the version of the replica it was routed to
        assert seen == ({"fp_v1"} if question in on_one else {"fp_v2"}), (question, seen)
        assert not (question in on_one and question in on_two)
    assert version_lines(caplog) == []  # two live versions, no change: no line
    live = gateway_stats(running.built.gateway)["versions"]["live"]["test-model"]
    assert set(live) == {"fp_v1", "fp_v2"}
    # Each replica's first request went out before its version was known (its answer told).
    assert sum(v["requests"] for v in live.values()) == 200 - 2
    assert sum(v["hits"] for v in live.values()) == layers.count("exact-hit")
    assert all(v["entries_stored"] >= 1 and v["traffic_share"] > 0 for v in live.values())
    with running.client() as client:
        metrics = client.get("/metrics").text
    for version in ("fp_v1", "fp_v2"):
        series = f'infercache_version_hits_total{{model="test-model",version="{version}"}} '
        hits = float(metrics.split(series, 1)[1].split()[0])
        assert hits == live[version]["hits"]

    # A change on one replica (it reports a new version): one line, naming what it retired.
    one.models_version = "v1.1"
    prober = running.built.gateway.prober
    assert prober is not None
    asyncio.run_coroutine_threadsafe(prober.round(), running.built.app.state.loop).result(30)
    asyncio.run_coroutine_threadsafe(prober.round(), running.built.app.state.loop).result(30)
    (line,) = version_lines(caplog)
    assert "now version v1.1" in line
    assert "retired fp_v1" in line
    with running.client() as client:
        for system, question in QUESTIONS:
            response = client.post("/v1/chat/completions", json=chat(question, system=system))
            served = response.json()["system_fingerprint"]
            if question in on_one:  # fp_v1 retired: asked again of its replica, now v1.1
                assert response.headers["x-infercache"] == "miss"
            else:
                assert (response.headers["x-infercache"], served) == ("exact-hit", "fp_v2")


def canaried(
    make_gateway: MakeGateway,
    fake: tuple[FakeUpstream, str],
    second: tuple[FakeUpstream, str],
    **rollout: Any,
) -> tuple[Running, FakeUpstream, FakeUpstream, dict[str, Any]]:
    """`two_replicas` with the second declared a canary through /admin/rollout (`rollout`:
    the rest of the declaration); the declaration's answer last."""
    running, one, two = two_replicas(make_gateway, fake, second, admin_token="adm")
    with running.client("adm") as admin:
        declared = admin.post("/admin/rollout", json={"canary": [f"{second[1]}/v1"], **rollout})
        assert declared.status_code == 200, declared.text
    return running, one, two, declared.json()


def tenant_replicas(running: Running, one: FakeUpstream, two: FakeUpstream) -> dict[str, set[int]]:
    where: dict[str, set[int]] = {}
    for i, upstream in enumerate((one, two)):
        for headers in upstream.headers:
            where.setdefault(headers["x-infercache-tenant"].removeprefix("open/"), set()).add(i)
    return where


def test_a_canary_at_ten_percent_takes_a_sticky_tenth_of_the_tenants(
    make_gateway: MakeGateway, fake: tuple[FakeUpstream, str], second: tuple[FakeUpstream, str]
) -> None:
    running, one, two, declared = canaried(
        make_gateway, fake, second, share=0.1, version="canary-1"
    )
    assert declared["rollout"]["share"] == 0.1
    tenants = [f"tenant-{i:03d}" for i in range(200)]
    with running.client() as client:
        for turn in range(2):
            for tenant in tenants:
                response = client.post(
                    "/v1/chat/completions",
                    json=chat(f"{tenant} asks {turn}"),
                    headers={"x-infercache-tenant": tenant},
                )
                assert response.status_code == 200
    where = tenant_replicas(running, one, two)
    assert set(where) == set(tenants)
    assert all(len(replicas) == 1 for replicas in where.values())  # one version per tenant
    on_canary = sum(1 for replicas in where.values() if replicas == {1})
    assert 16 <= on_canary <= 24, f"{on_canary} of 200 tenants on the canary"
    assert len(two.bodies) == 2 * on_canary


def test_a_conversation_never_switches_version(
    make_gateway: MakeGateway, fake: tuple[FakeUpstream, str], second: tuple[FakeUpstream, str]
) -> None:
    running, one, two, _ = canaried(make_gateway, fake, second, share=0.5, sticky="conversation")
    with running.client() as client:
        for c in range(30):
            messages: list[dict[str, str]] = [{"role": "user", "content": f"conversation {c}"}]
            for turn in range(3):
                body = {"model": "test-model", "messages": messages, "temperature": 0}
                answer = client.post("/v1/chat/completions", json=body).json()
                messages = [
                    *messages,
                    answer["choices"][0]["message"],
                    {"role": "user", "content": f"conversation {c} turn {turn + 1}"},
                ]
    for c in range(30):
        opening = f"conversation {c}"
        on = {
            i
            for i, u in enumerate((one, two))
            for b in u.bodies
            if b["messages"][0]["content"] == opening
        }
        assert len(on) == 1, f"conversation {c} went to {on}"
    assert one.bodies
    assert two.bodies


def test_shadow_traffic_is_mirrored_recorded_and_never_served(
    make_gateway: MakeGateway,
    fake: tuple[FakeUpstream, str],
    second: tuple[FakeUpstream, str],
    tmp_path: Path,
) -> None:
    (one, _), (two, two_url) = fake, second
    one.version, two.version = "fp_v1", "fp_shadow"
    workload = [(system, q) for _ in range(3) for system, q in QUESTIONS]

    def run(running: Running) -> list[tuple[str, str, str]]:
        out = []
        with running.client() as client:
            for system, question in workload:
                response = client.post("/v1/chat/completions", json=chat(question, system=system))
                answer = response.json()
                text = answer["choices"][0]["message"]["content"]
                out.append((response.headers["x-infercache"], answer["system_fingerprint"], text))
        return out

    plain = run(make_gateway(store_url=f"sqlite:///{tmp_path / 'plain.db'}"))
    log_path = tmp_path / "requests.jsonl"
    rollout = {"canary": [f"{two_url}/v1"], "share": 0.0, "shadow": 1.0}
    running, _, _ = two_replicas(make_gateway, fake, second, rollout=rollout, request_log=log_path)
    shadowed = run(running)
    shadow = running.built.gateway.versions.shadow
    assert shadow.wait_idle(30)
    hit_rate = [
        sum(1 for layer, _, _ in r if layer == "exact-hit") / len(r) for r in (plain, shadowed)
    ]
    assert abs(hit_rate[0] - hit_rate[1]) <= 0.02, hit_rate
    assert {fp for _, fp, _ in shadowed} == {"fp_v1"}  # nothing the shadow answered is served
    assert [t.split(" to ")[1] for _, _, t in shadowed] == [q for _, q in workload]
    assert len(two.bodies) == len(workload)  # it saw every request, hits included
    counts = gateway_stats(running.built.gateway)["shadow"]
    assert counts["answered"] == len(workload)
    assert set(counts["agreement"]) >= {"exact", "equality"}
    lines = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert sum(1 for line in lines if line.get("shadow")) == len(workload)
