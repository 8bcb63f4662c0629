"""Promotion, rollback and an upgrade under a hit-only load (issue 29 acceptance 4, 5): two
gateways on the real redis-server share what a promotion retires, a rollback's old entries are
hits again at once, and replicas restarted on a new version are noticed without a miss."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RedisServer, start_redis
from tests.gateway.conftest import MakeGateway, Running
from tests.harness.servers import serve
from tests.harness.upstreams import FakeUpstream
from tests.harness.vocabulary import chat

QUESTIONS = [(f"You are assistant {i % 5}.", f"question {i}?") for i in range(20)]


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    (tmp_path / "redis").mkdir()
    with start_redis(tmp_path / "redis") as server:
        yield server


@pytest.fixture
def second() -> Iterator[tuple[FakeUpstream, str]]:
    upstream = FakeUpstream()
    with serve(upstream.app) as url:
        yield upstream, url


def ask_all(running: Running, questions: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(x-infercache, system_fingerprint) of each question's answer."""
    out = []
    with running.client() as client:
        for system, question in questions:
            response = client.post("/v1/chat/completions", json=chat(question, system=system))
            assert response.status_code == 200, response.text
            out.append((response.headers["x-infercache"], response.json()["system_fingerprint"]))
    return out


def read_versions(running: Running) -> None:
    """One background round of the gateway's version reads, run now on its own loop."""
    prober = running.built.gateway.prober
    assert prober is not None
    loop = running.built.app.state.loop
    asyncio.run_coroutine_threadsafe(prober.round(), loop).result(30)


def test_a_promotion_retires_the_old_version_for_every_gateway_on_a_shared_redis(
    make_gateway: MakeGateway,
    fake: tuple[FakeUpstream, str],
    second: tuple[FakeUpstream, str],
    redis: RedisServer,
) -> None:
    (old, old_url), (new, new_url) = fake, second
    old.version, new.version = "fp_v1", "fp_v2"
    upstreams = (f"{old_url}/v1", f"{new_url}/v1")
    store = redis.url()
    first, other = (
        make_gateway(store_url=store, upstreams=upstreams, admin_token="adm", version_poll_s=None)
        for _ in range(2)
    )
    served = ask_all(first, QUESTIONS[:10]) + ask_all(other, QUESTIONS[10:])
    assert {fp for _, fp in served} == {"fp_v1", "fp_v2"}  # both versions live, both gateways
    assert {fp for _, fp in ask_all(other, QUESTIONS)} == {"fp_v1", "fp_v2"}
    with first.client("adm") as admin:
        declared = admin.post("/admin/rollout", json={"canary": [f"{new_url}/v1"], "share": 0.1})
        assert declared.status_code == 200, declared.text
        promoted = admin.post("/admin/rollout/promote")
        assert promoted.json()["retired"] == {"test-model": ["fp_v1"]}
    for running in (other, first):  # no answer of the old version, through either gateway
        after = ask_all(running, QUESTIONS)
        assert {fp for _, fp in after} == {"fp_v2"}, after
    assert {fp for _, fp in ask_all(other, QUESTIONS)} == {"fp_v2"}


def test_a_rollback_serves_the_old_versions_fresh_entries_again_at_once(
    make_gateway: MakeGateway,
    fake: tuple[FakeUpstream, str],
    second: tuple[FakeUpstream, str],
    redis: RedisServer,
) -> None:
    replicas = (fake[0], second[0])
    for replica in replicas:
        replica.models_version, replica.version = "v1", "fp_v1"
    upstreams = (f"{fake[1]}/v1", f"{second[1]}/v1")
    first, other = (
        make_gateway(store_url=redis.url(), upstreams=upstreams, version_poll_s=None)
        for _ in range(2)
    )
    for running in (first, other):
        read_versions(running)
    questions = [(s, f"rollback {q}") for s, q in QUESTIONS]
    assert [layer for layer, _ in ask_all(first, questions)] == ["miss"] * 20
    assert ask_all(other, questions) == [("exact-hit", "fp_v1")] * 20
    for replica in replicas:  # a deploy of v2 on every replica: v1 is retired
        replica.models_version, replica.version = "v2", "fp_v2"
    read_versions(first)
    assert {fp for _, fp in ask_all(other, questions)} == {"fp_v2"}
    calls = sum(r.calls for r in replicas)
    for replica in replicas:  # rolled back: v1's entries, still within their TTL, are hits
        replica.models_version, replica.version = "v1", "fp_v1"
    # Each gateway's background reads: `other` never saw v2, so no replica of its moved; it
    # learns from the store that v1 is live again on its read after `first` revived it.
    for running in (other, first, other):
        read_versions(running)
    assert ask_all(first, questions) == [("exact-hit", "fp_v1")] * 20
    assert ask_all(other, questions) == [("exact-hit", "fp_v1")] * 20
    assert sum(r.calls for r in replicas) == calls  # not one upstream call: no cold start


Served = list[tuple[float, str, str | None]]  # (when, x-infercache, system_fingerprint)


def hit_only_load(running: Running, served: Served, stop: threading.Event) -> None:
    """Ask the cached questions again and again until `stop` (errors while replicas are down
    are recorded without a fingerprint)."""
    with running.client() as client:
        while not stop.is_set():
            for system, question in QUESTIONS:
                response = client.post("/v1/chat/completions", json=chat(question, system=system))
                ok = response.status_code == 200
                fingerprint = response.json()["system_fingerprint"] if ok else None
                layer = response.headers.get("x-infercache", str(response.status_code))
                served.append((time.monotonic(), layer, fingerprint))


@contextlib.contextmanager
def under_hit_load(running: Running) -> Iterator[Served]:
    """QUESTIONS asked once (misses) and again (v1's exact hits), then asked over and over on
    a thread (`hit_only_load`) for the block; what was served, stamped."""
    assert [layer for layer, _ in ask_all(running, QUESTIONS)] == ["miss"] * 20
    assert ask_all(running, QUESTIONS) == [("exact-hit", "fp_v1")] * 20
    served: Served = []
    stop = threading.Event()
    load = threading.Thread(target=hit_only_load, args=(running, served, stop))
    load.start()
    try:
        yield served
    finally:
        stop.set()
        load.join(60)


def wait_for_change(running: Running, swaps: int, rounds: int = 30) -> None:
    """Wait (on the prober's rounds, not a sleep) until the gateway recorded a version change,
    then two rounds more, so the load is answered by the new version for a while."""
    prober = running.built.gateway.prober
    assert prober is not None
    for _ in range(rounds):
        assert prober.wait_rounds(prober.rounds + 1, 30)
        if running.built.gateway.tracker.swaps > swaps:
            assert prober.wait_rounds(prober.rounds + 2, 30)
            return
    raise AssertionError(f"no version change in {rounds} rounds")


def assert_no_old_answer_late(served: Served, gone: float) -> float:
    late_old = [t - gone for t, _, fp in served if fp == "fp_v1" and t > gone]
    last_old_s = max(late_old, default=0.0)
    assert last_old_s <= 10.0, f"an old answer {last_old_s:.1f} s after the upgrade"
    tail = [fp for t, _, fp in served if t > gone + last_old_s and fp is not None]
    assert tail
    assert set(tail) == {"fp_v2"}
    assert any(layer == "exact-hit" and fp == "fp_v2" for _, layer, fp in served)
    return last_old_s


def test_an_upgrade_under_a_hit_only_load_is_seen_through_v1_models(
    make_gateway: MakeGateway, fake: tuple[FakeUpstream, str], second: tuple[FakeUpstream, str]
) -> None:
    """Both replicas restarted on v2 at once (no downtime seen), reporting it in /v1/models."""
    replicas = (fake[0], second[0])
    for replica in replicas:
        replica.version, replica.models_version = "fp_v1", "v1"
    running = make_gateway(upstreams=(f"{fake[1]}/v1", f"{second[1]}/v1"), version_poll_s=1.0)
    with under_hit_load(running) as served:
        swaps = running.built.gateway.tracker.swaps
        for replica in replicas:
            replica.version, replica.models_version = "fp_v2", "v2"
        gone = time.monotonic()  # the last old replica is gone
        wait_for_change(running, swaps)
    assert_no_old_answer_late(served, gone)


def test_an_upgrade_under_a_hit_only_load_is_seen_from_fingerprints_after_a_restart(
    make_gateway: MakeGateway,
) -> None:
    """Replicas that offer only fingerprints, stopped and started again on v2 on their ports:
    the gateway finds them unreachable, holds their cached answers, and probes them."""
    stacks = [contextlib.ExitStack() for _ in range(2)]
    restarted = [contextlib.ExitStack() for _ in range(2)]
    try:
        olds = [FakeUpstream() for _ in range(2)]
        urls = [
            stack.enter_context(serve(old.app)) for stack, old in zip(stacks, olds, strict=True)
        ]
        for old in olds:
            old.version = "fp_v1"
        running = make_gateway(
            upstreams=tuple(f"{u}/v1" for u in urls), version_poll_s=1.0, version_probe_s=1.0
        )
        with under_hit_load(running) as served:
            swaps = running.built.gateway.tracker.swaps
            for stack in stacks:  # both replicas go down
                stack.close()
            gone = time.monotonic()
            prober = running.built.gateway.prober
            assert prober is not None
            assert prober.wait_rounds(prober.rounds + 2, 30)  # they were found unreachable
            for stack, url in zip(restarted, urls, strict=True):  # and come back on v2
                new = FakeUpstream()
                new.version = "fp_v2"
                stack.enter_context(serve(new.app, port=int(url.rsplit(":", 1)[1])))
            wait_for_change(running, swaps)
        assert_no_old_answer_late(served, gone)
    finally:
        for stack in (*restarted, *stacks):
            stack.close()
