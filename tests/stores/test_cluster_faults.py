"""A Redis Cluster with a master down costs the keys on that master their hits, and nothing
else: not latency, not the other masters' hits, not the start of a store. On real clusters
(tests/conftest.py): 3 masters with `cluster-require-full-coverage no`, and 3 masters with a
replica each for a failover. Before this, one dead master cost a call 2.8 s (redis-py's ten
retries), and a store opened during the outage cached nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from infercache.clock import ManualClock
from infercache.errors import NodeUnavailableError, StoreError
from infercache.store_guard import GuardedBackend
from infercache.stores.base import Entry
from infercache.stores.redis_cluster import RedisClusterStore
from infercache.stores.replica_flight import FlightTimings, open_flights
from tests.conftest import RedisClusterServers

BUDGET_S = 0.05  # the gateway's default store budget: the socket timeout of every call
ROOM_S = 0.25  # what a call may take here, on a busy 2-core box
STALL_S = 2.5  # what no call may take: a call on the dead master cost 2.8 s before
KEYS = [f"key {i}" for i in range(60)]
META = ["model:m"]

MakeStore = Callable[..., RedisClusterStore]


def entry(clock: ManualClock, text: str) -> Entry:
    now = clock.now_s()
    return Entry(text.encode(), "m", "1:v1", (), now, now + 600, 0.1, 1, 1)


@pytest.fixture
def make_store(redis_prefix: str, clock: ManualClock) -> Iterator[MakeStore]:
    made: list[RedisClusterStore] = []

    def make(cluster: RedisClusterServers) -> RedisClusterStore:
        store = RedisClusterStore(
            cluster.url(), clock=clock, prefix=redis_prefix, socket_timeout_s=BUDGET_S
        )
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def port_of(store: RedisClusterStore, key: str) -> int:
    return int(store.nodes.node_of(store._entry_key(key)).port)


def assert_never_stalled(seconds: list[float]) -> None:
    """At most one call in a hundred over `ROOM_S` (a box shared with other suites stalls a
    thread now and then, as it did for 1.4 s once), none anywhere near the old cost."""
    ordered = sorted(seconds)
    assert ordered[int(0.99 * (len(ordered) - 1))] < ROOM_S, ordered[-3:]
    assert ordered[-1] < STALL_S, ordered[-3:]


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, the result or the StoreError raised)."""
    started = time.monotonic()
    try:
        result = call()
    except StoreError as exc:
        result = exc
    return time.monotonic() - started, result


def seeded(
    store: RedisClusterStore, clock: ManualClock
) -> tuple[RedisClusterStore, GuardedBackend]:
    """`store` with meta and every key of KEYS written and read back with the meta, and its
    guard. Read back on the healthy cluster: a bucket's meta copy that the store's start left
    to repair later (a node slow to answer on a loaded box) is repaired now, so every test
    starts from a complete layout."""
    guard = GuardedBackend(store, clock=clock, budget_s=BUDGET_S)
    store.write_meta("model:m", "1:v1")
    for key in KEYS:
        store.put(key, entry(clock, key))
    for key in KEYS:
        found, meta = store.get_with_meta(key, META)
        assert found is not None, key
        assert meta == {"model:m": "1:v1"}, (key, meta)
    return store, guard


def test_a_dead_master_costs_its_keys_their_hits_and_nothing_else(
    fault_cluster: RedisClusterServers, make_store: MakeStore, clock: ManualClock
) -> None:
    store, guard = seeded(make_store(fault_cluster), clock)
    victim = port_of(store, KEYS[0])
    node = f"127.0.0.1:{victim}"
    dead = [k for k in KEYS if port_of(store, k) == victim]
    fault_cluster.kill(victim)
    try:
        rounds = [[timed(lambda k=k: guard.get_with_meta(k, META)) for k in KEYS] for _ in range(3)]
        write_s, refused = timed(lambda: guard.write_meta("model:m", "2:v2"))
    finally:
        fault_cluster.restart(victim)
    assert_never_stalled([s for answers in rounds for s, _ in answers])
    for answers in rounds:
        for key, (_, got) in zip(KEYS, answers, strict=True):
            if key in dead:
                assert isinstance(got, NodeUnavailableError), key
            else:  # the live masters' keys: hits, their meta read beside them
                assert got[0].response == key.encode(), key
                assert got[1] == {"model:m": "1:v1"}, key
    # The first call on a dead key opened the node; every later one skipped it unasked.
    assert store.health()["nodes"][node]["skipped"] >= 3 * len(dead) - 1
    assert guard.breaker.state == "closed"  # the whole store was never skipped
    assert isinstance(refused, NodeUnavailableError)  # refused before anything was written
    assert write_s < STALL_S
    assert store.breakers.wait_closed(node, timeout_s=10)  # the watcher found it back
    # It restarted empty: its keys are misses, stored again, then hits.
    assert [guard.get(k) for k in dead] == [None] * len(dead)
    for key in dead:
        guard.put(key, entry(clock, key))
    assert [guard.get_with_meta(k, META)[1] for k in dead] == [{"model:m": "1:v1"}] * len(dead)
    assert all(guard.get(k) is not None for k in KEYS)


def test_a_store_opened_while_home_is_down_serves_the_live_masters(
    fault_cluster: RedisClusterServers, make_store: MakeStore, clock: ManualClock
) -> None:
    """Home (bucket 0: the layout and the allocator) is the hardest master to lose."""
    first = make_store(fault_cluster)
    first.write_meta("model:m", "1:v1")
    for key in KEYS:
        first.put(key, entry(clock, key))
    home = int(first.nodes.node_of(first.meta.home_key()).port)
    fault_cluster.kill(home)
    try:
        open_s, second = timed(lambda: make_store(fault_cluster))
        read_s, read = timed(lambda: second.read_meta(META))  # what a start-up check reads
        answers = [timed(lambda k=k: second.get_with_meta(k, META)) for k in KEYS]
        live_new = next(f"new {i}" for i in range(100) if port_of(second, f"new {i}") != home)
        second.put(live_new, entry(clock, live_new))
        stored_new = second.get(live_new)
        _, refused = timed(lambda: second.write_meta("model:m", "2:v2"))
    finally:
        fault_cluster.restart(home)
    assert open_s < STALL_S
    assert read == {"model:m": "1:v1"}  # from a live bucket's copy, home's being away
    assert_never_stalled([read_s] + [s for s, _ in answers])
    for key, (_, got) in zip(KEYS, answers, strict=True):
        if port_of(second, key) == home:
            assert isinstance(got, NodeUnavailableError), key
        else:
            assert got[0] is not None, key
            assert got[1] == {"model:m": "1:v1"}, key
    assert stored_new is not None
    assert isinstance(refused, NodeUnavailableError)
    assert second.breakers.wait_closed(f"127.0.0.1:{home}", timeout_s=10)
    # Home came back empty: the next write restores it from the other copies, then goes on.
    second.write_meta("model:m", "2:v2")
    assert second.read_meta(META) == {"model:m": "2:v2"}
    assert first.get_with_meta(KEYS[1], META)[1] == {"model:m": "2:v2"}


def test_a_flight_on_a_skipped_node_is_refused_at_once_and_a_stalled_one_within_its_budget(
    fault_cluster: RedisClusterServers, make_store: MakeStore, clock: ManualClock
) -> None:
    store = make_store(fault_cluster)
    victim = fault_cluster.masters()[0]
    node = f"127.0.0.1:{victim}"
    flights = open_flights(
        f"{fault_cluster.url()}?prefix={store.prefix}",
        clock=clock,
        timings=FlightTimings(call_ms=int(BUDGET_S * 1000)),
        nodes=store.connected_nodes,
    )
    on_victim = next(  # a flight key whose lease lives on the victim
        f"f{i}" for i in range(1000) if store.nodes.node_of(f"{{fl:f{i}}}").port == victim
    )

    async def join(key: str) -> tuple[float, Any]:
        started = time.monotonic()
        try:
            result: Any = await flights.join(key, timeout_s=5)
        except StoreError as exc:
            result = exc
        return time.monotonic() - started, result

    async def scenario() -> list[tuple[float, Any]]:
        first = await join("warm")
        os.kill(fault_cluster.pid(victim), signal.SIGSTOP)
        try:
            stalled = await join(on_victim)
        finally:
            os.kill(fault_cluster.pid(victim), signal.SIGCONT)
        store.breakers.failed(node, definite=True, why="the store saw it fail")
        skipped = await join(on_victim)
        await flights.aclose()
        return [first, stalled, skipped]

    first, stalled, skipped = asyncio.run(scenario())
    assert not isinstance(first[1], StoreError)
    assert isinstance(stalled[1], StoreError)
    assert stalled[0] < STALL_S  # cut at its 50 ms budget
    assert isinstance(skipped[1], NodeUnavailableError)
    assert skipped[0] < ROOM_S  # refused before any call
    assert store.breakers.wait_closed(node, timeout_s=10)  # the store's watcher closes it


def test_a_replica_that_takes_over_a_dead_master_brings_its_keys_back(
    failover_cluster: RedisClusterServers, make_store: MakeStore, clock: ManualClock
) -> None:
    store = make_store(failover_cluster)
    guard = GuardedBackend(store, clock=clock, budget_s=BUDGET_S)
    for key in KEYS:
        guard.put(key, entry(clock, key))
    failover_cluster.wait_replicated()
    victim = port_of(store, KEYS[0])
    dead = [k for k in KEYS if port_of(store, k) == victim]
    failover_cluster.kill(victim)
    killed = time.monotonic()
    took_over_s = served_s = None
    seconds: list[float] = []
    try:
        # Until both are seen (the store may find the promoted replica, through a node that
        # knows, before the node redis-cli asks lists it as a master: either can come first).
        while (served_s is None or took_over_s is None) and time.monotonic() - killed < 20:
            if served_s is None:
                answers = [timed(lambda k=k: guard.get(k)) for k in dead]
                seconds.extend(s for s, _ in answers)
                if all(isinstance(got, Entry) for _, got in answers):
                    served_s = time.monotonic() - killed
            if took_over_s is None and len(failover_cluster.masters()) == 3:
                took_over_s = time.monotonic() - killed
    finally:
        failover_cluster.restart(victim)  # it rejoins as a replica
    assert took_over_s is not None
    assert served_s is not None
    assert served_s <= took_over_s + 2.0, (took_over_s, served_s)
    assert_never_stalled(seconds)
    assert guard.breaker.state == "closed"
    assert all(guard.get(k) is not None for k in KEYS)  # nothing lost: the replica had it all


def test_a_restarted_master_serving_reads_is_used_before_it_rejoins(
    rejoin_cluster: RedisClusterServers, make_store: MakeStore, clock: ManualClock
) -> None:
    """A restarted master stays in `cluster_state:fail` ~2 s (Redis' rejoin delay); with
    `cluster-allow-reads-when-down yes` it serves reads meanwhile, and its keys hit again as
    soon as it answers: within 2 s of the restart (issue 30 item 1). A write to it then fails
    alone and does not take the node out of use."""
    store, guard = seeded(make_store(rejoin_cluster), clock)
    victim = port_of(store, KEYS[0])
    node = f"127.0.0.1:{victim}"
    dead = [k for k in KEYS if port_of(store, k) == victim]
    rejoin_cluster.kill(victim)
    assert isinstance(timed(lambda: store.get(dead[0]))[1], NodeUnavailableError)
    restarted = time.monotonic()
    rejoin_cluster.restart(victim, wait=False)
    try:
        assert store.breakers.wait_closed(node, timeout_s=10)  # the watcher: it serves reads
        answers = [timed(lambda k=k: store.get_with_meta(k, META)) for k in dead]
        served_s = time.monotonic() - restarted
        state = rejoin_cluster.cluster_state(victim)
        _, write = timed(lambda: guard.put(dead[0], entry(clock, "again")))
        in_use = not store.breakers.is_open(node)
    finally:
        rejoin_cluster.wait_ok()
    assert not [got for _, got in answers if isinstance(got, StoreError)], answers[:2]
    assert [got[0].response for _, got in answers] == [k.encode() for k in dead]
    assert all(got[1] == {"model:m": "1:v1"} for _, got in answers)
    assert served_s < 2.0, served_s
    if state == "fail":  # still rejoining (on a stalled box it may have finished): writes wait
        assert isinstance(write, NodeUnavailableError)  # the write alone, not the store
        assert in_use
    assert guard.breaker.state == "closed"
