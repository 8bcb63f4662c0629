"""The per-node breakers of a Redis Cluster store (no server needed): a definite failure opens
its node at once, timeouts only in a row, a skip is counted, and only the watcher closes."""

from __future__ import annotations

import threading

import pytest

from infercache.clock import ManualClock
from infercache.stores.cluster_breaker import NodeBreakers, NodeBreakerSettings


def test_a_definite_failure_opens_its_node_at_once_and_only_that_node(clock: ManualClock) -> None:
    woken: list[int] = []
    breakers = NodeBreakers(clock, on_open=lambda: woken.append(1))
    breakers.failed("a:1", definite=True, why="connection refused")
    assert not breakers.allow("a:1")
    assert not breakers.allow("a:1")
    assert breakers.allow("b:2")
    assert breakers.open_nodes() == ["a:1"]
    assert woken == [1]  # the watcher is woken once, not per failure
    breakers.failed("a:1", definite=True)
    assert woken == [1]
    clock.advance(3.5)
    health = breakers.health()["a:1"]
    assert health == {"breaker": "open", "open_for_s": 3.5, "opened": 1, "skipped": 2}


def test_timeouts_open_a_node_only_when_they_come_in_a_row(clock: ManualClock) -> None:
    breakers = NodeBreakers(clock, NodeBreakerSettings(timeouts_to_open=3))
    for _ in range(2):
        breakers.failed("a:1", definite=False)
    breakers.succeeded("a:1")  # an answer in between: the count starts again
    for _ in range(2):
        breakers.failed("a:1", definite=False)
    assert breakers.allow("a:1")
    breakers.failed("a:1", definite=False)
    assert not breakers.allow("a:1")


def test_only_close_reopens_a_node_and_wakes_those_waiting(clock: ManualClock) -> None:
    breakers = NodeBreakers(clock)
    assert not breakers.close("a:1")  # was not open
    breakers.failed("a:1", definite=True)
    breakers.succeeded("a:1")  # a success elsewhere (a flight, say) does not close it
    assert breakers.is_open("a:1")
    assert not breakers.wait_closed("a:1", timeout_s=0.01)
    closer = threading.Thread(target=breakers.close, args=("a:1",))
    closer.start()
    assert breakers.wait_closed("a:1", timeout_s=10)
    closer.join(10)
    assert breakers.allow("a:1")
    assert breakers.health()["a:1"]["breaker"] == "closed"


@pytest.mark.parametrize("bad", [{"timeouts_to_open": 0}, {"watch_every_s": 0}])
def test_settings_refuse_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        NodeBreakerSettings(**bad)  # type: ignore[arg-type]
