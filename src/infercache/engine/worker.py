"""The engine's worker: one thread that owns the loaded model and runs requests on it.

Requests run one at a time, in arrival order (a single-thread executor). A request prepared
for a model that has since been swapped out is prepared again for the current one (or fails if
the model id changed). A swap runs on the same thread, between two requests, so no request
ever sees half of one model and half of another.

Errors: the `infercache.errors` classes pass through; anything else failing here is logged
with its traceback and becomes an `InfercacheError` (HTTP 500), never a raw torch exception.
Thread-safe: `submit`, `swap` and `close` may be called from any thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import torch

from infercache.clock import Clock
from infercache.engine.accounting import PrefixAccounting
from infercache.engine.loader import LoadedModel
from infercache.engine.openai_api import PreparedChat, ResponseMeta
from infercache.engine.runner import GenerationResult
from infercache.engine.streams import Emit
from infercache.errors import InfercacheError

logger = logging.getLogger(__name__)

Reprepare = Callable[[PreparedChat, LoadedModel], PreparedChat]


@dataclass(frozen=True, slots=True)
class Outcome:
    meta: ResponseMeta
    result: GenerationResult


class Worker:
    def __init__(
        self,
        loaded: LoadedModel,
        *,
        threads: int,
        clock: Clock,
        accounting: PrefixAccounting,
        reprepare: Reprepare,
    ) -> None:
        self.loaded = loaded
        self._clock = clock
        self._accounting = accounting
        self._reprepare = reprepare
        self._lock = threading.Lock()
        self._in_flight = 0
        self._closing = threading.Event()
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="infercache-engine",
            initializer=torch.set_num_threads,
            initargs=(threads,),
        )
        accounting.record_cache(loaded.cache_stats())

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def submit(
        self, prepared: PreparedChat, emit: Emit | None, cancel: threading.Event
    ) -> Future[Outcome]:
        if self._closing.is_set():
            raise InfercacheError("the engine is shut down")
        with self._lock:
            self._in_flight += 1
        queued_s = self._clock.monotonic_s()
        future = self._executor.submit(self._run, prepared, emit, cancel, queued_s)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future: Future[Outcome]) -> None:
        with self._lock:
            self._in_flight -= 1

    def _run(
        self,
        prepared: PreparedChat,
        emit: Emit | None,
        cancel: threading.Event,
        queued_s: float,
    ) -> Outcome:
        send = emit if emit is not None else (lambda _event: None)
        try:
            if cancel.is_set():
                raise InfercacheError("the request was cancelled before it ran")
            loaded = self.loaded
            if prepared.version != loaded.version:
                prepared = self._reprepare(prepared, loaded)
            send(prepared.meta)
            request = replace(prepared.request, queue_s=self._clock.monotonic_s() - queued_s)
            result = loaded.runner.generate(
                request,
                on_text=send,
                cancelled=lambda: cancel.is_set() or self._closing.is_set(),
            )
            self._accounting.record(loaded.model_id, result.stats, loaded.cache_stats())
        except InfercacheError as e:
            send(e)
            raise
        except Exception as e:
            logger.exception("engine failure on request %s", prepared.meta.id)
            error = InfercacheError(f"the engine failed: {type(e).__name__}: {e}")
            send(error)
            raise error from e
        send(result)
        return Outcome(prepared.meta, result)

    def swap(self, load: Callable[[], LoadedModel]) -> None:
        """Replace the model between two requests (requests queued before run on the old one)."""
        if self._closing.is_set():
            raise InfercacheError("the engine is shut down")
        self._executor.submit(self._swap, load).result()

    def _swap(self, load: Callable[[], LoadedModel]) -> None:
        self.loaded = load()
        self._accounting.record_cache(self.loaded.cache_stats())

    def close(self) -> None:
        """Cancel running and queued requests and stop the thread. Idempotent."""
        self._closing.set()
        self._executor.shutdown(wait=True, cancel_futures=True)
