"""The one coalescing primitive (flight.py) and the Miss lease (cache.py): one upstream call per
key in flight, from threads and from asyncio; every waiter gets the answer or the error; a
flight settles once and a Miss closes once, whatever raises."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from infercache.cache import Cache
from infercache.chat import chunks_from_completion
from infercache.clock import ManualClock
from infercache.completion import Completion, Layer
from infercache.flight import Flight, FlightTable
from infercache.function_source import FunctionSource
from infercache.miss import Miss
from infercache.miss_flight import coalesce_sync
from infercache.request import parse_request
from infercache.settings import Settings
from tests.harness.flight_watch import FlightWatch
from tests.harness.upstreams import CountingUpstream
from tests.harness.vocabulary import chat

pytestmark = pytest.mark.concurrency


@pytest.fixture
def cache(tmp_path: Path, clock: ManualClock) -> Iterator[Cache]:
    """A cache on a SQLite file, closed after the test."""
    c = Cache(Settings(data_dir=tmp_path, store_url=f"sqlite:///{tmp_path}/c.db"), clock=clock)
    yield c
    c.close()


def exact(cache: Cache) -> dict[str, Any]:
    snapshot: dict[str, Any] = cache.stats()["strategies"]["exact"]
    return snapshot


# -- the library on the primitive --


def test_sixteen_threads_with_one_miss_make_one_upstream_call(
    cache: Cache, upstream: CountingUpstream
) -> None:
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
    assert FlightWatch(cache.flights).waiters(key, 15)
    upstream.gate.set()
    for t in threads:
        t.join(30)
    assert upstream.calls == 1
    assert len(results) == 16
    assert {r.response["id"] for r in results} == {"chatcmpl-1"}
    assert sum(r.coalesced for r in results) == 15
    assert [r.layer for r in results].count(Layer.MISS) == 1
    snap = exact(cache)
    assert (snap["hits"], snap["misses"]["absent"], snap["counters"]["coalesced"]) == (15, 1, 15)
    assert len(cache.flights) == 0


@pytest.mark.anyio
async def test_sixteen_tasks_with_one_miss_make_one_upstream_call(
    cache: Cache, upstream: CountingUpstream
) -> None:
    opened = asyncio.Event()

    async def slow_upstream(body: dict[str, Any]) -> dict[str, Any]:
        await opened.wait()
        return await upstream.acall(body)

    tasks = [asyncio.ensure_future(cache.acomplete(chat(), slow_upstream)) for _ in range(16)]
    key = cache.exact.key(parse_request(chat()))
    assert await asyncio.to_thread(FlightWatch(cache.flights).waiters, key, 15)
    opened.set()
    completions = await asyncio.gather(*tasks)
    assert upstream.calls == 1
    assert len({c.response["id"] for c in completions}) == 1
    assert sum(c.coalesced for c in completions) == 15
    assert exact(cache)["lookups"] == 16


def test_a_leaders_exception_reaches_every_waiter_and_is_stored_nowhere(cache: Cache) -> None:
    gate = threading.Event()
    errors: list[BaseException] = []

    def down(body: dict[str, Any]) -> dict[str, Any]:
        gate.wait(30)
        raise RuntimeError("upstream down")

    def call() -> None:
        try:
            cache.complete(chat(), down)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    assert FlightWatch(cache.flights).waiters(cache.exact.key(parse_request(chat())), 3)
    gate.set()
    for t in threads:
        t.join(30)
    assert len(errors) == 4
    assert len(cache.flights) == 0
    snap = exact(cache)
    assert snap["lookups"] == 4  # each Miss closed once: no hit, four misses
    assert snap["hits"] == 0
    assert snap["counters"].get("stored", 0) == 0


@pytest.mark.anyio
async def test_a_cancelled_leader_does_not_cancel_the_shared_call(
    cache: Cache, upstream: CountingUpstream
) -> None:
    release = asyncio.Event()

    async def gated(body: dict[str, Any]) -> dict[str, Any]:
        await release.wait()
        return await upstream.acall(body)

    leader = asyncio.ensure_future(cache.acomplete(chat(), gated))
    assert await asyncio.to_thread(FlightWatch(cache.flights).flights, 1)  # it leads the flight
    follower = asyncio.ensure_future(cache.acomplete(chat(), gated))
    key = cache.exact.key(parse_request(chat()))
    assert await asyncio.to_thread(FlightWatch(cache.flights).waiters, key, 1)
    leader.cancel()
    release.set()
    done = await follower
    assert done.coalesced
    assert upstream.calls == 1
    with pytest.raises(asyncio.CancelledError):
        await leader
    # The leader's fetch still finished and stored the answer for the next caller.
    assert (await cache.acomplete(chat(), gated)).layer is Layer.EXACT


# -- the Miss lease --


def test_a_miss_closes_once_whatever_the_order_of_calls(
    cache: Cache, upstream: CountingUpstream
) -> None:
    miss = cache.begin(chat())
    assert isinstance(miss, Miss)
    response = upstream(chat())
    assert miss.close(response, upstream_s=0.5)
    assert miss.answer(response, 0.5).layer is Layer.MISS
    assert not miss.close(None)
    assert not miss.close(upstream(chat()))
    assert miss.close_shared(miss.answer(response, 0.5)) is None
    snap = exact(cache)
    assert (snap["lookups"], snap["counters"]["stored"]) == (1, 1)


def test_a_close_that_raises_still_answers_every_caller_and_closes_every_miss_once(
    cache: Cache, upstream: CountingUpstream
) -> None:

    def explode(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug in storing")

    cache.exact.store = explode  # type: ignore[method-assign]
    upstream.gate = threading.Event()
    outcomes: list[BaseException | Completion] = []

    def call() -> None:
        try:
            outcomes.append(cache.complete(chat(), upstream))
        except RuntimeError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    assert FlightWatch(cache.flights).waiters(cache.exact.key(parse_request(chat())), 2)
    upstream.gate.set()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)  # nobody hangs
    # The flight settled with the answer before the store was written: every caller has it
    # (as in the gateway, tests/gateway/test_miss_path.py); the bug is logged.
    assert len(outcomes) == 3
    assert all(isinstance(o, Completion) for o in outcomes)
    assert {o.response["id"] for o in outcomes if isinstance(o, Completion)} == {"chatcmpl-1"}
    snap = exact(cache)
    assert snap["lookups"] == 3  # every Miss closed exactly once
    assert snap["counters"].get("stored", 0) == 0


def test_a_streaming_reader_gets_an_answer_that_came_whole_as_chunks(
    cache: Cache, clock: ManualClock, upstream: CountingUpstream
) -> None:
    upstream.gate = threading.Event()
    led: list[Completion] = []
    leader = threading.Thread(target=lambda: led.append(cache.complete(chat(), upstream)))
    leader.start()
    assert FlightWatch(cache.flights).flights(1)  # a non-streaming leader, its call held
    miss = cache.begin(chat())
    assert isinstance(miss, Miss)
    reader = coalesce_sync(miss, cache.flights, FunctionSource(upstream), clock, stream=True)
    assert not reader.leader
    upstream.gate.set()
    assert reader.start_sync_stream()  # a coalesced answer
    chunks = list(reader.iter_chunks(lambda answer: chunks_from_completion(answer)))
    leader.join(30)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == led[0].response["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert upstream.calls == 1
    assert exact(cache)["counters"]["coalesced"] == 1


# -- the primitive itself --


def test_a_flight_settles_once() -> None:
    flight: Flight[str] = Flight()
    assert flight.settle("first", None)
    assert not flight.settle("second", None)
    assert not flight.settle(None, RuntimeError("late"))
    assert flight.wait(0) == "first"


def test_a_key_leaves_the_table_when_its_flight_settles() -> None:
    table: FlightTable[str] = FlightTable()
    flight, leader = table.lead_or_join("k")
    again, second = table.lead_or_join("k")
    assert (leader, second, again is flight, table.waiting()) == (True, False, True, 1)
    flight.settle("x", None)
    fresh, leads = table.lead_or_join("k")
    assert leads
    assert fresh is not flight


def test_no_key_never_coalesces() -> None:
    table: FlightTable[str] = FlightTable()
    a, lead_a = table.lead_or_join(None)
    b, lead_b = table.lead_or_join(None)
    assert (lead_a, lead_b) == (True, True)
    assert a is not b
    assert len(table) == 0


def chunk(content: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}


async def collect(flight: Flight[str]) -> str:
    return "".join([c["choices"][0]["delta"]["content"] async for c in flight.chunks()])


@pytest.mark.anyio
async def test_late_joiners_get_every_chunk_and_the_outcome() -> None:
    flight: Flight[str] = Flight()
    flight.publish(chunk("a"))
    early = asyncio.ensure_future(collect(flight))
    await flight.first_event()
    flight.publish(chunk("b"))
    late = asyncio.ensure_future(collect(flight))
    result = asyncio.ensure_future(flight.result())
    flight.publish(chunk("c"))
    flight.settle("abc", None)
    assert await early == await late == "abc"
    assert await result == "abc"


@pytest.mark.anyio
async def test_chunks_published_from_another_thread_reach_an_asyncio_reader() -> None:
    flight: Flight[str] = Flight()
    reader = asyncio.ensure_future(collect(flight))

    def produce() -> None:
        for piece in "xyz":
            flight.publish(chunk(piece))
        flight.settle("xyz", None)

    await asyncio.to_thread(produce)
    assert await reader == "xyz"


@pytest.mark.anyio
async def test_a_failed_flight_raises_after_its_chunks() -> None:
    flight: Flight[str] = Flight()
    flight.publish(chunk("a"))
    flight.settle(None, RuntimeError("cut off"))
    stream = flight.chunks()
    assert (await anext(stream))["choices"][0]["delta"]["content"] == "a"
    with pytest.raises(RuntimeError, match="cut off"):
        await anext(stream)
    assert flight.error_before_chunks is None


@pytest.mark.anyio
async def test_when_every_reader_leaves_the_work_is_cancelled() -> None:
    flight: Flight[str] = Flight()
    cancelled, running = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        running.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            flight.settle(None, RuntimeError("every client left"))
            raise

    task = asyncio.ensure_future(work())
    flight.cancel_when_idle(task.cancel)
    await running.wait()
    flight.publish(chunk("a"))
    stream: AsyncIterator[dict[str, Any]] = flight.chunks()
    await anext(stream)
    await stream.aclose()  # the only reader hung up
    await cancelled.wait()
    with pytest.raises(RuntimeError, match="every client left"):
        flight.outcome()


@pytest.mark.anyio
async def test_peeking_at_the_first_event_is_not_interest() -> None:
    flight: Flight[str] = Flight()
    task = asyncio.ensure_future(asyncio.Event().wait())
    flight.cancel_when_idle(task.cancel)
    flight.publish(chunk("a"))
    await flight.first_event()  # subscribes and leaves: must not look like the last reader
    assert not task.cancelled()
    reader = asyncio.ensure_future(collect(flight))
    flight.settle("a", None)
    assert await reader == "a"
    task.cancel()
