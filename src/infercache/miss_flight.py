"""The one miss protocol: lead or join the flight for a miss, fetch once (publishing chunks),
settle every reader, close every lease exactly once. The library, the gateway and the wrapped
`openai` client all fetch through it; each passes only how to reach its upstream (a `Source`:
function_source.py, gateway/replica_fetch.py, openai/send_source.py, embeddings/
embedding_miss.py), and each endpoint only its lease (a `MissLease`: miss.py for chat and
completions, embeddings/embedding_miss.py).

    mf = coalesce(lease, flights, source, store_io, clock)                    (asyncio)
      flights.lead_or_join(lease.flight_key)                                  (flight.py)
      leader: `lead` starts as a task of its own, which owns the leader's lease:
          fetched = await source.fetch(lease, flight)   the upstream call, a stream's chunks
                                                        published as they come (an answer
                                                        that came whole: none; a streaming
                                                        reader replays it)
          flight.settle(lease.answer(fetched))          every reader has its answer now
          await fetched.after()                         the source's follow-up, if any (the
                                                        gateway: tell other replicas, count
                                                        prefix use)
          store_io.write (store_guard.py decides where):
              source.observe(lease, response)           what the source learns from it (the
                                                        gateway: swap detection)
              lease.close(response)                     counted; stored if complete and allowed
          finally: lease.close(None), flight.settle(error)      no-ops once done
        when every reader has left, the flight cancels the task: nothing is stored
      then leader and waiters alike read the flight:
        await mf.answer()                       the leader: lease.reply(the answer), once its
                                                fetch ended (stored); a waiter:
                                                lease.close_shared(the answer | None)
        await mf.start_stream(); mf.chunks()    the chunks as they come, then the error if any
    coalesce_sync(lease, flights, source, clock, stream=...)                  (threads)
      the same steps, `lead_sync` without awaits: the leader fetches in its own thread, or for
      a stream in a thread of its own (so its caller can read while it fetches), and a reader
      leaving for good is noticed at the next chunk; readers: mf.wait(), mf.iter_chunks()

A fetch another gateway replica answered (`Fetched.elsewhere`) closes the leader's lease as a
coalesced hit and stores nothing. An exception from the source reaches every reader through
the flight, unchanged; one raised while storing (a bug) is logged: every reader already has
its answer. `close_fetched` closes a Miss with an answer fetched outside any flight (a replayed
log). This module is the only one that closes a lease.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator, Iterable
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from infercache.chat import StreamChunk
from infercache.clock import Clock
from infercache.completion import Completion, Response
from infercache.errors import StoreError, UpstreamAbortedError
from infercache.flight import Flight, FlightTable
from infercache.store_guard import StoreIO

log = logging.getLogger(__name__)

R = TypeVar("R", covariant=True)
L = TypeVar("L", bound="MissLease[Any]")
LC = TypeVar("LC", contravariant=True)
T = TypeVar("T")
# How a reader streams an answer that came whole (its source published no chunk).
Whole = Callable[[Response], Iterable[StreamChunk]]


class MissLease(Protocol[R]):
    """A lookup no layer answered, closed exactly once: chat's `Miss` (miss.py), the
    embeddings' missing inputs (embeddings/embedding_miss.py)."""

    @property
    def flight_key(self) -> str | None: ...

    def answer(self, response: Response, upstream_s: float) -> Completion:
        """What the flight settles with (pure: nothing counted or stored)."""
        ...

    def reply(self, fetched: Completion) -> R:
        """What the leader's caller gets (pure)."""
        ...

    def close(self, response: Response | None, *, upstream_s: float = ...) -> bool:
        """The leader's: count, store if allowed (None: no answer); False if closed before."""
        ...

    def close_shared(self, leader: Completion | None) -> R | None:
        """A waiter's close: the leader's answer (None: it failed); None when closed before."""
        ...

    def store_failed(self, exc: StoreError) -> None:
        """A failed commit of what `close` stored: counted; the answer stands."""
        ...


class ChunkSink(Protocol):
    def publish(self, *chunks: StreamChunk) -> None: ...

    @property
    def published(self) -> int: ...


class Fetched(NamedTuple):
    response: Response
    elsewhere: bool = False  # another gateway replica fetched it: a coalesced hit, not stored
    after: Callable[[], Awaitable[None]] | None = None  # once every reader has the answer


class Source(Protocol[LC]):
    """How one caller reaches its upstream for a lease, on an event loop."""

    async def fetch(self, lease: LC, sink: ChunkSink) -> Fetched: ...

    def observe(self, lease: LC, response: Response) -> None:
        """What the source learns from an answer, before the lease is closed with it; store
        I/O, run with the store write (the gateway's swap detection)."""
        ...


class SyncSource(Protocol[LC]):
    def fetch(self, lease: LC, sink: ChunkSink) -> Fetched:
        """How one caller reaches its upstream for a lease, from a thread."""
        ...


# -- the leader's side --


async def lead(
    lease: L,
    flight: Flight[Completion],
    source: Source[L],
    store_io: StoreIO,
    clock: Clock,
) -> None:
    """The leader's fetch, a task of its own (module docstring): it settles the flight and
    closes the lease, each exactly once."""
    done: Completion | None = None
    error: BaseException | None = None
    started_s = clock.monotonic_s()
    try:
        fetched = await source.fetch(lease, flight)
        if fetched.elsewhere:  # a coalesced hit: nothing to store
            done = _first(lease.close_shared(lease.answer(fetched.response, 0.0)))
            flight.settle(done, None)
            return
        upstream_s = clock.monotonic_s() - started_s
        done = lease.answer(fetched.response, upstream_s)
        flight.settle(done, None)  # every reader has its answer; storing can take its time
        if fetched.after is not None:
            await fetched.after()
        await store_io.write(
            _record, lease, source, fetched.response, upstream_s, failed=lease.store_failed
        )
    except asyncio.CancelledError:
        error = _failed(lease, done, UpstreamAbortedError("every client left before the answer"))
        raise
    except Exception as exc:  # noqa: BLE001 - handed to every reader through the flight
        error = _failed(lease, done, exc)
    finally:
        lease.close(None)  # no-op unless the call, the store or the close failed
        if done is None:
            flight.settle(None, error)


def _record(lease: L, source: Source[L], response: Response, upstream_s: float) -> None:
    """Store I/O after an answer: what the source learns, then the lease closed (stored if
    allowed)."""
    source.observe(lease, response)
    lease.close(response, upstream_s=upstream_s)


def lead_sync(
    lease: L,
    flight: Flight[Completion],
    source: SyncSource[L],
    clock: Clock,
    abandoned: threading.Event | None = None,
) -> None:
    """`lead` for threads: the fetch, settle and close in the calling thread. With
    `abandoned`, a publish after every reader left ends the fetch."""
    done: Completion | None = None
    error: BaseException | None = None
    started_s = clock.monotonic_s()
    try:
        sink: ChunkSink = flight if abandoned is None else _Abandonable(flight, abandoned)
        fetched = source.fetch(lease, sink)
        upstream_s = clock.monotonic_s() - started_s
        done = lease.answer(fetched.response, upstream_s)
        flight.settle(done, None)
        lease.close(fetched.response, upstream_s=upstream_s)
    except Exception as exc:  # noqa: BLE001 - handed to every reader through the flight
        error = _failed(lease, done, exc)
    finally:
        lease.close(None)
        if done is None:
            flight.settle(None, error)


def _failed(
    lease: MissLease[Any], done: Completion | None, exc: BaseException
) -> BaseException | None:
    """The error the flight settles with (None: the readers have the answer already, and
    storing it failed: a bug, logged). Call from an `except` block."""
    if done is not None:
        log.exception("storing the answer for %s failed", lease.flight_key)
        return None
    if not isinstance(exc, UpstreamAbortedError):
        log.info("upstream call for %s ended without an answer: %r", lease.flight_key, exc)
    return exc


class _Abandonable:
    """A flight whose publish ends the fetch once every reader has left."""

    def __init__(self, flight: Flight[Completion], abandoned: threading.Event) -> None:
        self._flight = flight
        self._abandoned = abandoned

    def publish(self, *chunks: StreamChunk) -> None:
        if self._abandoned.is_set():
            raise UpstreamAbortedError("every reader left before the answer completed")
        self._flight.publish(*chunks)

    @property
    def published(self) -> int:
        return self._flight.published


def close_fetched(lease: MissLease[Any], response: Response, upstream_s: float) -> Completion:
    """Close `lease` with an answer fetched outside any flight (a replayed log)."""
    if not lease.close(response, upstream_s=upstream_s):
        raise RuntimeError("a lease was closed twice")
    return lease.answer(response, upstream_s)


# -- joining: one request's lease on its flight --


def coalesce(
    lease: MissLease[T],
    flights: FlightTable[Completion],
    source: Source[Any],
    store_io: StoreIO,
    clock: Clock,
) -> MissFlight[T]:
    """Lead (start the fetch) or join the flight for `lease`, on an event loop."""
    flight, leader = flights.lead_or_join(lease.flight_key)
    task: asyncio.Task[None] | None = None
    if leader:
        # The task starts before any reader can wait and leave (call_soon order), so an idle
        # cancel always reaches a running fetch.
        task = asyncio.ensure_future(lead(lease, flight, source, store_io, clock))
        flight.cancel_when_idle(task)
    return MissFlight(lease, flight, leader, task)


def coalesce_sync(
    lease: MissLease[T],
    flights: FlightTable[Completion],
    source: SyncSource[Any],
    clock: Clock,
    *,
    stream: bool = False,
) -> MissFlight[T]:
    """Lead or join the flight for `lease`, from a thread. The leader fetches now, in this
    thread; with `stream`, in a thread of its own, so the caller can read as it comes."""
    flight, leader = flights.lead_or_join(lease.flight_key)
    if not leader:
        return MissFlight(lease, flight, False)
    if not stream:
        lead_sync(lease, flight, source, clock)
        return MissFlight(lease, flight, True)
    abandoned = threading.Event()
    flight.cancel_when_idle(abandoned.set)
    fetch = (lease, flight, source, clock, abandoned)
    thread = threading.Thread(target=lead_sync, args=fetch, name="infercache-fetch", daemon=True)
    thread.start()
    return MissFlight(lease, flight, True, thread=thread)


class MissFlight(Generic[R]):
    """One request's lease on its flight: what the leader and the waiters read."""

    __slots__ = ("_task", "_thread", "flight", "leader", "lease")

    def __init__(
        self,
        lease: MissLease[R],
        flight: Flight[Completion],
        leader: bool,
        task: asyncio.Task[None] | None = None,
        *,
        thread: threading.Thread | None = None,
    ) -> None:
        self.lease, self.flight, self.leader = lease, flight, leader
        self._task, self._thread = task, thread

    # -- asyncio --

    async def answer(self) -> R:
        """The answer, not streamed. The leader waits for its fetch to end (the store is
        within the store budget), so its caller finds the answer stored when it asks again;
        waiters never wait for the store."""
        if self.leader:
            fetched = await self.flight.result()
            await self._fetch_ended()
            return self.lease.reply(fetched)
        try:
            return _first(self.lease.close_shared(await self.flight.result()))
        finally:
            self.lease.close_shared(None)  # no-op unless the flight failed or we were cancelled

    async def start_stream(self) -> bool:
        """Wait for the first event, so an upstream refusal is raised (it keeps its own HTTP
        status); whether the answer is an identical request's (a coalesced hit)."""
        await self.flight.first_event()
        return self._started()

    async def chunks(self, whole: Whole) -> AsyncGenerator[StreamChunk, None]:
        """Every chunk from the first (`whole(answer)`'s when the source published none: the
        answer came whole), then raises the flight's error; the leader's answer is stored
        before the last chunk's iteration ends."""
        done: Completion | None = None
        try:
            seen = 0
            async for chunk in self.flight.chunks():
                seen += 1
                yield chunk
            done = self.flight.outcome()
            if not seen:
                for chunk in whole(done.response):
                    yield chunk
            await self._fetch_ended()
        finally:
            if not self.leader:
                self.lease.close_shared(done)

    async def _fetch_ended(self) -> None:
        """Wait for the leader's fetch to end without cancelling it if this reader is
        cancelled. A task that has ended (a store on the loop ends with its fetch) costs no
        turn of the event loop: `asyncio.wait` would take one even then."""
        if self._task is not None and not self._task.done():
            await asyncio.wait({self._task})

    # -- threads --

    def wait(self) -> R:
        """`answer` for a thread."""
        if self.leader:  # its fetch has settled the flight, in this thread or its own
            self._join()
            return self.lease.reply(self.flight.outcome())
        try:
            return _first(self.lease.close_shared(self.flight.wait()))
        finally:
            self.lease.close_shared(None)

    def start_sync_stream(self) -> bool:
        """`start_stream` for a thread."""
        self.flight.wait_first_event()
        return self._started()

    def iter_chunks(self, whole: Whole) -> Generator[StreamChunk, None, None]:
        """`chunks` for a thread."""
        done: Completion | None = None
        try:
            seen = 0
            for chunk in self.flight.iter_chunks():
                seen += 1
                yield chunk
            done = self.flight.outcome()
            if not seen:
                yield from whole(done.response)
            self._join()
        finally:
            if not self.leader:
                self.lease.close_shared(done)

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()

    def _started(self) -> bool:
        refusal = self.flight.error_before_chunks
        if refusal is not None:
            if not self.leader:
                self.lease.close_shared(None)
            raise refusal
        settled = self.flight.result_now()
        return not self.leader or (settled is not None and settled.coalesced)


def _first(done: T | None) -> T:
    """The value a first close returned (a lease is closed once, by its owner)."""
    if done is None:
        raise RuntimeError("a lease was closed twice")
    return done
