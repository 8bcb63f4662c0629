"""Reading and preparing in a child process; tokenising, the census and the replays here.

The census is sequential by nature (each request is classified against everything before it),
but reading, parsing, validating and keying a request need nothing from the requests before it.
So with `parallel`, a child process runs LogReader → RequestPreparer (log_reader.py,
prepared_request.py) and sends the prepared requests in batches through a bounded queue (at
most `max_batches` in flight, so memory stays bounded and a slow consumer holds the child
back). Token ids are not sent: unpickling them costs more than tokenising the prompt again from
its cached runs (bench/README.md, Analyzer, design figures). The child sends the prompt's
(role, text) turns instead and this process tokenises them (`RequestPreparer.tokenize`), which
also balances the two processes' work. Unless the replay needs them, request and response
bodies are not sent.
The child's malformed lines, line count, record kinds and the provider prompt cache's
figures (every parsed line's, priced: provider_prompt_cache.py) arrive in the last message. An
exception in the child is raised here: an `InfercacheError` as `ConfigError` with its
message, anything else as `RuntimeError` carrying the child's traceback.
Start method `spawn`: this process may hold torch or tokenizer threads, which `fork` would
copy half-locked. So the tokenizer factory must be picklable (`functools.partial` over
`load_tokenizer`, or a class such as `Chars4Tokenizer`).
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

from infercache.analyze.log_reader import LineErrors, LogReader, Progress
from infercache.analyze.prepared_request import PreparedRequest, RequestPreparer, tokenized
from infercache.analyze.provider_prompt_cache import ProviderPromptCaches
from infercache.errors import ConfigError, InfercacheError
from infercache.metrics import PriceTable
from infercache.policy import CachePolicy
from infercache.tokenizing.tokenizers import PromptTokenizer


@dataclass(frozen=True, slots=True)
class SourceSpec:
    """Everything the child needs to produce the events (picklable)."""

    paths: tuple[Path, ...]
    tokenizer: Callable[[], PromptTokenizer]
    policy: CachePolicy
    ignorable_fields: frozenset[str]
    block_tokens: int
    with_queries: bool
    keep_bodies: bool
    reorder_window: int
    batch: int
    prices: PriceTable = field(default_factory=PriceTable)  # provider prompt cache prices


@dataclass
class Summary:
    """What the reader learnt besides the events."""

    errors: LineErrors = field(default_factory=LineErrors)
    lines: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    prompt_caches: ProviderPromptCaches = field(default_factory=ProviderPromptCaches)


def produce(
    spec: SourceSpec,
    emit: Callable[[list[PreparedRequest]], None],
    progress: Progress | None = None,
    *,
    tokenize: bool = True,
) -> Summary:
    """Read and prepare every record, handing them to `emit` in batches of `spec.batch`."""
    summary = Summary(prompt_caches=ProviderPromptCaches(spec.prices))
    reader = LogReader(
        spec.paths, reorder_window=spec.reorder_window, errors=summary.errors, progress=progress
    )
    preparer = RequestPreparer(
        spec.tokenizer,
        spec.policy,
        summary.errors,
        block_tokens=spec.block_tokens,
        with_queries=spec.with_queries,
        ignorable_fields=spec.ignorable_fields,
        tokenize=tokenize,
    )
    batch: list[PreparedRequest] = []
    for record in reader:
        summary.kinds[record.kind.value] += 1
        if record.prompt_cache is not None:
            summary.prompt_caches.add(record.prompt_cache)
        event = preparer.prepare(record)
        if event is not None:
            batch.append(event)
        if len(batch) >= spec.batch:
            emit(batch)
            batch = []
    emit(batch)
    summary.lines = reader.lines
    return summary


def _slim(event: PreparedRequest, keep_bodies: bool) -> PreparedRequest:
    return event if keep_bodies else event._replace(body=None, response=None)


def _child(spec: SourceSpec, queue: Any) -> None:
    read = [0]  # bytes read since the last batch went out

    def emit(batch: list[PreparedRequest]) -> None:
        queue.put(("events", [_slim(e, spec.keep_bodies) for e in batch], read[0]))
        read[0] = 0

    def progress(n: int) -> None:
        read[0] += n

    try:
        summary = produce(spec, emit, progress, tokenize=False)
    except InfercacheError as exc:
        queue.put(("config_error", exc.message, None))
    except Exception:
        queue.put(("crash", traceback.format_exc(), None))  # the parent raises it
        raise
    else:
        queue.put(("done", summary, None))


class ChildEvents:
    """Batches of events produced by a child process, tokenised here with `tokenizer()`;
    `summary` once exhausted."""

    def __init__(
        self,
        spec: SourceSpec,
        tokenizer: Callable[[], PromptTokenizer],
        *,
        progress: Progress | None,
        max_batches: int = 8,
    ) -> None:
        self._spec = spec
        self._tokenizer = tokenizer
        self._progress = progress
        self._max_batches = max_batches
        self.summary = Summary()

    def __iter__(self) -> Iterator[list[PreparedRequest]]:
        context = multiprocessing.get_context("spawn")
        queue = context.Queue(maxsize=self._max_batches)
        child = context.Process(target=_child, args=(self._spec, queue), daemon=True)
        child.start()
        try:
            while True:
                try:
                    kind, payload, read_bytes = queue.get(timeout=1.0)
                except Empty:
                    if not child.is_alive():
                        raise RuntimeError(
                            f"the log reader process died (exit code {child.exitcode})"
                        ) from None
                    continue
                if kind == "events":
                    if self._progress is not None and read_bytes:
                        self._progress(read_bytes)
                    yield [tokenized(e, self._tokenizer) for e in payload]
                elif kind == "done":
                    self.summary = payload
                    return
                elif kind == "config_error":
                    raise ConfigError(payload)
                else:
                    raise RuntimeError(f"the log reader process failed:\n{payload}")
        finally:
            child.join(timeout=10)
            if child.is_alive():
                child.terminate()
                child.join()
