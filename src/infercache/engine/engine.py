"""The built-in inference engine: the object the server and the gateway hold.

Path of a request:

    OpenAI body
      → openai_api.parse_chat_request   shapes and types            (caller's thread)
        (parse_completion_request: a legacy /v1/completions body, a raw prompt)
      → openai_api.prepare_chat         model id, chat template,    (caller's thread: bad input
                                        context length, namespace    raises before queueing)
      → worker.Worker.submit            the waiting queue (bounded: a full one is a 429)
      → runner.Runner.step              on the worker thread, step after step: admission
        (scheduler.py decides)          with a prefix lease, one batched forward over every
                                        running sequence (decodes + prompt chunks), sampling,
                                        finishing (the KV cached in the radix tree)
      → accounting.EngineAccounting     the `prefix` strategy's metrics, batching figures
      → responses.completion            a `chat.completion` (`text_completion`) dict, or
        streams.sync_chunks/async_chunks  `chat.completion.chunk` (`text_completion`) dicts as
                                          they are generated

- Tenants: each tenant (the `tenant` argument, else the body's `user`) gets its own namespace in
  the prefix tree, so one tenant's KV never serves another, and time to first token cannot
  reveal what another tenant sent. Requests without a tenant share one anonymous namespace.
  `share_prefix_across_tenants` puts everyone in one namespace.
- Model swap: `swap_model` waits for the running batch to finish (or fails it, with
  `abort_running`), then replaces model, tokenizer and prefix cache (empty) at once: no KV
  survives a swap. A request prepared for the previous model is prepared again for the new one
  (or fails if the model id changed).
- Backpressure: at most `max_batch` requests run together and `max_queue` wait; one more is
  refused with `OverloadedError` (HTTP 429 with Retry-After), raised by the call itself.
- Threads: the worker thread sets `torch.set_num_threads(config.threads or the usable cores)`,
  then loads the model: every torch op of the engine runs on that one thread (worker.py says
  why).
Thread-safe: every public method may be called from any thread or event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

from infercache.clock import Clock, SystemClock
from infercache.engine import openai_api, responses, streams
from infercache.engine.accounting import EngineAccounting
from infercache.engine.config import EngineConfig
from infercache.engine.loader import LoadedModel, load_model
from infercache.engine.openai_api import ChatBody, PreparedChat
from infercache.engine.tokenizer import ChatTokenizer
from infercache.engine.worker import Worker
from infercache.metrics import Metrics


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class Engine:
    """`Engine(config)` loads the model and starts the worker; `close()` (or a `with` block)
    stops it.

    In-process API: `chat(body, tenant)` / `await achat(body, tenant)` return a
    `chat.completion` dict; `chat_stream` / `achat_stream` return `chat.completion.chunk`
    dicts. The legacy completions API (a raw prompt, no chat template): `text_completion`,
    `atext_completion`, `text_completion_stream`, `atext_completion_stream`, the same with
    `text_completion` shapes. `model_id`, `model_version` (the `system_fingerprint`),
    `weights` (the weight format), `models()`, `stats()`, `swap_model(path)`. Prefix-cache
    figures go to `metrics` (strategy `prefix`).
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
        self._accounting = EngineAccounting(self.metrics, prefix_cache_enabled=config.prefix_cache)
        self._worker = Worker(
            lambda: load_model(config, config.model_path, config.served_model_id, self._clock),
            config=config,
            threads=config.threads or _usable_cores(),
            clock=self._clock,
            accounting=self._accounting,
            reprepare=lambda prepared, current: self._prepare_for(
                prepared.chat, prepared.tenant, current
            ),
        )

    # -- identity -------------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        return self._worker.loaded.model_id

    @property
    def model_version(self) -> str:
        """A digest of the weights, config and tokenizer with the weight format and activation
        dtype it runs in (weights.py `served_version`; `system_fingerprint` in responses)."""
        return self._worker.loaded.version

    @property
    def weights(self) -> str:
        """The weight format the model runs in (weight_formats.py)."""
        return self._worker.loaded.weights

    @property
    def tokenizer(self) -> ChatTokenizer:
        return self._worker.loaded.tokenizer

    def models(self) -> list[dict[str, Any]]:
        """The `data` of `GET /v1/models`."""
        loaded = self._worker.loaded
        return [
            {
                "id": loaded.model_id,
                "object": "model",
                "created": loaded.created,
                "owned_by": "infercache",
                "version": loaded.version,
                "weights": loaded.weights,
            }
        ]

    # -- chat API -------------------------------------------------------------------------

    def chat(self, body: Mapping[str, Any], tenant: str | None = None) -> dict[str, Any]:
        """A `chat.completion` for an OpenAI request body (its `stream` flag is ignored: use
        `chat_stream`). `tenant` (else the body's `user`) selects the KV namespace. Raises
        `InvalidRequestError`, `ContextTooLongError`, `ModelNotFoundError` for bad input."""
        return self._answer(self._prepare(body, tenant))

    def chat_stream(
        self, body: Mapping[str, Any], tenant: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """`chat.completion.chunk` dicts. Bad input and a full queue raise here, before
        iteration (the request is queued at once); closing the iterator early cancels it."""
        return streams.sync_chunks(self._prepare(body, tenant), self._worker.submit)

    async def achat(self, body: Mapping[str, Any], tenant: str | None = None) -> dict[str, Any]:
        return await self._aanswer(self._prepare(body, tenant))

    def achat_stream(
        self, body: Mapping[str, Any], tenant: str | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """The asyncio twin of `chat_stream` (raises for bad input and a full queue at the
        call, which must be made on the loop that reads the chunks)."""
        return streams.async_chunks(self._prepare(body, tenant), self._worker.submit)

    # -- legacy completions API (a raw prompt) --------------------------------------------

    def text_completion(self, body: Mapping[str, Any], tenant: str | None = None) -> dict[str, Any]:
        """A `text_completion` for a legacy `/v1/completions` body, as `chat` for chat."""
        return self._answer(self._prepare(body, tenant, legacy=True))

    def text_completion_stream(
        self, body: Mapping[str, Any], tenant: str | None = None
    ) -> Iterator[dict[str, Any]]:
        return streams.sync_chunks(self._prepare(body, tenant, legacy=True), self._worker.submit)

    async def atext_completion(
        self, body: Mapping[str, Any], tenant: str | None = None
    ) -> dict[str, Any]:
        return await self._aanswer(self._prepare(body, tenant, legacy=True))

    def atext_completion_stream(
        self, body: Mapping[str, Any], tenant: str | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        prepared = self._prepare(body, tenant, legacy=True)
        return streams.async_chunks(prepared, self._worker.submit)

    # -- shared by both APIs --------------------------------------------------------------

    def _answer(self, prepared: PreparedChat) -> dict[str, Any]:
        outcome = self._worker.submit(prepared, None, threading.Event()).result()
        return responses.completion(outcome.meta, outcome.result)

    async def _aanswer(self, prepared: PreparedChat) -> dict[str, Any]:
        cancel = threading.Event()
        try:
            outcome = await asyncio.wrap_future(self._worker.submit(prepared, None, cancel))
        except asyncio.CancelledError:
            cancel.set()
            raise
        return responses.completion(outcome.meta, outcome.result)

    def _prepare(
        self, body: Mapping[str, Any], tenant: str | None, *, legacy: bool = False
    ) -> PreparedChat:
        parse = openai_api.parse_completion_request if legacy else openai_api.parse_chat_request
        chat = parse(body)
        return self._prepare_for(chat, tenant or chat.user, self._worker.loaded)

    def _prepare_for(self, chat: ChatBody, tenant: str | None, loaded: LoadedModel) -> PreparedChat:
        return openai_api.prepare_chat(
            chat,
            tenant,
            loaded,
            default_max_tokens=self.config.default_max_tokens,
            share_across_tenants=self.config.share_prefix_across_tenants,
            rng=self._rng,
            clock=self._clock,
        )

    # -- model lifecycle ------------------------------------------------------------------

    def swap_model(
        self,
        model_path: Path | None,
        *,
        served_model_id: str | None = None,
        abort_running: bool = False,
    ) -> None:
        """Serve another checkpoint (None: the packaged model), once the running requests have
        finished on the old one (`abort_running`: they fail at once with an error saying why).
        Waiting requests run on the new model; every cached KV is dropped."""
        self._worker.swap(
            lambda: load_model(self.config, model_path, served_model_id, self._clock),
            abort_running=abort_running,
        )

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until no request is queued or running (a cancelled one has left and given its
        memory back); False if `timeout_s` passed first."""
        return self._worker.wait_idle(timeout_s)

    def stats(self) -> dict[str, Any]:
        loaded = self._worker.loaded
        cache = loaded.cache_stats()
        prefix = self.metrics.snapshot()["strategies"].get("prefix", {})
        return {
            "model": {
                "id": loaded.model_id,
                "version": loaded.version,
                "weights": loaded.weights,
                "path": str(loaded.directory),
                "max_context_tokens": loaded.max_context_tokens,
            },
            "config": {
                "prefix_cache": self.config.prefix_cache,
                "share_prefix_across_tenants": self.config.share_prefix_across_tenants,
                "max_kv_bytes": self.config.max_kv_bytes,
                "dtype": self.config.dtype,
                "weights": self.config.weights,
                "max_batch": self.config.max_batch,
                "max_queue": self.config.max_queue,
                "max_step_tokens": self.config.max_step_tokens,
                "max_running_kv_bytes": self.config.max_running_kv_bytes,
            },
            "prefix_cache": None if cache is None else dataclasses.asdict(cache),
            "queue_length": self._worker.queue_length,
            "running_sequences": self._worker.running,
            "requests_in_flight": self._worker.queue_length + self._worker.running,
            "prefill_tokens_per_s": self._accounting.prefill_rate.tokens_per_s,
            "prefix": prefix,
        }

    def close(self) -> None:
        """Fail running and queued requests and stop the worker. Idempotent."""
        self._worker.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
