"""Several upstream replicas: one that dies is ejected and its requests go to the others; a
non-streaming request that failed before any byte is retried once elsewhere, so no client
sees the failure; the dead replica is probed again after its backoff."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from infercache.clock import ManualClock
from infercache.gateway.router import PrefixRouter, RouterConfig
from tests.gateway.conftest import MakeGateway, Running, body
from tests.harness.servers import serve
from tests.harness.upstreams import FakeUpstream

SYSTEMS = [
    f"You are assistant number {i}. " + "Answer briefly and politely. " * 20 for i in range(9)
]


def ask(running: Running, system: int, question: str, **fields: Any) -> int:
    payload = body(question, **fields)
    payload["messages"][0]["content"] = SYSTEMS[system]
    with running.client() as client:
        return client.post("/v1/chat/completions", json=payload).status_code


def served_by(fakes: list[FakeUpstream], system: int) -> set[int]:
    return {
        i
        for i, fake in enumerate(fakes)
        for b in fake.bodies
        if b["messages"][0]["content"] == SYSTEMS[system]
    }


def test_a_killed_replica_fails_no_request_and_its_prefixes_move(make_gateway: MakeGateway) -> None:
    fakes = [FakeUpstream() for _ in range(3)]
    with ExitStack() as replicas:
        stacks = [ExitStack() for _ in fakes]
        urls = [stack.enter_context(serve(f.app)) for stack, f in zip(stacks, fakes, strict=True)]
        for stack in stacks:
            replicas.enter_context(stack)
        running = make_gateway(upstreams=tuple(f"{u}/v1" for u in urls))
        for s in range(len(SYSTEMS)):
            assert ask(running, s, "first question") == 200
        homes = {s: served_by(fakes, s) for s in range(len(SYSTEMS))}
        assert all(len(h) == 1 for h in homes.values())
        victim = next(iter(homes[0]))
        stacks[victim].close()  # the replica dies mid-run
        moved = [s for s, h in homes.items() if victim in h]
        for s in range(len(SYSTEMS)):
            assert ask(running, s, "second question") == 200  # retried: nobody sees it
            assert ask(running, s, "third question", stream=True) == 200
        for s in moved:
            assert served_by(fakes, s) - {victim}, f"prefix {s} did not move"
    health = running.built.gateway.router.health()
    assert health[victim] in ("ejected", "probing")  # out until a probe finds it back
    assert [h for i, h in enumerate(health) if i != victim] == ["healthy", "healthy"]


def test_an_ejected_replica_is_probed_after_its_backoff_and_restored() -> None:
    clock = ManualClock()
    router: PrefixRouter[str] = PrefixRouter(
        ["a", "b"], RouterConfig(eject_s=1.0, max_eject_s=4.0), monotonic_s=clock.monotonic_s
    )
    prompt = body("q")
    router.failed(0)
    assert {router.route("t", prompt)[0] for _ in range(5)} == {1}
    clock.advance(1.0)
    assert router.health()[0] == "probing"
    with router.lease("t", prompt, exclude=[1]) as index:
        assert index == 0
    router.failed(0)  # the probe failed: a longer backoff
    clock.advance(1.0)
    assert router.health()[0] == "ejected"
    clock.advance(1.0)
    router.succeeded(0)
    assert router.health() == ["healthy", "healthy"]


def test_with_every_replica_ejected_the_soonest_back_is_tried() -> None:
    clock = ManualClock()
    router: PrefixRouter[str] = PrefixRouter(["a", "b"], monotonic_s=clock.monotonic_s)
    router.failed(1)
    clock.advance(0.5)
    router.failed(0)
    assert router.route("t", body("q"))[0] == 1
