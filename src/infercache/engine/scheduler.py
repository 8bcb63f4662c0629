"""Continuous batching: which sequences run, and what each step computes.

A waiting queue (FIFO, bounded) and a running set. Before every step:

1. Admission: the head of the queue joins the running set while fewer than `max_batch`
   sequences run and its KV reservation (`Sequence.reserved_tokens`) fits in what
   `max_running_tokens` leaves; a sequence that fits nowhere is admitted alone once nothing
   else runs, so it never starves. Strictly first come, first served: nobody jumps the queue.
2. The step's plan, within `max_step_tokens` tokens: the next token of every decoding sequence
   first (a decode is never starved by prefills), then prompt chunks of the prefilling
   sequences in admission order, as far as the budget goes. A long prompt is thus prefilled
   over several steps, and the running decodes never wait for more than one chunk.

Sequences join and leave between steps; the runner (runner.py) carries out the plan.
Backpressure instead of an unbounded queue: `Scheduler.enqueue` refuses with `OverloadedError`
(HTTP 429 with Retry-After) when `max_queue` sequences already wait beyond the places still free
in the batch (a burst into an idle engine fills the batch first, then the queue).

Parameters (`config.BatchLimits`): `max_batch` (running sequences), `max_queue` (waiting
sequences), `max_step_tokens` (tokens computed per step; > `max_batch`, so prefill always
progresses), `max_running_tokens` (KV positions reserved by running sequences, None:
unbounded).
Thread-safety: `WaitingQueue` and `Scheduler.enqueue` may be used from any thread; the rest of
`Scheduler` has one owner (the engine's worker thread).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from infercache.engine.config import BatchLimits
from infercache.engine.sequence import Sequence
from infercache.errors import OverloadedError


@dataclass(frozen=True, slots=True)
class StepPlan:
    """`decode`: sequences that feed their pending token; `prefill`: (sequence, prompt tokens
    to compute this step)."""

    decode: tuple[Sequence, ...]
    prefill: tuple[tuple[Sequence, int], ...]

    @property
    def tokens(self) -> int:
        return len(self.decode) + sum(n for _, n in self.prefill)

    @property
    def sequences(self) -> int:
        return len(self.decode) + len(self.prefill)


class WaitingQueue:
    """The FIFO of sequences not yet admitted. Thread-safe."""

    def __init__(self, *, retry_after_s: int = 1) -> None:
        self._retry_after_s = retry_after_s
        self._items: deque[Sequence] = deque()
        self._lock = threading.Lock()

    def put(self, seq: Sequence, *, room: int) -> None:
        """Append `seq`, or refuse it when `room` sequences already wait."""
        with self._lock:
            if len(self._items) >= room:
                raise OverloadedError(
                    f"the engine is at capacity ({len(self._items)} requests waiting); retry later",
                    retry_after_s=self._retry_after_s,
                )
            self._items.append(seq)

    def __len__(self) -> int:
        return len(self._items)

    def pop_if(self, admissible: Callable[[Sequence], bool]) -> Sequence | None:
        """The head, removed, if `admissible(head)`; else None."""
        with self._lock:
            if self._items and admissible(self._items[0]):
                return self._items.popleft()
            return None

    def take_cancelled(self) -> list[Sequence]:
        with self._lock:
            gone = [s for s in self._items if s.cancel.is_set()]
            if gone:
                self._items = deque(s for s in self._items if not s.cancel.is_set())
            return gone

    def take_all(self) -> list[Sequence]:
        with self._lock:
            items, self._items = list(self._items), deque()
            return items

    def rewrite(self, fn: Callable[[Sequence], Sequence | None]) -> None:
        """Replace every waiting sequence by `fn(seq)` (None drops it), in place and order."""
        with self._lock:
            kept = (fn(s) for s in list(self._items))
            self._items = deque(s for s in kept if s is not None)


class Scheduler:
    def __init__(self, limits: BatchLimits, waiting: WaitingQueue) -> None:
        self.limits = limits
        self.waiting = waiting
        self.running: list[Sequence] = []
        self.reserved_tokens = 0
        self.admitting = True

    def enqueue(self, seq: Sequence) -> None:
        """Queue `seq` (from any thread), or raise `OverloadedError`."""
        free = max(0, self.limits.max_batch - len(self.running)) if self.admitting else 0
        self.waiting.put(seq, room=self.limits.max_queue + free)

    def next_admissible(self) -> Sequence | None:
        """Take the head of the queue if it may join the running set now."""
        if not self.admitting or len(self.running) >= self.limits.max_batch:
            return None
        return self.waiting.pop_if(self._fits)

    def _fits(self, seq: Sequence) -> bool:
        budget = self.limits.max_running_tokens
        if budget is None or not self.running:
            return True
        return self.reserved_tokens + seq.reserved_tokens <= budget

    def add_running(self, seq: Sequence) -> None:
        self.running.append(seq)
        self.reserved_tokens += seq.reserved_tokens

    def remove_running(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.reserved_tokens -= seq.reserved_tokens

    def plan(self) -> StepPlan:
        decode = tuple(s for s in self.running if not s.prefilling)
        budget = self.limits.max_step_tokens - len(decode)
        prefill: list[tuple[Sequence, int]] = []
        for seq in self._prefilling():
            if budget <= 0:
                break
            n = min(seq.prompt_len - seq.computed, budget)
            prefill.append((seq, n))
            budget -= n
        return StepPlan(decode, tuple(prefill))

    def _prefilling(self) -> Iterator[Sequence]:
        return (s for s in self.running if s.prefilling)
