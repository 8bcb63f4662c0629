"""Reading request logs: files → `LogRecord`s in time order, every bad line accounted for.

Formats, detected line by line from the content (a file may mix them; gzip is detected by its
magic bytes, not by the file name):
- `body`: an OpenAI chat-completions request body (`{"model", "messages", ...}`). No time.
- `record`: `{"timestamp", "request", "response"?, "tenant"?}`, timestamp in seconds. The
  gateway's request log (gateway/requestlog.py) is one, with `model`, `layer`, `status`,
  `prompt_tokens`, `completion_tokens`, `cached_tokens` and `latency_ms` besides; read when
  present: `upstream_ms` (the upstream call alone), `ttft_ms` (its time to first token),
  `tenant_name` (the tenant's configured name), and `upstream` with `prompt_cache` (the
  provider prompt cache's usage of the line's own upstream call: provider_prompt_cache.py).
- `redacted`: a line written by `serve --redact` (redaction.py): `key_digest` (an HMAC of the
  exact key), `prefix_hashes` and `prefix_chunk_tokens` (the chained prefix hashes) instead of
  `request`; exact repeats and prefix reuse are counted from them. An older redacted line
  carries only `request_digest` (sha256 of the body): exact repeats only. A redacted line with
  neither (`"redaction"` alone: embeddings, a refused request) is malformed, as its plain twin
  is an invalid request.
- `blocks`: a block-hash trace line in the Mooncake form `{"timestamp" (ms), "input_length",
  "output_length", "hash_ids"}`: `hash_ids[i]` names prompt block i together with everything
  before it, so equal leading ids are a reusable prefix.
A line that is not JSON, not an object, or none of these, is malformed: counted, its file and
line number kept (`LineErrors`), skipped. Nothing is fatal unless no line at all can be read.
A gateway's shadow-traffic line (`"shadow": true`: a mirrored request no client was answered
from, gateway/shadow_mirror.py) is not traffic: skipped, counted in `shadow_lines`.

Order: each file is read in order through a reorder window of `reorder_window` records (a
min-heap on the timestamp), which absorbs the jitter of logs written when requests *finish*;
several files are merged by timestamp (`heapq.merge`). A record still older than one already
emitted is counted in `LineErrors.out_of_order` and kept (replay clocks never move back). A line
without a timestamp takes the timestamp of the line before it in its file. Memory: the window,
never the file.
"""

from __future__ import annotations

import gzip
import heapq
import json
import math
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, NamedTuple, cast

from infercache.analyze.provider_prompt_cache import LoggedPromptCache
from infercache.errors import ConfigError
from infercache.prompt_cache.usage import PromptCacheUsage

GZIP_MAGIC = b"\x1f\x8b"
BLOCK_TRACE_TIME_UNIT_S = 0.001  # Mooncake traces count milliseconds


class LineFormat(StrEnum):
    BODY = "body"
    RECORD = "record"
    REDACTED = "redacted"
    BLOCKS = "blocks"


class LogRecord(NamedTuple):  # a NamedTuple: one per line, cheaper than frozen
    source: str  # file name
    line: int  # 1-based line number in that file
    kind: LineFormat
    timestamp_s: float | None
    request: dict[str, Any] | None = None  # the body as the client sent it
    response: dict[str, Any] | None = None
    tenant: str | None = None  # an authenticated tenant (overrides the body's claim)
    model: str | None = None
    digest: str | None = None  # `redacted`: key_digest (HMAC) or the older request_digest
    hash_chunk_tokens: tuple[int, ...] | None = None  # `redacted`: tokens of each hash
    prefix_tokenizer: str | None = None  # `redacted`: the tokenizer the hashes come from
    not_cacheable: str | None = None  # `redacted`: why the exact cache would not serve it
    tenant_name: str | None = None  # the tenant's configured name, when logged
    upstream_s: float | None = None  # the upstream call alone (`upstream_ms`)
    ttft_s: float | None = None  # its time to first token (`ttft_ms`)
    cached_tokens: int | None = None  # prompt tokens the upstream served from its cache
    hash_ids: tuple[int, ...] | None = None  # `blocks`, `redacted` (prefix hashes)
    prompt_tokens: int | None = None  # as logged (gateway usage, trace input_length)
    completion_tokens: int | None = None
    latency_s: float | None = None
    layer: str | None = None  # what the gateway did live: exact-hit, miss, ...
    prompt_cache: LoggedPromptCache | None = None  # its upstream call's provider prompt cache

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


@dataclass
class LineErrors:
    """Malformed lines: how many, and the first `max_kept` with their place and reason."""

    max_kept: int = 50
    count: int = 0
    kept: list[tuple[str, int, str]] = field(default_factory=list)
    out_of_order: int = 0

    def add(self, source: str, line: int, reason: str) -> None:
        self.count += 1
        if len(self.kept) < self.max_kept:
            self.kept.append((source, line, reason))


class Malformed(ValueError):
    """A line that cannot be read; the message says why."""


def _number(obj: dict[str, Any], name: str) -> float | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise Malformed(f"{name} must be a number, got {value!r:.40}")
    return float(value)


def _count(obj: dict[str, Any], name: str, *, required: bool = False) -> int | None:
    value = obj.get(name)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Malformed(f"{name} must be a non-negative integer, got {value!r:.40}")
    return value


def _object(obj: dict[str, Any], name: str) -> dict[str, Any] | None:
    value = obj.get(name)
    if value is not None and not isinstance(value, dict):
        raise Malformed(f"{name} must be an object, got {type(value).__name__}")
    return value


def _string(obj: dict[str, Any], name: str) -> str | None:
    value = obj.get(name)
    if value is not None and not isinstance(value, str):
        raise Malformed(f"{name} must be a string, got {value!r:.40}")
    return value


def _blocks(obj: dict[str, Any], source: str, line: int) -> LogRecord:
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not ids:
        raise Malformed("hash_ids must be a non-empty list of integers")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise Malformed("hash_ids must be a non-empty list of integers")
    input_length = _count(obj, "input_length", required=True)
    if not input_length:
        raise Malformed("input_length must be at least 1")
    timestamp = _number(obj, "timestamp")
    return LogRecord(
        source,
        line,
        LineFormat.BLOCKS,
        None if timestamp is None else timestamp * BLOCK_TRACE_TIME_UNIT_S,
        hash_ids=tuple(ids),
        prompt_tokens=input_length,
        completion_tokens=_count(obj, "output_length"),
    )


def _ints(obj: dict[str, Any], name: str) -> tuple[int, ...]:
    values = obj.get(name)
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise Malformed(f"{name} must be a list of non-negative integers")
    return tuple(values)


def _seconds(obj: dict[str, Any], name: str) -> float | None:
    ms = _number(obj, name)
    return None if ms is None else ms / 1000


def _prefix_chain(obj: dict[str, Any]) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    if "prefix_hashes" not in obj:
        return None, None
    hashes, sizes = _ints(obj, "prefix_hashes"), _ints(obj, "prefix_chunk_tokens")
    if len(hashes) != len(sizes) or not all(sizes):
        raise Malformed("prefix_hashes and prefix_chunk_tokens must pair up, no empty chunk")
    return hashes, sizes


def _refusal(obj: dict[str, Any]) -> str:
    status = obj.get("status")
    return f"status {status}" if status != 200 else "not a chat request"


def _record(obj: dict[str, Any], source: str, line: int) -> LogRecord:
    request = _object(obj, "request")
    digest = _string(obj, "key_digest") or _string(obj, "request_digest")
    if request is None and digest is None:
        if "redaction" in obj:  # the redacted log's line for a body the cache does not accept
            raise Malformed(f"redacted line of a request the cache refuses ({_refusal(obj)})")
        raise Malformed("a request record needs `request` (or `key_digest` when redacted)")
    hashes, sizes = _prefix_chain(obj) if request is None else (None, None)
    return LogRecord(
        source,
        line,
        LineFormat.RECORD if request is not None else LineFormat.REDACTED,
        _number(obj, "timestamp"),
        request=request,
        response=_object(obj, "response"),
        tenant=_string(obj, "tenant"),
        model=_string(obj, "model"),
        digest=digest,
        hash_ids=hashes,
        hash_chunk_tokens=sizes,
        prefix_tokenizer=_string(obj, "prefix_tokenizer"),
        not_cacheable=_string(obj, "not_cacheable"),
        tenant_name=_string(obj, "tenant_name"),
        prompt_tokens=_count(obj, "prompt_tokens"),
        completion_tokens=_count(obj, "completion_tokens"),
        latency_s=_seconds(obj, "latency_ms"),
        layer=_string(obj, "layer"),
        upstream_s=_seconds(obj, "upstream_ms"),
        ttft_s=_seconds(obj, "ttft_ms"),
        cached_tokens=_count(obj, "cached_tokens"),
        prompt_cache=_prompt_cache(obj),
    )


def _prompt_cache(obj: dict[str, Any]) -> LoggedPromptCache | None:
    """`upstream` and `prompt_cache` (None: the line made no upstream call, or is older)."""
    upstream, usage = _string(obj, "upstream"), _object(obj, "prompt_cache")
    if upstream is None or usage is None:
        return None
    counts = [_count(usage, n, required=True) or 0
              for n in ("input_tokens", "read_tokens", "write_tokens")]  # fmt: skip
    return LoggedPromptCache(upstream, _string(usage, "model") or "", PromptCacheUsage(*counts))


class NotTraffic(Exception):
    """A line that records no client's request (shadow traffic)."""


def parse_line(raw: bytes, source: str, line: int) -> LogRecord:
    """One log line as a record, `Malformed` saying why not, or `NotTraffic`."""
    try:
        obj = json.loads(raw)
    except ValueError as exc:  # includes UnicodeDecodeError
        raise Malformed(f"not JSON ({exc})") from exc
    if not isinstance(obj, dict):
        raise Malformed(f"a line must be a JSON object, got {type(obj).__name__}")
    if obj.get("shadow") is True:
        raise NotTraffic
    if "hash_ids" in obj:
        return _blocks(obj, source, line)
    if any(k in obj for k in ("request", "key_digest", "request_digest", "redaction")):
        return _record(obj, source, line)
    if "messages" in obj:
        return LogRecord(source, line, LineFormat.BODY, None, request=obj)
    raise Malformed(
        "not a request body, a request record or a block-hash trace line "
        f"(keys: {', '.join(sorted(obj)[:6])})"
    )


def _open(path: Path) -> tuple[IO[bytes], IO[bytes]]:
    """(the raw file, the byte stream to read lines from), or a ConfigError naming the file."""
    try:
        raw: IO[bytes] = path.open("rb")
    except OSError as exc:
        raise ConfigError(f"cannot read log {path}: {exc.strerror or exc}") from exc
    head = raw.read(2)
    raw.seek(0)
    if head == GZIP_MAGIC:
        return raw, cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))
    if not head:
        raw.close()
        raise ConfigError(f"log {path} is empty")
    return raw, raw


Progress = Callable[[int], None]  # bytes of input consumed since the last call


class LogReader:
    """Reads LOG files into time-ordered records. `errors` collects malformed lines."""

    def __init__(
        self,
        paths: Iterable[Path],
        *,
        reorder_window: int = 4096,
        errors: LineErrors | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.paths = list(paths)
        if not self.paths:
            raise ConfigError("no log file given")
        if reorder_window < 1:
            raise ConfigError(f"reorder_window must be >= 1, got {reorder_window}")
        self.errors = errors if errors is not None else LineErrors()
        self.lines = 0
        self.shadow_lines = 0  # shadow traffic: read, not counted as requests
        self._window = reorder_window
        self._progress = progress
        self._last_emitted_s: float | None = None

    def total_bytes(self) -> int:
        """Sizes of the files on disk (compressed, for gzip): the progress bar's total."""
        return sum(p.stat().st_size for p in self.paths if p.is_file())

    def __iter__(self) -> Iterator[LogRecord]:
        streams = [self._ordered(path, i) for i, path in enumerate(self.paths)]
        merged = streams[0] if len(streams) == 1 else heapq.merge(*streams)
        for _, _, record in merged:
            ts = record.timestamp_s
            if ts is not None:
                if self._last_emitted_s is not None and ts < self._last_emitted_s:
                    self.errors.out_of_order += 1
                else:
                    self._last_emitted_s = ts
            yield record

    def _ordered(self, path: Path, file_index: int) -> Iterator[tuple[float, int, LogRecord]]:
        """Records of one file through the reorder window, keyed (time, tie-break)."""
        heap: list[tuple[float, int, LogRecord]] = []
        carried = float("-inf")
        for n, record in enumerate(self._records(path)):
            if record.timestamp_s is not None:
                carried = record.timestamp_s
            # The tie-break keeps file order among equal times, and files in argument order.
            item = (carried, (n << 16) | min(file_index, 0xFFFF), record)
            if len(heap) < self._window:
                heapq.heappush(heap, item)
            else:
                yield heapq.heappushpop(heap, item)
        while heap:
            yield heapq.heappop(heap)

    def _records(self, path: Path) -> Iterator[LogRecord]:
        raw, stream = _open(path)
        name = str(path)
        position = 0
        line_no = 0
        try:
            with raw, stream:
                for line_no, line in enumerate(stream, start=1):
                    self.lines += 1
                    if self._progress is not None and line_no % 1024 == 0:
                        now = raw.tell()
                        self._progress(now - position)
                        position = now
                    if line.isspace():
                        continue
                    try:
                        yield parse_line(line, name, line_no)
                    except Malformed as exc:
                        self.errors.add(name, line_no, str(exc))
                    except NotTraffic:
                        self.shadow_lines += 1
        except (OSError, EOFError, zlib.error) as exc:
            # A truncated or corrupt gzip stream: keep what was read, report where it broke.
            self.errors.add(name, line_no + 1, f"unreadable from here on: {exc}")
        if line_no == 0:
            raise ConfigError(f"log {path} is empty")
        if self._progress is not None:
            self._progress(max(0, path.stat().st_size - position))


def estimate_lines(paths: Iterable[Path], *, probe_bytes: int = 1 << 20) -> int:
    """About how many lines the logs hold, from the first `probe_bytes` of each (decompressed
    for gzip, scaled by the compression ratio seen there). Sizes a sample before the pass; an
    unreadable file counts 0 (the pass itself reports it)."""
    total = 0
    for path in paths:
        try:
            size = path.stat().st_size
            with path.open("rb") as raw:
                head = raw.read(probe_bytes)
        except OSError:
            continue
        if head[:2] == GZIP_MAGIC:
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                text = inflate.decompress(head)
            except zlib.error:
                continue
            consumed = len(head) - len(inflate.unconsumed_tail) - len(inflate.unused_data)
            ratio = len(text) / consumed if consumed else 1.0
        else:
            text, ratio = head, 1.0
        lines = text.count(b"\n") or 1
        total += math.ceil(size * ratio * lines / max(1, len(text)))
    return total
