"""One upstream call per key across replicas, against real servers: every async client stands
for another gateway process (and one test uses a real process, killed mid-call)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import redis

from infercache.clock import ManualClock, SystemClock
from infercache.errors import StoreError
from infercache.stores.redis_cluster import RedisClusterStore
from infercache.stores.redis_connect import async_client, sync_client
from infercache.stores.replica_flight import (
    FlightLease,
    FlightTimings,
    ReplicaFlights,
    SharedAnswer,
    open_flights,
)
from tests.conftest import RedisClusterServers, RedisServer
from tests.harness.servers import free_port

pytestmark = pytest.mark.anyio
MakeFlights = Callable[..., ReplicaFlights]
COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}}],
}


class Servers:
    """One Redis, or a cluster whose flights go through a cluster store's nodes, as a gateway
    routes them (stores/async_nodes.py)."""

    def __init__(
        self, url: str, ports: list[int], prefix: str, store: RedisClusterStore | None = None
    ) -> None:
        self.url, self.ports, self.prefix, self.store = url, ports, prefix, store
        self.made: list[ReplicaFlights] = []

    def flights(
        self, clock: ManualClock | SystemClock | None = None, **timings: int
    ) -> ReplicaFlights:
        if self.store is None:
            client = async_client(self.url, socket_timeout_s=None)
            made = ReplicaFlights(
                client,
                clock=clock or SystemClock(),
                prefix=self.prefix,
                timings=FlightTimings(**timings),
            )
        else:
            made = open_flights(
                f"{self.url}?prefix={self.prefix}",
                clock=clock or SystemClock(),
                timings=FlightTimings(**timings),
                nodes=self.store.connected_nodes,
            )
        self.made.append(made)
        return made

    def delete(self, key: str) -> None:
        with sync_client(self.url, socket_timeout_s=5) as client:
            client.delete(key)

    def pttl_ms(self, key: str) -> int:
        with sync_client(self.url, socket_timeout_s=5) as client:
            return int(client.pttl(key))

    def blocked_clients(self) -> int:
        """Clients parked in a blocking command, over every node."""
        total = 0
        for port in self.ports:
            with redis.Redis(port=port) as node:
                total += int(node.info("clients")["blocked_clients"])
        return total

    def lease_pttl_ms(self, key: str) -> int:
        with sync_client(self.url, socket_timeout_s=5) as client:
            return int(client.pttl(f"{self.prefix}{{fl:{key}}}lease"))


@pytest.fixture(params=["redis", "redis-cluster"])
async def servers(request: pytest.FixtureRequest, redis_prefix: str) -> AsyncIterator[Servers]:
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        made = Servers(server.url(), [server.port], redis_prefix)
    else:
        cluster: RedisClusterServers = request.getfixturevalue("redis_cluster")
        store = RedisClusterStore(cluster.url(), clock=SystemClock(), prefix=redis_prefix)
        made = Servers(cluster.url(), cluster.ports, redis_prefix, store)
    yield made
    for flights in made.made:
        await flights.aclose()
    if made.store is not None:
        made.store.close()


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait for `condition` (real requests to the servers, made off the event loop so the
    flights keep running), with a deadline."""
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(condition):
        assert time.monotonic() < deadline, "condition never held"


async def within(awaitable: Awaitable[object], timeout_s: float = 10.0) -> object:
    return await asyncio.wait_for(awaitable, timeout_s)


async def test_one_leader_and_every_waiter_on_every_replica_gets_the_whole_answer(
    servers: Servers,
) -> None:
    replicas = [servers.flights() for _ in range(3)]
    first = await replicas[0].join("k", timeout_s=30)
    assert isinstance(first, FlightLease)
    waiters = [asyncio.create_task(replicas[i % 3].join("k", timeout_s=30)) for i in range(9)]
    await until(lambda: servers.blocked_clients() >= 9)  # all parked in XREAD, none leads
    assert await first.close(SharedAnswer.of_completion(COMPLETION))
    answers = [await within(w) for w in waiters]
    assert answers == [SharedAnswer(200, answers[0].body)] * 9  # type: ignore[union-attr]
    assert answers[0].completion() == COMPLETION  # type: ignore[union-attr]
    late = await replicas[2].join("k", timeout_s=30)  # the answer is kept for late joiners
    assert late == answers[0]
    assert not await first.close(None)  # closes once


async def test_a_dead_leaders_lease_expires_and_exactly_one_waiter_takes_over(
    servers: Servers,
) -> None:
    replicas = [servers.flights(lease_ms=1000) for _ in range(4)]
    dead = await replicas[0].join("k", timeout_s=30)
    assert isinstance(dead, FlightLease)
    dead.abandon()  # crashed: no renewal, no release
    waiters = [asyncio.create_task(r.join("k", timeout_s=30)) for r in replicas[1:]]
    done, pending = await asyncio.wait(waiters, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    leaders = [t.result() for t in done]
    assert len(leaders) == 1
    assert isinstance(leaders[0], FlightLease)
    assert all(not t.done() for t in pending)  # the others wait for the new leader
    await leaders[0].close(SharedAnswer.of_completion(COMPLETION))
    assert [(await within(t)).completion() for t in pending] == [COMPLETION] * 2  # type: ignore[union-attr]


async def test_a_leader_process_killed_mid_call_is_replaced(
    servers: Servers, tmp_path: Path
) -> None:
    script = tmp_path / "leader.py"
    script.write_text(
        "import asyncio, sys\n"
        "from infercache.clock import SystemClock\n"
        "from infercache.stores.redis_connect import async_client\n"
        "from infercache.stores.replica_flight import FlightTimings, ReplicaFlights\n"
        "async def main():\n"
        "    client = async_client(sys.argv[1], socket_timeout_s=None)\n"
        "    flights = ReplicaFlights(client, clock=SystemClock(), prefix=sys.argv[2],\n"
        "                             timings=FlightTimings(lease_ms=1000))\n"
        "    lease = await flights.join('k', timeout_s=30)\n"
        "    print(type(lease).__name__, flush=True)\n"
        "    await asyncio.Event().wait()  # fetching forever\n"
        "asyncio.run(main())\n"
    )
    leader = subprocess.Popen(
        [sys.executable, str(script), servers.url, servers.prefix],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert leader.stdout is not None
    assert leader.stdout.readline().strip() == "FlightLease"
    replicas = [servers.flights(lease_ms=1000) for _ in range(3)]
    waiters = [asyncio.create_task(r.join("k", timeout_s=30)) for r in replicas]
    await until(lambda: servers.blocked_clients() >= 3)
    leader.send_signal(signal.SIGKILL)
    leader.wait(10)
    leader.stdout.close()
    done, pending = await asyncio.wait(waiters, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    (new_leader,) = [t.result() for t in done]
    assert isinstance(new_leader, FlightLease)
    await new_leader.close(SharedAnswer.of_completion(COMPLETION))
    assert [(await within(t)).ok for t in pending] == [True, True]  # type: ignore[union-attr]


async def test_a_leader_that_hands_over_wakes_a_waiter_at_once(servers: Servers) -> None:
    a, b = servers.flights(lease_ms=60_000), servers.flights(lease_ms=60_000)
    lease = await a.join("k", timeout_s=30)
    assert isinstance(lease, FlightLease)
    waiter = asyncio.create_task(b.join("k", timeout_s=30))
    await until(lambda: servers.blocked_clients() >= 1)
    await lease.close(None)  # e.g. its client hung up: nothing to publish
    taken = await within(waiter, 5)  # far sooner than the 60 s lease
    assert isinstance(taken, FlightLease)
    await taken.close(None)


async def test_a_leader_that_fails_inside_its_block_hands_over(servers: Servers) -> None:
    a, b = servers.flights(lease_ms=60_000), servers.flights(lease_ms=60_000)
    lease = await a.join("k", timeout_s=30)
    assert isinstance(lease, FlightLease)
    waiter = asyncio.create_task(b.join("k", timeout_s=30))
    with pytest.raises(ConnectionResetError):
        async with lease:
            raise ConnectionResetError("the upstream went away")
    assert lease.closed
    taken = await within(waiter, 5)
    assert isinstance(taken, FlightLease)
    async with taken:
        await taken.close(SharedAnswer.of_completion(COMPLETION))


async def test_an_error_reaches_waiters_and_is_kept_only_briefly(servers: Servers) -> None:
    a, b = servers.flights(error_ttl_ms=1_500), servers.flights()
    lease = await a.join("k", timeout_s=30)
    assert isinstance(lease, FlightLease)
    waiter = asyncio.create_task(b.join("k", timeout_s=30))
    await until(lambda: servers.blocked_clients() >= 1)
    error = {"error": {"message": "upstream down", "type": "upstream_unavailable"}}
    await lease.close(SharedAnswer.of_error(502, error))
    got = await within(waiter)
    assert isinstance(got, SharedAnswer)
    assert (got.status, got.ok, got.completion()) == (502, False, error)
    answer_key = f"{servers.prefix}{{fl:k}}answer"
    assert 0 < servers.pttl_ms(answer_key) <= 1_500


async def test_renewal_keeps_a_slow_leader_in_charge(servers: Servers) -> None:
    # 2.4 s leases renewed every 0.8 s: a 0.9 s lease lost its leader once in a CI run on a
    # loaded 2-core box (a renewal stalled past the lease), which this test is not about.
    a, b = servers.flights(lease_ms=2400), servers.flights(lease_ms=2400)
    lease = await a.join("k", timeout_s=30)
    assert isinstance(lease, FlightLease)
    waiter = asyncio.create_task(b.join("k", timeout_s=30))
    renewals, last = 0, servers.lease_pttl_ms("k")

    def renewed_four_times() -> bool:
        nonlocal renewals, last
        now = servers.lease_pttl_ms("k")
        renewals += now > last
        last = now
        return renewals >= 4

    await until(renewed_four_times)  # every 0.8 s: the leader outlives its first 2.4 s
    assert not waiter.done()
    assert not lease.lost.is_set()
    await lease.close(SharedAnswer.of_completion(COMPLETION))
    assert (await within(waiter)).ok  # type: ignore[union-attr]


async def test_a_leader_presumed_dead_learns_it_lost_the_lease(servers: Servers) -> None:
    a, b = servers.flights(lease_ms=900), servers.flights(lease_ms=900)
    lease = await a.join("k", timeout_s=30)
    assert isinstance(lease, FlightLease)
    servers.delete(f"{servers.prefix}{{fl:k}}lease")  # as if it had expired
    usurper = await b.join("k", timeout_s=30)
    assert isinstance(usurper, FlightLease)
    await within(lease.lost.wait())
    # Both may publish; the first answer stays.
    await usurper.close(SharedAnswer.of_completion(COMPLETION))
    await lease.close(SharedAnswer.of_completion({"id": "late"}))
    assert (await within(b.join("k", timeout_s=1))).completion() == COMPLETION  # type: ignore[union-attr]


async def test_a_waiter_gives_up_at_its_deadline_on_the_injected_clock(servers: Servers) -> None:
    clock = ManualClock()
    a, b = servers.flights(lease_ms=5000), servers.flights(clock, max_block_ms=100)
    lease = await a.join("k", timeout_s=30)
    assert isinstance(lease, FlightLease)
    waiter = asyncio.create_task(b.join("k", timeout_s=30))
    await until(lambda: servers.blocked_clients() >= 1)
    assert not waiter.done()
    clock.advance(31)
    with pytest.raises(StoreError, match="no answer"):
        await within(waiter)
    await lease.close(None)


@pytest.mark.parametrize("scheme", ["redis", "redis+cluster"])
async def test_redis_down_is_a_store_error(redis_prefix: str, scheme: str) -> None:
    flights = open_flights(
        f"{scheme}://127.0.0.1:{free_port()}?prefix={redis_prefix}", clock=SystemClock()
    )
    with pytest.raises(StoreError):
        await flights.join("k", timeout_s=1)
    await flights.aclose()


async def test_open_flights_reads_the_store_url_and_its_prefix(redis_server: RedisServer) -> None:
    flights = open_flights(f"{redis_server.url()}?prefix=pfx:", clock=SystemClock())
    lease = await flights.join("k", timeout_s=5)
    assert isinstance(lease, FlightLease)
    with redis.Redis(port=redis_server.port) as client:
        assert client.get("pfx:{fl:k}lease") == lease.token.encode()
    await lease.close(None)
    await flights.aclose()
