"""Coalescing: one upstream call shared by every identical request in flight, in one process.

The one primitive behind the library's `complete` (threads), `acomplete` (asyncio) and the
gateway (asyncio, streaming or not):

    flights = FlightTable()
    flight, leader = flights.lead_or_join(key)
    leader:  fetch; flight.publish(*chunks) as they come (optional); then flight.settle(result,
             error) exactly once — in a `finally`, so no path leaves waiters hanging
    waiters: flight.wait(timeout_s) (threads), await flight.result() (asyncio), or
             `async for chunk in flight.chunks()` (every chunk from the first, then the error if
             the flight failed)

A `Flight` is a value that settles once: `settle` returns False and changes nothing on a second
call. It is thread-safe: the state sits under one lock, threads wait on a `threading.Event`
(made when the first thread waits: the gateway's flights never need one), and each asyncio
subscriber waits on its own loop's event, set with `call_soon_threadsafe` from another thread.
A key leaves the table when its flight settles, so a later caller starts afresh (by then the
answer is in the cache).

Interest (asyncio subscribers only): `cancel_when_idle(task)` cancels the leader's task when the
last async subscriber leaves before the flight settled (every streaming client hung up), so the
upstream stops generating; the task then settles the flight with its error.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from infercache.chat import StreamChunk

T = TypeVar("T")


class _Waker:
    """An asyncio subscriber's wake-up: its loop's Event, settable from any thread."""

    __slots__ = ("event", "loop")

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def wake(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.event.set()
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.event.set)


class Flight(Generic[T]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._readers_changed: threading.Condition | None = None  # made by wait_for_readers
        self._done = False
        self._done_event: threading.Event | None = None  # made by the first thread to wait
        self._chunks: list[StreamChunk] = []
        self._result: T | None = None
        self._error: BaseException | None = None
        self._wakers: list[_Waker] = []
        self._interested = 0
        self._task: asyncio.Task[Any] | None = None
        self._waiters = 0

    # -- the leader's side --

    def publish(self, *chunks: StreamChunk) -> None:
        """Chunks of the answer, in order (an answer that came whole: all of them, one wake)."""
        with self._lock:
            if self._done:
                raise RuntimeError("publish after the flight settled")
            self._chunks.extend(chunks)
            wakers = list(self._wakers)
        for waker in wakers:
            waker.wake()

    def settle(self, result: T | None, error: BaseException | None) -> bool:
        """End the flight with `result`, or with `error` when it is not None. Only the first
        call counts; it returns False afterwards."""
        with self._lock:
            if self._done:
                return False
            self._result, self._error = result, error
            if error is None and result is None:
                self._error = RuntimeError("a flight settled without a result or an error")
            self._done = True
            if self._done_event is not None:
                self._done_event.set()
            wakers = list(self._wakers)
        for waker in wakers:
            waker.wake()
        return True

    def cancel_when_idle(self, task: asyncio.Task[Any]) -> None:
        self._task = task

    # -- the waiters' side --

    @property
    def settled(self) -> bool:
        return self._done

    @property
    def published(self) -> int:
        """Chunks published so far."""
        with self._lock:
            return len(self._chunks)

    @property
    def waiters(self) -> int:
        """Callers that joined this flight instead of leading it."""
        return self._waiters

    def wait_for_readers(self, n: int, timeout_s: float) -> bool:
        """Block until exactly `n` asyncio readers are interested (observability and tests)."""
        with self._lock:
            if self._readers_changed is None:
                self._readers_changed = threading.Condition(self._lock)
            readers_changed = self._readers_changed
        with readers_changed:
            return readers_changed.wait_for(lambda: self._interested == n, timeout_s)

    def result_now(self) -> T | None:
        """The result if the flight already settled with one; None otherwise."""
        with self._lock:
            return self._result if self._done and self._error is None else None

    def outcome(self) -> T:
        """The result of a settled flight; raises its error."""
        if not self._done:
            raise RuntimeError("the flight has not settled")
        if self._error is not None:
            raise self._error
        assert self._result is not None  # settle() guarantees a result or an error
        return self._result

    def wait(self, timeout_s: float | None = None) -> T:
        """Block this thread until the flight settles; its result, or raises its error."""
        with self._lock:
            if not self._done and self._done_event is None:
                self._done_event = threading.Event()
            done_event = self._done_event
        if done_event is not None and not done_event.wait(timeout_s):
            raise TimeoutError(f"flight not settled after {timeout_s} s")
        return self.outcome()

    async def result(self) -> T:
        waker = self._subscribe()
        try:
            while not self._done:
                await waker.event.wait()
                waker.event.clear()
        finally:
            self._unsubscribe(waker)
        return self.outcome()

    async def first_event(self) -> None:
        """Wait until the flight has a chunk or has settled (an answer or a refusal). Peeking
        is not interest: it never keeps the flight alive nor lets it go idle."""
        waker = self._subscribe(interested=False)
        try:
            while not (self._chunks or self._done):
                await waker.event.wait()
                waker.event.clear()
        finally:
            self._unsubscribe(waker, interested=False)

    @property
    def error_before_chunks(self) -> BaseException | None:
        """The error that settled the flight before any chunk (an upstream refusal)."""
        with self._lock:
            if self._done and not self._chunks:
                return self._error
        return None

    async def chunks(self) -> AsyncIterator[StreamChunk]:
        """Every chunk from the first; then raises the flight's error, if it failed."""
        waker = self._subscribe()
        try:
            seen = 0
            while True:
                with self._lock:
                    batch = self._chunks[seen:]
                    done = self._done
                for chunk in batch:
                    yield chunk
                seen += len(batch)
                if done and seen == len(self._chunks):
                    break
                if not batch:
                    await waker.event.wait()
                    waker.event.clear()
            if self._error is not None:
                raise self._error
        finally:
            self._unsubscribe(waker)

    def _subscribe(self, *, interested: bool = True) -> _Waker:
        waker = _Waker()
        with self._lock:
            self._wakers.append(waker)
            self._interested += interested
            self._readers_moved()
        return waker

    def _unsubscribe(self, waker: _Waker, *, interested: bool = True) -> None:
        with self._lock:
            self._wakers.remove(waker)
            if not interested:
                return
            self._interested -= 1
            self._readers_moved()
            idle = self._interested == 0 and not self._done
            task = self._task
        if idle and task is not None and not task.done():
            task.cancel()

    def _readers_moved(self) -> None:
        """Under the lock: wake `wait_for_readers`, if anyone ever called it."""
        if self._readers_changed is not None:
            self._readers_changed.notify_all()


class FlightTable(Generic[T]):
    """Flights in progress by key. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._joined = threading.Condition(self._lock)
        self._watching = 0  # callers in wait_for/wait_for_waiters: only they need a notify
        self._flights: dict[str, Flight[T]] = {}

    def lead_or_join(self, key: str | None) -> tuple[Flight[T], bool]:
        """The flight for `key` and whether the caller leads it. A `None` key never coalesces:
        the caller leads a flight of its own."""
        if key is None:
            return Flight(), True
        with self._lock:
            flight = self._flights.get(key)
            if flight is not None and not flight.settled:
                flight._waiters += 1
                self._changed()
                return flight, False
            flight = _Tracked(self, key)
            self._flights[key] = flight
            self._changed()
            return flight, True

    def _remove(self, key: str, flight: Flight[T]) -> None:
        with self._lock:
            if self._flights.get(key) is flight:
                del self._flights[key]
                self._changed()

    def _changed(self) -> None:
        if self._watching:  # under the lock
            self._joined.notify_all()

    def __len__(self) -> int:
        with self._lock:
            return len(self._flights)

    def in_progress(self) -> list[Flight[T]]:
        with self._lock:
            return list(self._flights.values())

    def waiting(self) -> int:
        """Callers waiting on a flight they did not lead."""
        with self._lock:
            return sum(f.waiters for f in self._flights.values())

    def wait_for_waiters(self, key: str, n: int, timeout_s: float) -> bool:
        """Block until `n` callers wait on the flight for `key` (observability and tests)."""
        return self._watch(
            lambda: (f := self._flights.get(key)) is not None and f.waiters >= n, timeout_s
        )

    def wait_for(self, flights: int, waiting: int, timeout_s: float) -> bool:
        """Block until at least `flights` flights are in progress with at least `waiting`
        callers waiting on them in all (observability and tests)."""
        return self._watch(
            lambda: (
                len(self._flights) >= flights
                and sum(f.waiters for f in self._flights.values()) >= waiting
            ),
            timeout_s,
        )

    def _watch(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        with self._joined:
            self._watching += 1
            try:
                return self._joined.wait_for(predicate, timeout_s)
            finally:
                self._watching -= 1


class _Tracked(Flight[T]):
    """A flight registered in a table under its key; leaves the table when it settles."""

    def __init__(self, table: FlightTable[T], key: str) -> None:
        super().__init__()
        self._table = table
        self._key = key

    def settle(self, result: T | None, error: BaseException | None) -> bool:
        first = super().settle(result, error)
        if first:
            self._table._remove(self._key, self)
        return first
