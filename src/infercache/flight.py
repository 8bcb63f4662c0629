"""Coalescing: one upstream call shared by every identical request in flight, in one process.

The primitive under the one miss protocol (miss_flight.py), which the library, the gateway and
the wrapped `openai` client all go through:

    flights = FlightTable()
    flight, leader = flights.lead_or_join(key)
    leader:  fetch; flight.publish(*chunks) as they come (optional); then flight.settle(result,
             error) exactly once — in a `finally`, so no path leaves waiters hanging
    waiters: flight.wait(timeout_s) or `for chunk in flight.iter_chunks()` (threads);
             await flight.result() or `async for chunk in flight.chunks()` (asyncio): every
             chunk from the first, then the error if the flight failed

A `Flight` is a value that settles once: `settle` returns False and changes nothing on a second
call. It is thread-safe: the state sits under one lock; threads wait on a condition over that
lock (made when the first thread waits: the gateway's flights never need one), and each asyncio
subscriber waits on its own loop's event, set with `call_soon_threadsafe` from another thread.
A key leaves the table when its flight settles, so a later caller starts afresh (by then the
answer is in the cache).

Interest: every reader (`wait`, `iter_chunks`, `result`, `chunks`) counts while it reads.
`cancel_when_idle(cancel)` calls `cancel` when the last reader leaves before the flight settled
(every streaming client hung up), so the upstream stops generating; the fetch then settles the
flight with its error. Peeking (`first_event`) is not interest.

Observability: a table's `observer` (None in production) hears every change of the table's
flights, their waiters and their readers, after the locks are released; tests wait on it
(tests/harness/flight_watch.py) instead of sleeping.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Generic, Protocol, TypeVar

from infercache.chat import StreamChunk

T = TypeVar("T")


class FlightObserver(Protocol):
    def changed(self) -> None:
        """A flight joined or left the table, or gained or lost a waiter or a reader."""


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
        self._thread_wake: threading.Condition | None = None  # made by the first thread to read
        self._done = False
        self._chunks: list[StreamChunk] = []
        self._result: T | None = None
        self._error: BaseException | None = None
        self._wakers: list[_Waker] = []
        self._interested = 0
        self._cancel: asyncio.Task[object] | Callable[[], object] | None = None
        self._waiters = 0
        self._table: FlightTable[T] | None = None

    # -- the leader's side --

    def publish(self, *chunks: StreamChunk) -> None:
        """Chunks of the answer, in order (an answer that came whole: all of them, one wake)."""
        with self._lock:
            if self._done:
                raise RuntimeError("publish after the flight settled")
            self._chunks.extend(chunks)
            if self._thread_wake is not None:
                self._thread_wake.notify_all()
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
            if self._thread_wake is not None:
                self._thread_wake.notify_all()
            wakers = list(self._wakers)
        for waker in wakers:
            waker.wake()
        return True

    def cancel_when_idle(self, cancel: asyncio.Task[object] | Callable[[], object]) -> None:
        """When the last reader leaves before the flight settled, cancel the task (from any
        thread: a reader may be a thread), or call `cancel` in the leaving reader's thread."""
        self._cancel = cancel

    # -- what anyone may read --

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

    @property
    def readers(self) -> int:
        """Readers interested in the answer right now."""
        return self._interested

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

    @property
    def error_before_chunks(self) -> BaseException | None:
        """The error that settled the flight before any chunk (an upstream refusal)."""
        with self._lock:
            if self._done and not self._chunks:
                return self._error
        return None

    # -- threads --

    def wait(self, timeout_s: float | None = None) -> T:
        """Block this thread until the flight settles; its result, or raises its error."""
        wake = self._enter_thread()
        try:
            with wake:
                if not wake.wait_for(lambda: self._done, timeout_s):
                    raise TimeoutError(f"flight not settled after {timeout_s} s")
        finally:
            self._leave()
        return self.outcome()

    def iter_chunks(self) -> Iterator[StreamChunk]:
        """`chunks` for a thread: every chunk from the first; then raises the flight's error."""
        wake = self._enter_thread()
        try:
            seen = 0
            while True:
                with wake:
                    while len(self._chunks) == seen and not self._done:
                        wake.wait()
                    batch = self._chunks[seen:]
                    done = self._done
                yield from batch
                seen += len(batch)
                if done and seen == len(self._chunks):
                    break
            if self._error is not None:
                raise self._error
        finally:
            self._leave()

    def wait_first_event(self) -> None:
        """`first_event` for a thread: until the flight has a chunk or has settled."""
        with self._lock:
            if self._thread_wake is None:
                self._thread_wake = threading.Condition(self._lock)
            while not (self._chunks or self._done):
                self._thread_wake.wait()

    def _enter_thread(self) -> threading.Condition:
        with self._lock:
            if self._thread_wake is None:
                self._thread_wake = threading.Condition(self._lock)
            self._interested += 1
            wake = self._thread_wake
        self._moved()
        return wake

    # -- asyncio --

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
        if interested:
            self._moved()
        return waker

    def _unsubscribe(self, waker: _Waker, *, interested: bool = True) -> None:
        with self._lock:
            self._wakers.remove(waker)
        if interested:
            self._leave()

    def _leave(self) -> None:
        """A reader left; the last one to leave an unsettled flight cancels its fetch."""
        with self._lock:
            self._interested -= 1
            idle = self._interested == 0 and not self._done
            cancel = self._cancel
        self._moved()
        if idle and cancel is not None:
            if isinstance(cancel, asyncio.Task):
                _cancel_task(cancel)
            else:
                cancel()

    def _moved(self) -> None:
        """Outside the lock: tell the table's observer, if anyone watches."""
        table = self._table
        if table is not None and table.observer is not None:
            table.observer.changed()


def _cancel_task(task: asyncio.Task[object]) -> None:
    """Cancel `task` from any thread."""
    loop = task.get_loop()
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        task.cancel()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(task.cancel)


class FlightTable(Generic[T]):
    """Flights in progress by key. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flights: dict[str, Flight[T]] = {}
        self.observer: FlightObserver | None = None

    def lead_or_join(self, key: str | None) -> tuple[Flight[T], bool]:
        """The flight for `key` and whether the caller leads it. A `None` key never coalesces:
        the caller leads a flight of its own."""
        if key is None:
            return Flight(), True
        with self._lock:
            flight = self._flights.get(key)
            leader = flight is None or flight.settled
            if flight is None or leader:
                flight = _Tracked(self, key)
                self._flights[key] = flight
            else:
                flight._waiters += 1
        if self.observer is not None:
            self.observer.changed()
        return flight, leader

    def _remove(self, key: str, flight: Flight[T]) -> None:
        with self._lock:
            if self._flights.get(key) is flight:
                del self._flights[key]
        if self.observer is not None:
            self.observer.changed()

    def __len__(self) -> int:
        with self._lock:
            return len(self._flights)

    def in_progress(self) -> dict[str, Flight[T]]:
        """The flights in progress by key (a snapshot)."""
        with self._lock:
            return dict(self._flights)

    def waiting(self) -> int:
        """Callers waiting on a flight they did not lead."""
        with self._lock:
            return sum(f.waiters for f in self._flights.values())


class _Tracked(Flight[T]):
    """A flight registered in a table under its key; leaves the table when it settles."""

    def __init__(self, table: FlightTable[T], key: str) -> None:
        super().__init__()
        self._table = table
        self._key = key

    def settle(self, result: T | None, error: BaseException | None) -> bool:
        first = super().settle(result, error)
        table = self._table
        if first and table is not None:
            table._remove(self._key, self)
        return first
