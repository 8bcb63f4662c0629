"""Stop strings over a text stream.

`StopMatcher.feed(delta)` returns the text that is safe to emit and whether a stop string was
found. It holds back the longest tail that could still grow into a stop string, so a stop
string split across deltas is never partly emitted. On a match, the text before the earliest
stop string is emitted and the stop string itself is trimmed (OpenAI's behaviour).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = tuple(stops)
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Text safe to emit after `text`; sets `stopped` when a stop string appears."""
        if self.stopped:
            return ""
        buffer = self._held + text
        found = [i for i in (buffer.find(s) for s in self._stops) if i >= 0]
        if found:
            self.stopped = True
            self._held = ""
            return buffer[: min(found)]
        keep = self._partial_stop_len(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """The held-back tail, at the end of the stream (no stop string completed)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_stop_len(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop string."""
        longest = max((len(s) for s in self._stops), default=0)
        for k in range(min(len(buffer), longest - 1), 0, -1):
            tail = buffer[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0
