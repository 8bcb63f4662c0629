"""Injected time. Wall time (`now_s`) dates entries and must agree across processes sharing a
store; monotonic time (`monotonic_s`) measures durations. Tests and the traffic replay drive a
`ManualClock` instead of sleeping."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Seconds since the epoch (wall clock)."""
        ...

    def monotonic_s(self) -> float:
        """Seconds on a clock that never goes backwards (for durations)."""
        ...


class SystemClock:
    def now_s(self) -> float:
        return time.time()

    def monotonic_s(self) -> float:
        return time.perf_counter()


class ManualClock:
    """A clock that moves only when told to. Both readings advance together."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self._lock = threading.Lock()
        self._now_s = start_s
        self._mono_s = 0.0

    def now_s(self) -> float:
        with self._lock:
            return self._now_s

    def monotonic_s(self) -> float:
        with self._lock:
            return self._mono_s

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back: advance({seconds})")
        with self._lock:
            self._now_s += seconds
            self._mono_s += seconds

    def set_now(self, now_s: float) -> None:
        """Jump the wall clock forward to `now_s` (used by the log replay)."""
        with self._lock:
            if now_s > self._now_s:
                self._mono_s += now_s - self._now_s
                self._now_s = now_s
