"""The gateway's miss path over real loopback HTTP: one upstream call per key, every reader
answered, every Miss closed exactly once — even when closing it raises."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from infercache.gateway.stats import gateway_stats
from tests.gateway.conftest import MakeGateway, Running, body
from tests.harness.flight_watch import FlightWatch

pytestmark = pytest.mark.concurrency


def post(running: Running, payload: Any) -> httpx.Response:
    with running.client() as client:
        return client.post("/v1/chat/completions", json=payload)


def wait_for_waiters(running: Running, n: int) -> None:
    """Until one flight is in progress with `n` requests waiting on it."""
    assert FlightWatch(running.built.gateway.flights).flights(1, n)


def run_concurrently(running: Running, payloads: list[dict[str, Any]]) -> list[httpx.Response]:
    responses: list[httpx.Response | None] = [None] * len(payloads)

    def call(i: int) -> None:
        responses[i] = post(running, payloads[i])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(payloads))]
    for t in threads:
        t.start()
    wait_for_waiters(running, len(payloads) - 1)
    running.fake.release()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a reader hangs"
    return [r for r in responses if r is not None]


def test_a_close_that_raises_still_answers_every_reader_and_closes_every_miss_once(
    make_gateway: MakeGateway,
) -> None:
    running = make_gateway()

    def explode(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug while storing")

    running.built.cache.exact.store = explode  # type: ignore[method-assign]
    running.fake.hold()
    payloads = [body(stream=i % 2 == 0) for i in range(6)]
    responses = run_concurrently(running, payloads)
    assert running.fake.calls == 1
    # The flight settled with the answer before the store was written: every reader has it.
    for payload, response in zip(payloads, responses, strict=True):
        assert response.status_code == 200
        if payload["stream"]:
            assert response.text.endswith("data: [DONE]\n\n")
        else:
            assert response.json()["choices"][0]["message"]["content"].startswith("answer #1")
    exact = running.exact()
    assert exact["lookups"] == 6  # one close per Miss: the leader's and five waiters'
    assert exact["hits"] == exact["counters"]["coalesced"] == 5
    assert gateway_stats(running.built.gateway)["flights"] == 0
    assert running.exact()["counters"].get("stored", 0) == 0
    del running.built.cache.exact.store  # the bug fixed: the same gateway serves on
    assert post(running, body("still serving")).status_code == 200
    assert post(running, body("still serving")).headers["x-infercache"] == "exact-hit"


def test_waiters_get_the_whole_answer_when_the_leader_hangs_up(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    running.fake.hold()
    hang_up = threading.Event()

    def leader() -> None:
        with (
            running.client() as client,
            client.stream("POST", "/v1/chat/completions", json=body(stream=True)) as response,
        ):
            raw = response.iter_raw()  # kept: a dropped iterator closes the connection
            next(raw)  # the role chunk arrived
            assert hang_up.wait(30)  # then hang up mid-answer

    thread = threading.Thread(target=leader)
    thread.start()
    wait_for_waiters(running, 0)
    watch = FlightWatch(running.built.gateway.flights)
    (flight,) = watch.table.in_progress().values()
    assert watch.readers(flight, 1)  # the leader's stream reads it
    waiter: list[httpx.Response] = []
    waiter_thread = threading.Thread(target=lambda: waiter.append(post(running, body())))
    waiter_thread.start()
    assert watch.readers(flight, 2)  # and the waiter awaits it
    hang_up.set()
    thread.join(30)
    assert watch.readers(flight, 1)  # the gateway saw the leader leave
    running.fake.release()
    waiter_thread.join(30)
    assert running.fake.cancelled_streams == 0
    assert waiter[0].status_code == 200
    assert waiter[0].json()["choices"][0]["message"]["content"].startswith("answer #1")
    assert post(running, body()).headers["x-infercache"] == "exact-hit"  # and it was stored
