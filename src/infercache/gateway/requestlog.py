"""The request log: one JSON line per request, the traffic analyzer's input format.

    {"timestamp": 1732960000.123, "tenant": "acme", "model": "m", "request": {...},
     "layer": "exact-hit", "status": 200, "stream": false, "prompt_tokens": 412,
     "completion_tokens": 38, "cached_tokens": 384, "latency_ms": 1.9, "response": {...}}

`request` is the body as the client sent it; with `redact` only `request_digest` (its exact
cache key) is written, and no response. Lines are appended and flushed one at a time under a
lock, so a crash loses at most the line being written.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, TextIO


class RequestLog:
    def __init__(self, path: Path, *, redact: bool = False) -> None:
        self.path = path
        self.redact = redact
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def write(
        self,
        record: dict[str, Any],
        *,
        request: dict[str, Any] | None,
        digest: str | None,
        response: dict[str, Any] | None,
    ) -> None:
        out = dict(record)
        if self.redact:
            out["request_digest"] = digest
        else:
            out["request"] = request
            if response is not None:
                out["response"] = response
        line = json.dumps(out, separators=(",", ":"), ensure_ascii=False)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()
