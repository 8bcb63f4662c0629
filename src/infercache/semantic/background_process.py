"""`LowPriorityWorker`: CPU-heavy background work in one process of its own at the lowest CPU
priority, so it never slows serving.

A gateway serves from one Python process. Work run on a background thread of it (shadow mode's
head refit: seconds of Python over a window of judged pairs) holds the GIL in turns with the
request threads — each request then waits for the interpreter up to the switch interval at
every step — and competes for the same cores at the same priority. On 2 cores that moved the
gateway's p99 exact-hit latency ~10× while a refit ran (bench/README.md, "Semantic lookup
speed"). Here the work runs in a child process (no GIL shared) that has lowered its own
priority to nice 19 and, on Linux, the SCHED_IDLE policy (the kernel gives it the CPU time
serving leaves; on an idle box it still runs at full speed). What it cannot remove: the
child still runs on a core the gateway leaves idle and shares the caches and memory bandwidth
with it (measured in bench/README.md). The caller's thread waits without holding the GIL.

The child is started on first use with the `spawn` method (never `fork`: the gateway process
holds threads and locks a forked child would inherit half-held) and reused; `fn` and its
arguments must be picklable module-level objects. Started lazily: a gateway that never refits
starts no process. `close()` stops it; it also stops at interpreter exit.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

LOWEST_PRIORITY = 19


def _lower_priority(niceness: int) -> None:
    """In the child: raise its niceness to `niceness` (never lowers it; unprivileged), and on
    Linux move it to SCHED_IDLE (below every niceness: run when nothing else wants the CPU)."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, max(current, niceness))
    if hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


class LowPriorityWorker:
    def __init__(self, *, niceness: int = LOWEST_PRIORITY) -> None:
        if not 0 <= niceness <= LOWEST_PRIORITY:
            raise ValueError(f"niceness must be in 0..{LOWEST_PRIORITY}, got {niceness}")
        self._niceness = niceness
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._closed = False

    def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` in the worker process; its result or its exception."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the low-priority worker is closed")
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_lower_priority,
                    initargs=(self._niceness,),
                )
            pool = self._pool
        return pool.submit(fn, *args, **kwargs).result()

    def close(self) -> None:
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
