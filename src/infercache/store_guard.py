"""A store that can stall or fail without stalling anything else: a latency budget per call and
a circuit breaker, around any `Backend`.

    GuardedBackend(inner, budget_s=0.05)   the inner store opened with its own client timeout
                                           at the budget (open_store(..., timeout_s=...)):
                                           SQLite's busy timeout, Redis' socket timeout
      call:  breaker open → StoreUnavailableError at once (the store is skipped: a counted miss)
             else the call, in the caller's thread (the gateway's lookup pool, never the event
             loop); the store's own timeout bounds it near the budget and raises StoreError,
             which counts a failure for the breaker. An answer that comes back late but whole is
             used and counted (`over_budget`), not held against the store: on a busy machine a
             healthy store can be late, and skipping it would only lose hits
      breaker (CircuitBreaker): `failures_to_open` consecutive failures open it for a backoff
             (`backoff_s`, doubling on each failed probe up to `max_backoff_s`); after the
             backoff one call is let through as a probe; its success closes the breaker

So a paused Redis or a SQLite file locked by another process costs hits, never latency: each
lookup waits about `budget_s` at most, and once the breaker is open not at all. (An earlier
version ran each call on a pool of its own to enforce the budget; the extra thread hop per call
cost more than half the gateway's hit throughput.) `StoreUnavailableError`
is a `StoreError`, so every layer already turns it into a counted miss; the exact layer counts
it as `store_unavailable`. `inline_reads(backend)` gives the gateway a way to read on its event
loop when the inner store supports it (memory, SQLite: base.InlineReads): entering it gives
way (`StoreWouldBlockError`) while the breaker is not closed (the retry off the loop takes the
skip or the probe), and inside it a call that would wait raises `StoreWouldBlockError` too (a
breaker opened meanwhile by another thread's failure skips the call, as off the loop).
`inline_writes(backend)` does the same for a miss's writes (base.InlineWrites): entry gives
way unless the breaker is closed and the store can take its write lock at once. Bulk reads
(`scan`, for rebuilding an index at start) and `close` are not budgeted. Thread-safe; the
clock is injected.

Where a store call made from an event loop runs is decided here and nowhere else (`StoreIO`,
which the library's asyncio path, the gateway and the wrapped client all ask):

    store_io.read(fn, ...)    on the loop, inside `inline_reads` (memory, SQLite), when the
                              call does no other blocking work; one that would wait gives way
                              and runs again off the loop (`reads_retried`)
    store_io.write(fn, ...)   the same inside `inline_writes`; a failed commit goes to `failed`
                              (the entry is lost, never the answer)
    store_io.off_loop(fn, ...)   always off the loop: Redis, bulk reads, closing, statistics
    Off the loop is a pool of `workers` threads of its own (the gateway: as many as cores), or
    asyncio's default executor. `inline` turns False once the calls compute embeddings (the
    semantic layer is on): milliseconds of CPU never run on the loop. A thread hop costs a
    call ~0.2 ms on a hit and ~0.5 ms of CPU on a miss (bench/README.md, "Gateway").

A `NodeUnavailableError` (one node of a Redis Cluster failing while the others serve) is not
held against the whole store: the cluster store has a breaker per node (cluster_breaker.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from infercache.clock import Clock
from infercache.errors import (
    NodeUnavailableError,
    StoreError,
    StoreUnavailableError,
    StoreWouldBlockError,
)
from infercache.stores.base import Backend, Entry, InlineReads, InlineWrites, StoreStats
from infercache.urls import mask_credentials

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    failures_to_open: int = 3
    backoff_s: float = 0.25
    max_backoff_s: float = 2.0

    def __post_init__(self) -> None:
        if self.failures_to_open < 1:
            raise ValueError(f"failures_to_open must be >= 1, got {self.failures_to_open}")
        if not 0 < self.backoff_s <= self.max_backoff_s:
            raise ValueError(f"need 0 < backoff_s <= max_backoff_s, got {self}")


class CircuitBreaker:
    """closed → (n failures) → open → (backoff) → one probe → closed, or open again."""

    def __init__(self, clock: Clock, settings: BreakerSettings | None = None) -> None:
        self._clock = clock
        self._settings = settings or BreakerSettings()
        self._lock = threading.Lock()
        self._failures = 0
        self._open_until_s: float | None = None
        self._backoff_s = self._settings.backoff_s
        self._probing = False
        self.opened = 0  # times the breaker opened

    @property
    def closed(self) -> bool:
        """Read without the lock (one attribute: as good as a read a moment earlier)."""
        return self._open_until_s is None

    @property
    def state(self) -> str:
        with self._lock:
            if self._open_until_s is None:
                return "closed"
            return "half-open" if self._probing else "open"

    def allow(self) -> bool:
        if self.closed:  # the hot path takes no lock
            return True
        with self._lock:
            if self._open_until_s is None:
                return True
            if self._probing or self._clock.monotonic_s() < self._open_until_s:
                return False
            self._probing = True  # this caller is the probe
            return True

    def record(self, ok: bool) -> None:
        if ok and self._failures == 0 and self._open_until_s is None:
            return  # a success while healthy changes nothing: no lock
        with self._lock:
            if ok:
                self._failures = 0
                if self._open_until_s is not None:
                    log.warning("cache store answers again: breaker closed")
                self._open_until_s = None
                self._probing = False
                self._backoff_s = self._settings.backoff_s
                return
            if self._probing:
                self._backoff_s = min(2 * self._backoff_s, self._settings.max_backoff_s)
                self._open_until_s = self._clock.monotonic_s() + self._backoff_s
                self._probing = False
                return
            self._failures += 1
            if self._open_until_s is None and self._failures >= self._settings.failures_to_open:
                self._open_until_s = self._clock.monotonic_s() + self._backoff_s
                self.opened += 1
                log.warning(
                    "cache store failing (%d in a row): skipped for %.2f s, then probed",
                    self._failures,
                    self._backoff_s,
                )


class GuardedBackend:
    """A `Backend` whose request-path calls are timed against `budget_s` behind a breaker."""

    def __init__(
        self,
        inner: Backend,
        *,
        clock: Clock,
        budget_s: float = 0.05,
        breaker: BreakerSettings | None = None,
    ) -> None:
        if budget_s <= 0:
            raise ValueError(f"budget_s must be > 0, got {budget_s}")
        self.inner = inner
        self.url = inner.url
        self.budget_s = budget_s
        self.breaker = CircuitBreaker(clock, breaker)
        self._clock = clock
        self._lock = threading.Lock()
        self.over_budget = 0
        self.skipped = 0
        # Checked once: isinstance against a runtime Protocol costs ~50 µs a call.
        self._inner_nonblocking = inner.nonblocking if isinstance(inner, InlineReads) else None
        self._inner_writes = inner.nonblocking_writes if isinstance(inner, InlineWrites) else None

    def nonblocking(self) -> AbstractContextManager[None]:
        """The inner store's non-blocking mode (it must be `InlineReads`): it gives way
        (`StoreWouldBlockError`) at once unless the breaker is closed."""
        if self._inner_nonblocking is None:
            raise TypeError(f"{type(self.inner).__name__} has no non-blocking reads")
        if not self.breaker.closed:
            raise StoreWouldBlockError("the store's breaker is not closed")
        return self._inner_nonblocking()

    @contextmanager
    def nonblocking_writes(self) -> Iterator[None]:
        """The inner store's non-blocking writes (it must be `InlineWrites`): entry gives way
        (`StoreWouldBlockError`) unless the breaker is closed; inside, each call is guarded
        as usual; a failed commit at the end counts against the breaker."""
        if self._inner_writes is None:
            raise TypeError(f"{type(self.inner).__name__} has no non-blocking writes")
        if not self.breaker.closed:
            raise StoreWouldBlockError("the store's breaker is not closed")
        try:
            with self._inner_writes():
                yield
        except StoreError:
            self.breaker.record(False)
            raise

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        breaker = self.breaker
        if not breaker.allow():
            with self._lock:
                self.skipped += 1
            raise StoreUnavailableError("the cache store is skipped while it fails")
        clock = self._clock
        started = clock.monotonic_s()
        try:
            result = fn(*args)
        except NodeUnavailableError:
            raise  # one cluster node: the store skips it itself (stores/cluster_breaker.py)
        except StoreError:
            breaker.record(False)
            raise
        if clock.monotonic_s() - started > self.budget_s:
            with self._lock:
                self.over_budget += 1
        breaker.record(True)
        return result

    # -- Store and MetaStore, each call budgeted --

    def get(self, key: str) -> Entry | None:
        return self._call(self.inner.get, key)

    def put(self, key: str, entry: Entry) -> None:
        self._call(self.inner.put, key, entry)

    def delete(self, key: str) -> None:
        self._call(self.inner.delete, key)

    def purge(self) -> int:
        return self._call(self.inner.purge)

    def stats(self) -> StoreStats:
        return self._call(self.inner.stats)

    def read_meta(self, names: Sequence[str]) -> dict[str, str]:
        return self._call(self.inner.read_meta, names)

    def write_meta(self, name: str, value: str) -> None:
        self._call(self.inner.write_meta, name, value)

    def incr_meta(self, name: str) -> int:
        return self._call(self.inner.incr_meta, name)

    def get_with_meta(self, key: str, names: Sequence[str]) -> tuple[Entry | None, dict[str, str]]:
        return self._call(self.inner.get_with_meta, key, names)

    def epoch(self) -> str:
        return self._call(self.inner.epoch)

    # -- not budgeted: bulk reads at start-up, and shutting down --

    def scan(self, prefix: str) -> Iterator[tuple[str, Entry]]:
        return self.inner.scan(prefix)

    def close(self) -> None:
        self.inner.close()

    def health(self) -> dict[str, Any]:
        with self._lock:
            over, skipped = self.over_budget, self.skipped
        return {
            "url": mask_credentials(self.url),
            "breaker": self.breaker.state,
            "breaker_opened": self.breaker.opened,
            "over_budget": over,
            "skipped": skipped,
            "budget_ms": self.budget_s * 1000,
        }


def inline_writes(backend: Backend) -> Callable[[], AbstractContextManager[None]] | None:
    """How to write `backend` on an event loop without waiting (its `nonblocking_writes`), or
    None when its writes may wait (Redis)."""
    return _inline(backend, InlineWrites, "nonblocking_writes")


def inline_reads(backend: Backend) -> Callable[[], AbstractContextManager[None]] | None:
    """How to read `backend` on an event loop without waiting (its `nonblocking`), or None when
    its reads may wait (Redis: every call crosses the network)."""
    return _inline(backend, InlineReads, "nonblocking")


def _inline(
    backend: Backend, seam: type[Any], method: str
) -> Callable[[], AbstractContextManager[None]] | None:
    """`backend.<method>` when the store under the guard (if any) implements `seam`: the
    guard's own method of that name wraps the inner store's with its breaker."""
    inner = backend.inner if isinstance(backend, GuardedBackend) else backend
    if not isinstance(inner, seam):
        return None
    found: Callable[[], AbstractContextManager[None]] = getattr(backend, method)
    return found


class StoreIO:
    """Where a store call made from an event loop runs (module docstring). Thread-safe."""

    def __init__(self, backend: Backend, *, workers: int | None = None) -> None:
        self._reads = inline_reads(backend)
        self._writes = inline_writes(backend)
        self._pool = (
            ThreadPoolExecutor(workers, thread_name_prefix="infercache-store")
            if workers is not None
            else None
        )
        self.inline = True  # False while the calls may compute embeddings
        self.reads_retried = 0  # inline reads that gave way and ran off the loop
        self.writes_retried = 0

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._reads is not None and self.inline:
            try:
                with self._reads():
                    return fn(*args, **kwargs)
            except StoreWouldBlockError:
                self.reads_retried += 1
        return await self.off_loop(fn, *args, **kwargs)

    async def write(
        self,
        fn: Callable[..., object],
        *args: Any,
        failed: Callable[[StoreError], None],
        **kwargs: Any,
    ) -> None:
        if self._writes is not None and self.inline:
            try:
                with self._writes():
                    fn(*args, **kwargs)
                return
            except StoreWouldBlockError:  # raised on entry: nothing was written yet
                self.writes_retried += 1
            except StoreError as exc:  # the commit failed: the entry is lost, the answer is not
                failed(exc)
                return
        await self.off_loop(fn, *args, **kwargs)

    async def off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Stop the pool's idle threads; calls queued on it are dropped (may be called from
        one of its threads)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
