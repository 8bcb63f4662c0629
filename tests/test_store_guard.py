"""The store guard: a call over budget is a StoreUnavailableError, failures open the breaker,
an open breaker skips the store at once, and a probe after the backoff closes it again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.errors import StoreError, StoreUnavailableError
from infercache.settings import Settings
from infercache.store_guard import BreakerSettings, CircuitBreaker, GuardedBackend
from infercache.stores import Backend
from infercache.stores.memory import MemoryStore
from tests.harness.upstreams import CountingUpstream
from tests.harness.vocabulary import chat


class Stallable(MemoryStore):
    """A real memory store whose server can be paused, as a client with a socket timeout sees
    it: a call waits `timeout_s` for the paused server, then fails (StoreError); or it can be
    made to fail at once (connection refused)."""

    def __init__(self, clock: ManualClock, timeout_s: float = 0.05) -> None:
        super().__init__(max_bytes=1 << 20, clock=clock, url="memory://stallable")
        self.running = threading.Event()
        self.running.set()
        self.failing = False
        self.timeout_s = timeout_s

    def _gate(self) -> None:
        if self.failing:
            raise StoreError("connection refused")
        if not self.running.wait(self.timeout_s):
            raise StoreError(f"timed out after {self.timeout_s} s")

    def get_with_meta(self, key, names):  # type: ignore[no-untyped-def]
        self._gate()
        return super().get_with_meta(key, names)

    def put(self, key, entry):  # type: ignore[no-untyped-def]
        self._gate()
        super().put(key, entry)


@pytest.fixture
def stallable(clock: ManualClock) -> Iterator[Stallable]:
    store = Stallable(clock)
    yield store
    store.running.set()


def guarded(store: Backend, clock: ManualClock) -> GuardedBackend:
    return GuardedBackend(store, clock=clock, budget_s=0.05, breaker=BreakerSettings(3, 1.0, 4.0))


def test_the_breaker_opens_probes_and_closes(clock: ManualClock) -> None:
    breaker = CircuitBreaker(
        clock, BreakerSettings(failures_to_open=2, backoff_s=1, max_backoff_s=4)
    )
    assert breaker.allow()
    breaker.record(False)
    assert breaker.state == "closed"
    breaker.record(False)
    assert breaker.state == "open"
    assert not breaker.allow()
    clock.advance(1.0)
    assert breaker.allow()  # the one probe
    assert not breaker.allow()  # nobody else while it runs
    breaker.record(False)  # the probe failed: a longer backoff
    clock.advance(1.0)
    assert not breaker.allow()
    clock.advance(1.0)
    assert breaker.allow()
    breaker.record(True)
    assert breaker.state == "closed"
    assert breaker.allow()
    assert breaker.opened == 1


def test_a_stalled_store_costs_the_budget_then_nothing(
    stallable: Stallable, clock: ManualClock
) -> None:
    store = guarded(stallable, clock)
    stallable.running.clear()  # paused: each call times out at the client's timeout
    for _ in range(3):
        with pytest.raises(StoreError, match="timed out"):
            store.get_with_meta("k", [])
    assert store.breaker.state == "open"
    with pytest.raises(StoreUnavailableError, match="skipped"):
        store.get_with_meta("k", [])  # at once: no wait while the breaker is open
    assert store.skipped == 1
    stallable.running.set()  # resumed
    clock.advance(1.0)
    assert store.get_with_meta("k", []) == (None, {})  # the probe succeeds
    assert store.breaker.state == "closed"
    store.close()


def test_an_answer_over_budget_is_used_and_counted_not_held_against_the_store(
    clock: ManualClock,
) -> None:
    class Slow(MemoryStore):
        def get_with_meta(self, key, names):  # type: ignore[no-untyped-def]
            clock.advance(0.2)  # the call took 200 ms on the injected clock
            return super().get_with_meta(key, names)

    store = guarded(Slow(max_bytes=1 << 20, clock=clock, url="memory://slow"), clock)
    for _ in range(3):
        assert store.get_with_meta("k", []) == (None, {})
    assert store.over_budget == 3
    assert store.breaker.state == "closed"  # slow but whole answers: the store stays in use


def test_failures_open_the_breaker_too(stallable: Stallable, clock: ManualClock) -> None:
    store = guarded(stallable, clock)
    stallable.failing = True
    for _ in range(3):
        with pytest.raises(StoreError, match="refused"):
            store.get_with_meta("k", [])
    with pytest.raises(StoreUnavailableError):
        store.get_with_meta("k", [])
    store.close()


def test_through_the_cache_a_stall_is_a_counted_miss_and_hits_resume(
    stallable: Stallable, clock: ManualClock, tmp_path: Path, upstream: CountingUpstream
) -> None:
    backend = guarded(stallable, clock)
    cache = Cache(Settings(data_dir=tmp_path, default_ttl_s=600), clock=clock, backend=backend)
    assert cache.complete(chat(), upstream).layer is Layer.MISS
    assert cache.complete(chat(), upstream).layer is Layer.EXACT
    stallable.running.clear()
    for _ in range(5):
        assert cache.complete(chat(), upstream).layer is Layer.MISS  # answered, no hit
    misses = cache.stats()["strategies"]["exact"]["misses"]
    # The first lookups time out (store errors) and open the breaker; later ones skip it.
    assert misses.get("store_error", 0) + misses.get("store_unavailable", 0) == 5
    assert misses["store_unavailable"] >= 1
    stallable.running.set()
    clock.advance(4.0)  # the longest backoff: the upstream's latency let probes fail meanwhile
    assert cache.complete(chat(), upstream).layer is Layer.EXACT  # the probe was the lookup
    cache.close()
