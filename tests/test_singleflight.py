"""Concurrent identical misses make one upstream call (threads and asyncio)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from infercache.cache import Cache, Completion, Layer
from infercache.clock import ManualClock
from infercache.request import parse_request
from infercache.settings import Settings
from infercache.singleflight import AsyncSingleFlight, SingleFlight
from tests.conftest import CountingUpstream, chat


def make_cache(tmp_path: Path, clock: ManualClock) -> Cache:
    return Cache(Settings(data_dir=tmp_path, store_url=f"sqlite:///{tmp_path}/c.db"), clock=clock)


def test_sixteen_threads_with_one_miss_make_one_upstream_call(
    tmp_path: Path, clock: ManualClock, upstream: CountingUpstream
) -> None:
    cache = make_cache(tmp_path, clock)
    upstream.gate = threading.Event()
    results: list[Completion] = []
    lock = threading.Lock()

    def worker() -> None:
        done = cache.complete(chat(), upstream)
        with lock:
            results.append(done)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    key = cache.exact.key(parse_request(chat()))
    # Open the upstream only once the other 15 wait on the one call in flight.
    assert cache._flights.wait_for_waiters(key, 15, timeout_s=30)
    upstream.gate.set()
    for t in threads:
        t.join(30)
    assert upstream.calls == 1
    assert len(results) == 16
    assert {r.response["id"] for r in results} == {"chatcmpl-1"}
    assert sum(r.coalesced for r in results) == 15
    assert [r.layer for r in results].count(Layer.MISS) == 1
    snap = cache.stats()["strategies"]["exact"]
    assert (snap["hits"], snap["misses"]["absent"], snap["counters"]["coalesced"]) == (15, 1, 15)
    cache.close()


@pytest.mark.anyio
async def test_sixteen_tasks_with_one_miss_make_one_upstream_call(
    tmp_path: Path, clock: ManualClock, upstream: CountingUpstream
) -> None:
    cache = make_cache(tmp_path, clock)
    opened = asyncio.Event()

    async def slow_upstream(body: dict[str, Any]) -> dict[str, Any]:
        await opened.wait()
        return await upstream.acall(body)

    async def open_when_all_waiting() -> None:
        # Each task reaches the flight before yielding; then the gate opens.
        while cache._aflights.in_flight() == 0:
            await asyncio.sleep(0)
        opened.set()

    results = await asyncio.gather(
        *(cache.acomplete(chat(), slow_upstream) for _ in range(16)), open_when_all_waiting()
    )
    completions = [r for r in results if r is not None]
    assert upstream.calls == 1
    assert len({c.response["id"] for c in completions}) == 1
    assert sum(c.coalesced for c in completions) == 15
    cache.close()


def test_a_leaders_exception_reaches_every_waiter() -> None:
    flight: SingleFlight[int] = SingleFlight()
    gate = threading.Event()
    errors: list[BaseException] = []

    def boom() -> int:
        gate.wait(30)
        raise RuntimeError("upstream down")

    def call() -> None:
        try:
            flight.do("k", boom)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    assert flight.wait_for_waiters("k", 3, timeout_s=30)
    gate.set()
    for t in threads:
        t.join(30)
    assert len(errors) == 4
    assert flight.in_flight() == 0


@pytest.mark.anyio
async def test_a_cancelled_waiter_does_not_cancel_the_shared_call() -> None:
    flight: AsyncSingleFlight[str] = AsyncSingleFlight()
    release = asyncio.Event()

    async def work() -> str:
        await release.wait()
        return "done"

    leader = asyncio.ensure_future(flight.do("k", work))
    follower = asyncio.ensure_future(flight.do("k", work))
    await asyncio.sleep(0)
    leader.cancel()
    release.set()
    assert await follower == ("done", True)
    with pytest.raises(asyncio.CancelledError):
        await leader
