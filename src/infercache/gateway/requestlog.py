"""The request log: one JSON line per request, the traffic analyzer's input format.

    {"timestamp": 1732960000.123, "tenant": "acme", "model": "m", "request": {...},
     "layer": "exact-hit", "status": 200, "stream": false, "prompt_tokens": 412,
     "completion_tokens": 38, "cached_tokens": 384, "latency_ms": 1.9, "response": {...}}

plus `"version"` when the request was looked up under one of several live model versions;
when this request's own call went upstream (not a hit, not an answer an identical request in
flight or another gateway replica fetched), the upstream that answered and, when it reports
its prefix reuse over HTTP (every upstream but the in-process engine, which counts its own:
gateway/prefix_usage.py), the prompt-cache usage its answer reported, in one shape whatever
the API (prompt_cache/usage.py), with the answer's model (what `/stats` prices it at):

     "upstream": "https://api.anthropic.com/v1",
     "prompt_cache": {"model": "claude-sonnet-4-5", "input_tokens": 3120, "read_tokens": 3010,
                      "write_tokens": 0}

so `infercache analyze` shows the provider's prompt cache per upstream
(analyze/provider_prompt_cache.py); and
shadow traffic's lines (`"shadow": true`, gateway/shadow_mirror.py): the answer of the version
being rolled out, its agreement with the live answer, never served.

A `LogEntry` is the record of one request, started when it arrives; the request path closes it
exactly once, with the status, the answer and the upstream call's seconds when it made one
(`upstream_ms`), when the reply is complete (for a stream: when the stream ends). Closing it
counts the request in the per-request metrics (traffic.py), ends its tracing span (tracing.py)
and, with a request log, writes its line. `request` is the body as the client sent it.

With a `redactor` (`serve --redact`, redaction.py) no text is written: no request, no response,
but what the traffic analyzer needs from them: the exact key's HMAC (`key_digest`), the chained
prefix hashes of the tokenized prompt and the reason it is not cacheable, beside the counts,
timings and layer every line has. A body the cache does not accept (embeddings, a refused
request) gets only `"redaction": 1`. Redacting costs ~60 µs a request (bench/README.md,
"Analyzer"), on the thread that closes the entry.

Lines are appended and flushed one at a time under a lock, so a crash loses at most the line
being written.
"""

from __future__ import annotations

import json
import threading
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TextIO

from infercache.clock import Clock
from infercache.gateway.tracing import RequestSpan
from infercache.gateway.traffic import RequestMetrics
from infercache.gateway.upstream_protocols import Upstream
from infercache.policy import cached_tokens, usage_tokens
from infercache.prompt_cache.usage import prompt_cache_usage
from infercache.redaction import Redactor


class Answerer(Protocol):
    """Who fetched a request's answer (gateway/replica_fetch.py `CallerSource`)."""

    @property
    def upstream(self) -> Upstream | None:
        """The upstream this request's own call was answered by (None: it made none)."""


class RequestLog:
    def __init__(self, path: Path, *, redactor: Redactor | None = None) -> None:
        self.path = path
        self.redactor = redactor
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def _record(
        self,
        entry: LogEntry,
        status: int,
        response: dict[str, Any] | None,
        upstream_s: float | None,
        latency_s: float,
    ) -> None:
        prompt_tokens, completion_tokens = usage_tokens(response) if response else (0, 0)
        record: dict[str, Any] = {
            "timestamp": entry.started_s,
            "tenant": entry.tenant,
            "model": entry.body.get("model"),
            "layer": entry.layer,
            "status": status,
            "stream": entry.body.get("stream") is True,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": cached_tokens(response) if response else 0,
            "latency_ms": round(latency_s * 1000, 3),
        }
        if upstream_s is not None:
            record["upstream_ms"] = round(upstream_s * 1000, 3)
        if entry.version is not None:
            record["version"] = entry.version
        upstream = entry.answered_by.upstream if entry.answered_by is not None else None
        if upstream is not None and response is not None:
            record["upstream"] = upstream.name
            if not upstream.records_prefix_metrics:  # counted as prefix_usage.py counts it
                record["prompt_cache"] = _prompt_cache(response)
        self.write(record, entry.body, entry.tenant, response)

    def write(
        self,
        record: dict[str, Any],
        body: dict[str, Any],
        tenant: str,
        response: dict[str, Any] | None,
    ) -> None:
        """One line: `record` with the request and response, or (redacting) their digests."""
        if self.redactor is not None:
            record.update(self.redactor.fields(body, tenant))
        else:
            record["request"] = body
            if response is not None:
                record["response"] = response
        line = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
        with self._lock:
            if not self._file.closed:
                self._file.write(line + "\n")
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def _prompt_cache(response: dict[str, Any]) -> dict[str, Any]:
    """The answer's prompt-cache usage in one shape, with the model it is priced at."""
    usage = prompt_cache_usage(response)
    return {
        "model": str(response.get("model", "")),
        "input_tokens": usage.input_tokens,
        "read_tokens": usage.read_tokens,
        "write_tokens": usage.write_tokens,
    }


@dataclass(eq=False, repr=False, slots=True)
class LogEntry:
    """One request's record, closed once by `close`; a second close does nothing."""

    log: RequestLog | None
    traffic: RequestMetrics
    span: RequestSpan
    clock: Clock
    _: KW_ONLY
    operation: str
    tenant: str
    body: dict[str, Any]
    started_s: float = field(init=False)
    started_mono_s: float = field(init=False)
    layer: str | None = field(default=None, init=False)  # which layer answered, once known
    version: str | None = field(default=None, init=False)  # the version it was looked up under
    answered_by: Answerer | None = field(default=None, init=False)  # who fetched it, on a miss
    _closed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.started_s = self.clock.now_s() if self.log is not None else 0.0
        self.started_mono_s = self.clock.monotonic_s()

    def close(
        self,
        *,
        status: int,
        response: dict[str, Any] | None = None,
        upstream_s: float | None = None,
    ) -> None:
        """`upstream_s`: how long the upstream call took, when this request made one."""
        if self._closed:
            return
        self._closed = True
        latency_s = self.clock.monotonic_s() - self.started_mono_s
        layer = self.layer
        self.traffic.record(
            self.operation, self.tenant, self.body.get("model"), status, layer, response, latency_s
        )
        self.span.end(status=status, layer=layer, response=response)
        if self.log is not None:
            self.log._record(self, status, response, upstream_s, latency_s)
