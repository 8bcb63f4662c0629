"""Several gateway processes on one Redis: they share entries (exact and semantic), model swaps
and in-flight upstream calls — one call per key across replicas, taken over when the leading
gateway dies."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import RedisServer, start_redis
from tests.gateway.conftest import body
from tests.harness.processes import start, stop
from tests.harness.servers import free_port, serve
from tests.harness.upstreams import FakeUpstream


class Gateway:
    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process = process
        self.url = url

    def client(self, key: str | None = "adm") -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def stats(self) -> dict[str, Any]:
        with self.client() as client:
            data: dict[str, Any] = client.get("/stats").json()
            return data


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with start_redis(tmp_path) as server:
        yield server


@pytest.fixture
def upstream() -> Iterator[tuple[FakeUpstream, str]]:
    fake = FakeUpstream()
    with serve(fake.app) as url:
        yield fake, f"{url}/v1"


def launch(
    tmp_path: Path, redis: RedisServer, upstream_url: str, config_text: str, *extra: str
) -> list[Gateway]:
    """Two gateway processes, a and b, on one Redis, each with its own data dir."""
    config = tmp_path / "gateway.toml"
    config.write_text(config_text)
    running: list[Gateway] = []
    for name in ("a", "b"):
        port = free_port()
        process, _ = start(
            [
                "serve", "--port", str(port), "--store", redis.url(), "--upstream", upstream_url,
                "--config", str(config), "--admin-token", "adm", *extra,
            ],
            "gateway ready",
            on_stderr=False,
            env={"INFERCACHE_DATA_DIR": str(tmp_path / name)},
        )  # fmt: skip
        running.append(Gateway(process, f"http://127.0.0.1:{port}"))
    return running


GATEWAY_CONFIG = "[gateway]\nreplica_lease_s = 1\nversion_poll_s = 3600\n"


@pytest.fixture
def gateways(
    tmp_path: Path, redis: RedisServer, upstream: tuple[FakeUpstream, str]
) -> Iterator[list[Gateway]]:
    running = launch(tmp_path, redis, upstream[1], GATEWAY_CONFIG)
    yield running
    for gateway in running:
        stop(gateway.process)


@pytest.fixture
def semantic_gateways(
    tmp_path: Path, redis: RedisServer, upstream: tuple[FakeUpstream, str]
) -> Iterator[list[Gateway]]:
    """With the semantic layer: the packaged MiniLM at the threshold `tune` picked on public
    pairs (bench/README.md, "Threshold")."""
    config = GATEWAY_CONFIG + "[semantic]\nthreshold = 0.9316\n"
    running = launch(tmp_path, redis, upstream[1], config, "--semantic")
    yield running
    for gateway in running:
        stop(gateway.process)


def ask(gateway: Gateway, payload: dict[str, Any], out: list[Any]) -> None:
    """One request; its response, or the transport error (a gateway killed under it)."""
    with gateway.client(None) as client:
        try:
            out.append(client.post("/v1/chat/completions", json=payload))
        except httpx.TransportError as exc:
            out.append(exc)


def wait_until_waiting(gateway: Gateway, flights: int, waiting: int) -> None:
    """Poll the gateway's /stats (a real request each time) until its flights line up."""
    for _ in range(2000):
        stats = gateway.stats()
        if stats["flights"] >= flights and stats["waiting"] >= waiting:
            return
    raise AssertionError(f"{gateway.url} never had {waiting} waiting: {stats}")


def test_an_entry_and_a_model_swap_through_one_gateway_hold_through_the_other(
    gateways: list[Gateway],
) -> None:
    a, b = gateways
    with a.client(None) as ca, b.client(None) as cb:
        assert ca.post("/v1/chat/completions", json=body("q")).headers["x-infercache"] == "miss"
        assert (
            cb.post("/v1/chat/completions", json=body("q")).headers["x-infercache"] == "exact-hit"
        )
    with a.client() as admin:
        swap = admin.post("/admin/model-version", json={"model": "test-model", "version": "v9"})
        assert swap.json()["changed"] is True
    with b.client(None) as cb:
        after = cb.post("/v1/chat/completions", json=body("q"))
    assert after.headers["x-infercache"] == "miss"  # b serves no entry from before the swap


def test_ten_identical_misses_over_two_gateways_make_one_upstream_call(
    gateways: list[Gateway], upstream: tuple[FakeUpstream, str]
) -> None:
    fake, _ = upstream
    fake.hold()
    answers: list[httpx.Response] = []
    threads = [
        threading.Thread(target=ask, args=(gateways[i % 2], body("shared"), answers))
        for i in range(10)
    ]
    for t in threads:
        t.start()
    for gateway in gateways:
        wait_until_waiting(gateway, flights=1, waiting=4)  # a local leader and 4 beside it
    assert fake.calls == 1  # one gateway's leader calls; the other's waits on Redis
    fake.release()
    for t in threads:
        t.join(60)
    assert [r.status_code for r in answers] == [200] * 10
    assert len({r.json()["choices"][0]["message"]["content"] for r in answers}) == 1
    assert fake.calls == 1
    assert sorted(r.headers["x-infercache"] for r in answers).count("miss") == 1


def test_when_the_leading_gateway_dies_mid_call_the_others_waiters_get_an_answer(
    gateways: list[Gateway], upstream: tuple[FakeUpstream, str]
) -> None:
    a, b = gateways
    fake, _ = upstream
    fake.hold()
    lost: list[Any] = []
    orphan = threading.Thread(target=ask, args=(a, body("orphan"), lost))
    orphan.start()
    wait_until_waiting(a, flights=1, waiting=0)
    answers: list[httpx.Response] = []
    threads = [threading.Thread(target=ask, args=(b, body("orphan"), answers)) for _ in range(4)]
    for t in threads:
        t.start()
    wait_until_waiting(b, flights=1, waiting=3)
    assert fake.calls == 1  # a leads
    a.process.send_signal(signal.SIGKILL)  # mid-call
    a.process.wait(10)
    fake.release()  # a's call is answered into the void; b takes over once a's lease expires
    for t in threads:
        t.join(60)
    orphan.join(60)
    assert isinstance(lost[0], httpx.TransportError)  # its gateway died under it
    assert [r.status_code for r in answers] == [200] * 4
    assert fake.calls == 2
    assert len({r.json()["id"] for r in answers}) == 1


def semantic_vectors(gateway: Gateway) -> float:
    gauges = gateway.stats()["strategies"]["semantic"]["gauges"]
    return float(gauges.get("vectors", 0))


@pytest.mark.slow
def test_a_semantic_entry_added_through_one_gateway_is_a_semantic_hit_through_the_other(
    semantic_gateways: list[Gateway], upstream: tuple[FakeUpstream, str]
) -> None:
    a, b = semantic_gateways
    fake, _ = upstream
    with a.client(None) as ca, b.client(None) as cb:
        first = ca.post("/v1/chat/completions", json=body("How do I reset my password?"))
        assert first.headers["x-infercache"] == "miss"
        answered = time.monotonic()
        deadline = answered + 30  # for a readable failure; the bound asserted is 1 s
        while semantic_vectors(b) < 1:  # each poll a real request to b
            assert time.monotonic() < deadline, "the entry never reached b"
        reached_s = time.monotonic() - answered
        assert reached_s < 1.0, f"b indexed a's entry {reached_s:.2f} s after a answered"
        hit = cb.post("/v1/chat/completions", json=body("How can I reset my password?"))
        assert hit.headers["x-infercache"] == "semantic-hit"
        assert hit.json()["choices"] == first.json()["choices"]
        assert fake.calls == 1
        with a.client() as admin:
            swap = admin.post("/admin/model-version", json={"model": "test-model", "version": "v9"})
            assert swap.json()["changed"] is True
        after = cb.post("/v1/chat/completions", json=body("How can I reset my password?"))
    assert after.headers["x-infercache"] == "miss"  # b serves no semantic entry of before
    assert fake.calls == 2
