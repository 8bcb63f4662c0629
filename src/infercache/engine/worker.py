"""The engine's worker: one thread that owns the loaded model and steps the runner.

    callers (any thread)                       the worker thread
    submit ─▶ WaitingQueue (bounded: 429) ─▶  loop: wait for work ─▶ swap if asked ─▶ runner.step()
    swap   ─▶ a pending swap ───────────────▶  admission paused; the running batch drains
                                               (or is aborted); load; re-prepare the waiting
    close  ─▶ closing ──────────────────────▶  fail running and waiting, stop

Each request is one `Sequence` whose sink (`_Submission`) forwards its events to the caller's
`emit` callback and settles its future exactly once. A swap replaces model, tokenizer and
prefix cache at once, between two steps, with nothing running: no request ever sees half of
one model and half of another, and no KV survives it. By default it waits for the running
batch to finish (`abort_running=True` fails those requests instead, with a clear error); the
requests still waiting are then prepared again for the new model (or fail if its id changed).

Errors: the runner turns failures inside a step into `InfercacheError`s for the sequences
concerned; anything that still escapes a step is logged and fails the running batch, and the
worker carries on. Thread-safe: `submit`, `swap`, `close` and the read-only properties may be
called from any thread, and `wait_idle` blocks until there is nothing left to do.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import KW_ONLY, InitVar, dataclass, field

import torch

from infercache.clock import Clock
from infercache.engine.accounting import EngineAccounting
from infercache.engine.config import EngineConfig
from infercache.engine.loader import LoadedModel
from infercache.engine.openai_api import PreparedChat
from infercache.engine.responses import ResponseMeta
from infercache.engine.runner import Runner
from infercache.engine.scheduler import WaitingQueue
from infercache.engine.sequence import GenerationResult, Sequence
from infercache.engine.streams import Emit
from infercache.errors import InfercacheError

logger = logging.getLogger(__name__)

Reprepare = Callable[[PreparedChat, LoadedModel], PreparedChat]
SHUT_DOWN = "the engine is shut down"


@dataclass(frozen=True, slots=True)
class Outcome:
    meta: ResponseMeta
    result: GenerationResult


class _Submission:
    """One request's sink: events to `emit`, the outcome to `future`, settled exactly once."""

    def __init__(self, prepared: PreparedChat, emit: Emit | None) -> None:
        self.prepared = prepared
        self._emit = emit
        self.future: Future[Outcome] = Future()
        self.future.set_running_or_notify_cancel()  # settled only by us, never cancelled

    def started(self) -> None:
        self._send(self.prepared.meta)

    def text(self, delta: str) -> None:
        self._send(delta)

    def finished(self, result: GenerationResult) -> None:
        if not self.future.done():
            self._send(result)
            self.future.set_result(Outcome(self.prepared.meta, result))

    def failed(self, error: InfercacheError) -> None:
        if not self.future.done():
            self._send(error)
            self.future.set_exception(error)

    def _send(self, event: ResponseMeta | str | GenerationResult | InfercacheError) -> None:
        if self._emit is not None:
            self._emit(event)


@dataclass(slots=True)
class _Swap:
    load: Callable[[], LoadedModel]
    abort_running: bool
    done: Future[None] = field(default_factory=Future)


@dataclass(eq=False, repr=False, slots=True)
class Worker:
    """`Worker(load, ...)` starts the thread, which loads the model (`load()`) before it
    steps; the constructor returns once it is loaded and raises what `load` raised."""

    load: InitVar[Callable[[], LoadedModel]]
    _: KW_ONLY
    config: EngineConfig
    threads: int
    clock: Clock
    accounting: EngineAccounting
    reprepare: Reprepare
    _waiting: WaitingQueue = field(init=False, default_factory=WaitingQueue)
    _cond: threading.Condition = field(init=False, default_factory=threading.Condition)
    _swaps: list[_Swap] = field(init=False, default_factory=list)
    _closing: bool = field(init=False, default=False)
    _idle: bool = field(init=False, default=True)  # nothing queued, running or swapping
    loaded: LoadedModel = field(init=False)  # both set by the thread before it steps
    _runner: Runner = field(init=False)
    _thread: threading.Thread = field(init=False)

    def __post_init__(self, load: Callable[[], LoadedModel]) -> None:
        started: Future[None] = Future()
        self._thread = threading.Thread(
            target=self._run, args=(load, started), name="infercache-engine", daemon=True
        )
        self._thread.start()
        started.result()  # raises what `load` raised
        self.accounting.record_cache(self.loaded.cache_stats())

    # -- any thread -----------------------------------------------------------------------

    @property
    def queue_length(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._runner.running)

    def submit(
        self, prepared: PreparedChat, emit: Emit | None, cancel: threading.Event
    ) -> Future[Outcome]:
        """Queue a prepared request. Raises `OverloadedError` when the queue is full."""
        with self._cond:
            if self._closing:
                raise InfercacheError(SHUT_DOWN)
            if prepared.version != self.loaded.version:  # prepared just before a swap
                prepared = self.reprepare(prepared, self.loaded)
            sink = _Submission(prepared, emit)
            self._runner.submit(prepared.request, sink, cancel=cancel)
            self._idle = False
            self._cond.notify_all()
        return sink.future

    def swap(self, load: Callable[[], LoadedModel], *, abort_running: bool = False) -> None:
        """Serve the model `load()` returns, once the running batch has drained (or been
        failed, with `abort_running`). Blocks until done; raises what `load` raises."""
        swap = _Swap(load, abort_running)
        with self._cond:
            if self._closing:
                raise InfercacheError(SHUT_DOWN)
            self._swaps.append(swap)
            self._idle = False
            self._cond.notify_all()
        swap.done.result()

    def close(self) -> None:
        """Fail running and queued requests and stop the thread. Idempotent."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until nothing is queued, running or swapping; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._idle, timeout_s)

    # -- the worker thread ----------------------------------------------------------------

    def _run(self, load: Callable[[], LoadedModel], started: Future[None]) -> None:
        """The thread's body. Every torch op of the engine runs on this one thread, the load
        included: a thread that runs torch's parallel kernels keeps its own team of OpenMP
        threads, and once the process holds more of those than it has cores, libgomp stops
        spin-waiting between kernels and sleeps instead (throttled spin). A model loaded on
        the caller's thread left that thread's team behind and cost the decode loop a third
        of its speed (bench/README.md, "Batching (engine)")."""
        torch.set_num_threads(self.threads)
        try:
            self.loaded = load()
            self._runner = self._runner_for(self.loaded)
        except Exception as e:  # raised to the constructor's caller
            logger.exception("loading the model failed")
            started.set_exception(e)
            return
        started.set_result(None)
        self._loop()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._closing or self._swaps or self._runner.has_work()):
                    self._idle = True
                    self._cond.notify_all()
                    self._cond.wait()
                if self._closing:
                    break
                swap = self._swaps[0] if self._swaps else None
            if swap is not None:
                self._advance_swap(swap)
            if self._runner.has_work():
                self._step()
        self._shut_down()

    def _step(self) -> None:
        try:
            self._runner.step()
        except Exception as e:
            logger.exception("engine step failed")
            self._runner.abort(InfercacheError(f"the engine failed: {type(e).__name__}: {e}"))

    def _advance_swap(self, swap: _Swap) -> None:
        runner = self._runner
        runner.scheduler.admitting = False
        if swap.abort_running:
            runner.abort(InfercacheError("the model was swapped while this request ran; retry it"))
        if runner.running:
            return  # let the batch drain first
        with self._cond:
            self._swaps.pop(0)
        try:
            self._swap_to(swap.load())
        except Exception as e:  # raised to the caller of `swap`; the old model keeps serving
            logger.exception("model swap failed")
            swap.done.set_exception(e)
        else:
            swap.done.set_result(None)
        finally:
            self._runner.scheduler.admitting = True

    def _swap_to(self, loaded: LoadedModel) -> None:
        with self._cond:  # atomic for `submit`: a request is prepared for the model it meets
            self.loaded = loaded
            self._runner = self._runner_for(loaded)
            self._waiting.rewrite(lambda seq: self._prepare_again(seq, loaded))
        self.accounting.record_cache(loaded.cache_stats())

    def _prepare_again(self, seq: Sequence, loaded: LoadedModel) -> Sequence | None:
        sink = seq.sink
        assert isinstance(sink, _Submission)
        try:
            sink.prepared = self.reprepare(sink.prepared, loaded)
        except InfercacheError as e:
            sink.failed(e)
            return None
        return Sequence(sink.prepared.request, sink, arrived_s=seq.arrived_s, cancel=seq.cancel)

    def _shut_down(self) -> None:
        error = InfercacheError(SHUT_DOWN)
        self._runner.abort(error)
        for seq in self._waiting.take_all():
            seq.sink.failed(error)
        with self._cond:
            swaps, self._swaps = self._swaps, []
            self._idle = True
            self._cond.notify_all()
        for swap in swaps:
            swap.done.set_exception(error)

    def _runner_for(self, loaded: LoadedModel) -> Runner:
        return loaded.runner(self.config, self._waiting, self.accounting, self.clock)
