"""Coalesce concurrent identical work in one process: the first caller for a key runs it, the
others wait and receive its result (or its exception).

- `SingleFlight` for threads: a dict of in-flight calls under a lock; waiters block on an Event.
- `AsyncSingleFlight` for one event loop: the work runs as its own task and every caller awaits
  it through `asyncio.shield`, so a caller that is cancelled (a client hanging up) cancels only
  its own wait, never the work the others are waiting on.

A key leaves the table as soon as its call finishes, so a later caller starts afresh (by then
the answer is in the cache). `do` returns (result, shared): `shared` is False for the caller
that ran the work.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Call(Generic[T]):
    __slots__ = ("done", "error", "result", "waiters")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self.waiters = 0


class SingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._joined = threading.Condition(self._lock)
        self._calls: dict[str, _Call[T]] = {}

    def do(self, key: str, fn: Callable[[], T]) -> tuple[T, bool]:
        with self._lock:
            call = self._calls.get(key)
            leader = call is None
            if call is None:
                call = self._calls[key] = _Call()
            else:
                call.waiters += 1
                self._joined.notify_all()
        if not leader:
            call.done.wait()
            if call.error is not None:
                raise call.error
            return call.result, True  # type: ignore[return-value]  # set before done
        try:
            call.result = fn()
        except BaseException as exc:
            call.error = exc
            raise
        finally:
            with self._lock:
                del self._calls[key]
            call.done.set()
        return call.result, False

    def do_or_run(self, key: str | None, fn: Callable[[], T]) -> tuple[T, bool]:
        """`do`, or just run `fn` when there is no key to coalesce on."""
        return (fn(), False) if key is None else self.do(key, fn)

    def in_flight(self) -> int:
        with self._lock:
            return len(self._calls)

    def wait_for_waiters(self, key: str, n: int, timeout_s: float) -> bool:
        """Block until `n` callers wait on the call for `key` (observability and tests)."""
        with self._joined:
            return self._joined.wait_for(
                lambda: (c := self._calls.get(key)) is not None and c.waiters >= n, timeout_s
            )


class AsyncSingleFlight(Generic[T]):
    def __init__(self) -> None:
        self._tasks: dict[str, asyncio.Task[T]] = {}

    async def do(self, key: str, fn: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        task = self._tasks.get(key)
        shared = task is not None
        if task is None:
            task = asyncio.ensure_future(fn())
            self._tasks[key] = task
            task.add_done_callback(functools.partial(self._finished, key))
        return await asyncio.shield(task), shared

    def _finished(self, key: str, task: asyncio.Task[T]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled():
            # Mark the exception retrieved: every waiter may have been cancelled meanwhile, and
            # the error already reached whoever was still waiting.
            task.exception()

    async def do_or_run(self, key: str | None, fn: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        return (await fn(), False) if key is None else await self.do(key, fn)

    def in_flight(self) -> int:
        return len(self._tasks)
