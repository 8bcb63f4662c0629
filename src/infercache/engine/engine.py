"""The built-in inference engine: the object the server and the gateway hold.

Path of a request: OpenAI body → `openai_api.parse_chat_request` (shapes, types) → `_prepare`
(model id, chat template, context length), in the caller's thread so bad input raises before
anything is queued → one worker thread (a single-thread executor: requests run one at a time,
in arrival order) → `Runner.generate` → `PrefixAccounting` → a completion dict, or chunk dicts
streamed through a queue (thread-safe for the sync API, `call_soon_threadsafe` for asyncio).

- Tenants: each tenant (the `tenant` argument, else the body's `user`) gets its own namespace in
  the prefix tree, so one tenant's KV never serves another, and time to first token cannot
  reveal what another tenant sent. Requests without a tenant share one anonymous namespace.
  `share_prefix_across_tenants` puts everyone in one namespace.
- Model swap: `swap_model` runs on the worker between two requests and replaces model,
  tokenizer and prefix cache (empty) at once: no KV survives a swap. A request prepared for the
  previous model is prepared again for the new one (or fails if the model id changed).
- Threads: `torch.set_num_threads(config.threads or the usable cores)`, once, in the worker.
- Errors: bad input raises the `infercache.errors` classes; anything else failing in the worker
  is logged and surfaces as an `InfercacheError` (HTTP 500), never a raw torch exception.
Thread-safe: every public method may be called from any thread or event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from infercache.clock import Clock, SystemClock
from infercache.engine import openai_api
from infercache.engine.accounting import PrefixAccounting
from infercache.engine.config import EngineConfig
from infercache.engine.loader import LoadedModel, load_model
from infercache.engine.openai_api import ChatRequest, ResponseMeta
from infercache.engine.radix import RadixStats
from infercache.engine.runner import GenerationRequest, GenerationResult
from infercache.engine.sampling import SamplingParams
from infercache.engine.tokenizer import ChatTokenizer
from infercache.errors import ContextTooLongError, InfercacheError, ModelNotFoundError
from infercache.metrics import Metrics

logger = logging.getLogger(__name__)

# What the worker sends a streaming consumer: the response metadata first, then text deltas,
# then the result, or an error at any point.
Event = ResponseMeta | str | GenerationResult | InfercacheError


@dataclass(frozen=True, slots=True)
class _Prepared:
    chat: ChatRequest
    tenant: str | None
    version: str
    meta: ResponseMeta
    request: GenerationRequest


@dataclass(frozen=True, slots=True)
class _Outcome:
    meta: ResponseMeta
    result: GenerationResult


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _init_worker(threads: int) -> None:
    torch.set_num_threads(threads)


class Engine:
    """`Engine(config)` loads the model (about a second from the converted cache; ~30 s the
    first time the packaged GGUF is converted) and starts the worker; `close()` (or a `with`
    block) stops it.

    In-process API: `chat(body, tenant)` / `await achat(body, tenant)` return a
    `chat.completion` dict; `chat_stream` / `achat_stream` return `chat.completion.chunk`
    dicts. `model_id`, `model_version` (the `system_fingerprint`), `models()`, `stats()`,
    `swap_model(path)`. Prefix-cache figures go to `metrics` (strategy `prefix`).
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else Metrics()
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._rng = rng if rng is not None else random.Random()
        self._accounting = PrefixAccounting(self.metrics, prefix_cache_enabled=config.prefix_cache)
        self._loaded = load_model(config, config.model_path, config.served_model_id, self._clock)
        self._accounting.record_cache(self._cache_stats(self._loaded))
        self._lock = threading.Lock()
        self._in_flight = 0
        self._closing = threading.Event()
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="infercache-engine",
            initializer=_init_worker,
            initargs=(config.threads or _usable_cores(),),
        )

    # -- identity -------------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        return self._loaded.model_id

    @property
    def model_version(self) -> str:
        """A digest of the weights, config and tokenizer (`system_fingerprint` in responses)."""
        return self._loaded.version

    @property
    def tokenizer(self) -> ChatTokenizer:
        return self._loaded.runner.tokenizer

    def models(self) -> list[dict[str, Any]]:
        """The `data` of `GET /v1/models`."""
        loaded = self._loaded
        return [
            {
                "id": loaded.model_id,
                "object": "model",
                "created": loaded.created,
                "owned_by": "infercache",
                "version": loaded.version,
            }
        ]

    # -- chat API -------------------------------------------------------------------------

    def chat(self, body: Mapping[str, Any], tenant: str | None = None) -> dict[str, Any]:
        """A `chat.completion` for an OpenAI request body (its `stream` flag is ignored: use
        `chat_stream`). `tenant` (else the body's `user`) selects the KV namespace. Raises
        `InvalidRequestError`, `ContextTooLongError`, `ModelNotFoundError` for bad input."""
        prepared = self._prepare(body, tenant)
        outcome = self._submit(prepared, None, threading.Event()).result()
        return openai_api.completion(outcome.meta, outcome.result)

    def chat_stream(
        self, body: Mapping[str, Any], tenant: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """`chat.completion.chunk` dicts. Bad input raises here, before iteration; the request
        is queued on first `next()`; closing the iterator early cancels it."""
        prepared = self._prepare(body, tenant)
        return self._chunks_sync(prepared)

    async def achat(self, body: Mapping[str, Any], tenant: str | None = None) -> dict[str, Any]:
        prepared = self._prepare(body, tenant)
        cancel = threading.Event()
        try:
            outcome = await asyncio.wrap_future(self._submit(prepared, None, cancel))
        except asyncio.CancelledError:
            cancel.set()
            raise
        return openai_api.completion(outcome.meta, outcome.result)

    def achat_stream(
        self, body: Mapping[str, Any], tenant: str | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The asyncio twin of `chat_stream` (raises for bad input at the call)."""
        prepared = self._prepare(body, tenant)
        return self._chunks_async(prepared)

    def _chunks_sync(self, prepared: _Prepared) -> Iterator[dict[str, Any]]:
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        cancel = threading.Event()
        future = self._submit(prepared, events.put, cancel)
        try:
            stream: openai_api.ChunkStream | None = None
            while True:
                event = events.get()
                chunks, stream = self._translate(event, stream, prepared)
                yield from chunks
                if isinstance(event, GenerationResult):
                    return
        finally:
            cancel.set()
            future.cancel()

    async def _chunks_async(self, prepared: _Prepared) -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        cancel = threading.Event()

        def put(event: Event) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                cancel.set()

        future = self._submit(prepared, put, cancel)
        try:
            stream: openai_api.ChunkStream | None = None
            while True:
                event = await events.get()
                chunks, stream = self._translate(event, stream, prepared)
                for chunk in chunks:
                    yield chunk
                if isinstance(event, GenerationResult):
                    return
        finally:
            cancel.set()
            future.cancel()

    @staticmethod
    def _translate(
        event: Event, stream: openai_api.ChunkStream | None, prepared: _Prepared
    ) -> tuple[list[dict[str, Any]], openai_api.ChunkStream | None]:
        if isinstance(event, InfercacheError):
            raise event
        if isinstance(event, ResponseMeta):
            stream = openai_api.ChunkStream(event, include_usage=prepared.chat.include_usage)
            return [stream.role()], stream
        assert stream is not None, "the worker sends the metadata first"
        if isinstance(event, str):
            return [stream.content(event)], stream
        return stream.finish(event), stream

    # -- preparing and running ------------------------------------------------------------

    def _prepare(self, body: Mapping[str, Any], tenant: str | None) -> _Prepared:
        chat = openai_api.parse_chat_request(body)
        return self._prepare_for(chat, tenant or chat.user, self._loaded)

    def _prepare_for(self, chat: ChatRequest, tenant: str | None, loaded: LoadedModel) -> _Prepared:
        if chat.model != loaded.model_id:
            raise ModelNotFoundError(
                f"The model `{chat.model}` does not exist; this engine serves `{loaded.model_id}`",
                param="model",
            )
        prompt = loaded.runner.tokenizer.encode_chat(chat.message_dicts())
        limit = loaded.max_context_tokens
        max_tokens = chat.max_tokens
        if max_tokens is None:
            max_tokens = min(self.config.default_max_tokens, limit - len(prompt))
        if max_tokens < 1 or len(prompt) + max_tokens > limit:
            raise ContextTooLongError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
                f"{max_tokens} in the completion).",
                param="messages",
            )
        seed = chat.seed if chat.seed is not None else self._rng.getrandbits(63)
        sampling = SamplingParams(max_tokens, chat.temperature, chat.top_p, seed, chat.stop)
        meta = ResponseMeta(
            id=f"chatcmpl-{self._rng.getrandbits(96):024x}",
            created=int(self._clock.now_s()),
            model=loaded.model_id,
            system_fingerprint=loaded.version,
        )
        request = GenerationRequest(tuple(prompt), sampling, self._namespace(tenant))
        return _Prepared(chat, tenant, loaded.version, meta, request)

    def _namespace(self, tenant: str | None) -> str:
        if self.config.share_prefix_across_tenants:
            return "shared"
        return f"tenant:{tenant}" if tenant else "anonymous"

    def _submit(
        self, prepared: _Prepared, emit: Callable[[Event], None] | None, cancel: threading.Event
    ) -> Future[_Outcome]:
        if self._closing.is_set():
            raise InfercacheError("the engine is shut down")
        with self._lock:
            self._in_flight += 1
        queued_s = self._clock.monotonic_s()
        future = self._executor.submit(self._run, prepared, emit, cancel, queued_s)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future: Future[_Outcome]) -> None:
        with self._lock:
            self._in_flight -= 1

    def _run(
        self,
        prepared: _Prepared,
        emit: Callable[[Event], None] | None,
        cancel: threading.Event,
        queued_s: float,
    ) -> _Outcome:
        """On the worker thread."""
        send = emit if emit is not None else (lambda _event: None)
        try:
            if cancel.is_set():
                raise InfercacheError("the request was cancelled before it ran")
            loaded = self._loaded
            if prepared.version != loaded.version:
                prepared = self._prepare_for(prepared.chat, prepared.tenant, loaded)
            send(prepared.meta)
            request = replace(prepared.request, queue_s=self._clock.monotonic_s() - queued_s)
            result = loaded.runner.generate(
                request,
                on_text=send,
                cancelled=lambda: cancel.is_set() or self._closing.is_set(),
            )
            self._accounting.record(loaded.model_id, result.stats, self._cache_stats(loaded))
        except InfercacheError as e:
            send(e)
            raise
        except Exception as e:
            logger.exception("engine failure on request %s", prepared.meta.id)
            error = InfercacheError(f"the engine failed: {type(e).__name__}: {e}")
            send(error)
            raise error from e
        send(result)
        return _Outcome(prepared.meta, result)

    # -- model lifecycle ------------------------------------------------------------------

    def swap_model(self, model_path: Path | None, *, served_model_id: str | None = None) -> None:
        """Serve another checkpoint (None: the packaged model). Requests queued before run on
        the old model; every cached KV is dropped."""
        if self._closing.is_set():
            raise InfercacheError("the engine is shut down")
        self._executor.submit(self._swap, model_path, served_model_id).result()

    def _swap(self, model_path: Path | None, served_model_id: str | None) -> None:
        self._loaded = load_model(self.config, model_path, served_model_id, self._clock)
        self._accounting.record_cache(self._cache_stats(self._loaded))

    @staticmethod
    def _cache_stats(loaded: LoadedModel) -> RadixStats | None:
        cache = loaded.runner.prefix_cache
        return cache.stats() if cache is not None else None

    def stats(self) -> dict[str, Any]:
        loaded = self._loaded
        prefix = self.metrics.snapshot()["strategies"].get("prefix", {})
        rate = self._accounting.prefill_rate.tokens_per_s
        return {
            "model": {
                "id": loaded.model_id,
                "version": loaded.version,
                "path": str(loaded.directory),
                "max_context_tokens": loaded.max_context_tokens,
            },
            "config": {
                "prefix_cache": self.config.prefix_cache,
                "share_prefix_across_tenants": self.config.share_prefix_across_tenants,
                "max_kv_bytes": self.config.max_kv_bytes,
                "dtype": self.config.dtype,
            },
            "requests_in_flight": self._in_flight,
            "prefill_tokens_per_s": rate,
            "prefix": prefix,
        }

    def close(self) -> None:
        """Cancel running and queued requests and stop the worker. Idempotent."""
        self._closing.set()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
