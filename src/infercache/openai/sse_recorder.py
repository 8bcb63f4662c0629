"""`StreamRecorder`: the SSE bytes of a chat-completions stream, as a client reads them, folded
into one `chat.completion` (chat.CompletionAssembler), so a stream passed through to its caller
can be stored once it is known to be whole.

Parsing follows the SSE framing: `data:` lines (one leading space dropped) joined until a blank
line ends the event; other fields and comments are ignored; bytes may split anywhere. The
answer (`result()`) exists only when the stream ended properly: `[DONE]` arrived (`ended`),
every choice got a finish_reason, and no event was an error or not JSON. Anything else — cut
off, an error event mid-stream — gives None: never stored.

Pure: no I/O, no clock. `started_s` is kept for the caller, who times the upstream call.
"""

from __future__ import annotations

import json
from typing import Any

from infercache.chat import CompletionAssembler


class StreamRecorder:
    """Folds the SSE bytes passed to the caller into one completion; `result()` is it only
    if the stream ended properly (every choice finished, then `[DONE]`)."""

    def __init__(self, started_s: float) -> None:
        self.started_s = started_s
        self._buffer = b""
        self._data: list[bytes] = []
        self._assembler = CompletionAssembler()
        self._done = False
        self._failed = False

    def feed(self, data: bytes) -> None:
        self._buffer += data
        while True:
            line, newline, rest = self._buffer.partition(b"\n")
            if not newline:
                return
            self._buffer = rest
            self._line(line.rstrip(b"\r"))

    def _line(self, line: bytes) -> None:
        if line.startswith(b"data:"):
            self._data.append(line[5:].removeprefix(b" "))
        elif not line and self._data:  # a blank line ends an event
            payload, self._data = b"\n".join(self._data), []
            self._event(payload)

    def _event(self, payload: bytes) -> None:
        if self._done or payload.strip() == b"[DONE]":
            self._done = True
            return
        try:
            chunk = json.loads(payload)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict) or chunk.get("error") is not None:
            self._failed = True  # an error event mid-stream: never store
            return
        self._assembler.add(chunk)

    @property
    def ended(self) -> bool:
        """`[DONE]` arrived: nothing the stream sends after it can change the answer."""
        return self._done

    def result(self) -> dict[str, Any] | None:
        if self._done and not self._failed and self._assembler.complete:
            return self._assembler.result()
        return None
