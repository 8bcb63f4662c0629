"""The model runner: carries out the scheduler's steps on one loaded model.

One `step()`:

    drop cancelled sequences      a waiting one fails, a running one finishes `cancelled`
    admit (scheduler.py)          a KV workspace per sequence; the longest cached prefix
                                  leased and copied in (prefix_cache.py); `sink.started()`
    plan (scheduler.py)           every decode, then prompt chunks, within the token budget
    one batched forward           model.forward_batch: the plan's segments, each attending to
                                  its own workspace; logits of every decode and of every
                                  prompt's last chunk
    sample, per sequence          its own sampler, stop strings, text deltas to its sink
    finish                        stop: end-of-sequence token (unless `ignore_eos`) or stop
                                  string; length:
                                  `max_tokens` or the context; the prompt and generated tokens
                                  cached below the leased node, the lease released, the
                                  workspace dropped
    settle                        the step's metrics recorded, then every sequence that ended
                                  told (`sink.finished` / `sink.failed`): a caller woken by its
                                  answer already sees the step in the metrics

A failure inside a step (a torch error, say) fails only that step's sequences, with an
`InfercacheError` (their leases abandoned: their KV may be incomplete), and is logged with its
traceback; the runner carries on with the others.

`generate(request)` runs one request alone, to the end (for callers without a worker thread:
tests, benches). Not thread-safe except `submit`: one owner (the engine's worker) steps it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass, field
from typing import TypeVar

import torch

from infercache.clock import Clock
from infercache.engine.accounting import EngineAccounting
from infercache.engine.config import BatchLimits
from infercache.engine.model import LlamaModel, Segment
from infercache.engine.prefix_cache import PrefixCache
from infercache.engine.scheduler import Scheduler, StepPlan, WaitingQueue
from infercache.engine.sequence import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    NullSink,
    Sequence,
    SequenceSink,
    TextOutput,
)
from infercache.engine.tokenizer import ChatTokenizer
from infercache.errors import InfercacheError

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class StepReport:
    """What one step did. `sampled` are the sequences that got a token this step, in the row
    order of `logits` (`[len(sampled), vocab]`)."""

    sequences: int
    decode_tokens: int
    prefill_tokens: int
    duration_s: float
    sampled: tuple[Sequence, ...]
    logits: torch.Tensor | None


@dataclass(eq=False, repr=False, slots=True)
class Runner:
    model: LlamaModel
    tokenizer: ChatTokenizer
    _: KW_ONLY
    prefix_cache: PrefixCache | None
    clock: Clock
    max_context_tokens: int
    limits: InitVar[BatchLimits | None] = None
    waiting: InitVar[WaitingQueue | None] = None
    accounting: EngineAccounting | None = None
    model_id: str = ""
    scheduler: Scheduler = field(init=False)
    # sink calls held until the step is recorded
    _ended: list[Callable[[], None]] = field(init=False, default_factory=list)

    def __post_init__(self, limits: BatchLimits | None, waiting: WaitingQueue | None) -> None:
        limits = limits if limits is not None else BatchLimits()
        queue = waiting if waiting is not None else WaitingQueue()
        self.scheduler = Scheduler(limits, queue)

    # -- from any thread ------------------------------------------------------------------

    def submit(
        self,
        request: GenerationRequest,
        sink: SequenceSink | None = None,
        *,
        cancel: threading.Event | None = None,
    ) -> Sequence:
        """Queue a request; raises `OverloadedError` when the queue is full."""
        if len(request.prompt_ids) >= self.max_context_tokens:
            raise ValueError(
                f"a {len(request.prompt_ids)}-token prompt leaves no room in a "
                f"{self.max_context_tokens}-token context"
            )
        seq = Sequence(
            request,
            sink if sink is not None else NullSink(),
            arrived_s=self.clock.monotonic_s(),
            cancel=cancel,
        )
        self.scheduler.enqueue(seq)
        return seq

    # -- on the owner's thread ------------------------------------------------------------

    @property
    def running(self) -> list[Sequence]:
        return self.scheduler.running

    def has_work(self) -> bool:
        return bool(self.scheduler.running) or (
            self.scheduler.admitting and len(self.scheduler.waiting) > 0
        )

    def step(self) -> StepReport:
        started = self.clock.monotonic_s()
        self._drop_cancelled()
        while (seq := self.scheduler.next_admissible()) is not None:
            self._admit(seq)
        plan = self.scheduler.plan()
        if not plan.sequences:
            self._settle()
            return StepReport(0, 0, 0, self.clock.monotonic_s() - started, (), None)
        try:
            sampled, logits = self._forward(plan)
        except Exception as e:
            logger.exception("engine step failed for %d sequences", plan.sequences)
            error = InfercacheError(f"the engine failed: {type(e).__name__}: {e}")
            for seq in [*plan.decode, *(s for s, _ in plan.prefill)]:
                self._fail(seq, error)
            sampled, logits = (), None
        for row, seq in enumerate(sampled):
            assert logits is not None
            try:
                self._sample(seq, logits[row])
            except Exception as e:
                logger.exception("sampling or finishing a sequence failed")
                self._fail(seq, InfercacheError(f"the engine failed: {type(e).__name__}: {e}"))
        report = StepReport(
            sequences=plan.sequences,
            decode_tokens=len(plan.decode),
            prefill_tokens=plan.tokens - len(plan.decode),
            duration_s=self.clock.monotonic_s() - started,
            sampled=sampled,
            logits=logits,
        )
        if self.accounting is not None:
            self.accounting.record_step(report, len(self.scheduler.waiting), self.running)
        self._settle()
        return report

    def abort(self, error: InfercacheError) -> None:
        """Fail every running sequence with `error` (a swap that does not wait, a shutdown)."""
        for seq in list(self.scheduler.running):
            self._fail(seq, error)
        if self.accounting is not None:
            self.accounting.record_queue(len(self.scheduler.waiting), self.running)
        self._settle()

    def generate(
        self,
        request: GenerationRequest,
        *,
        on_text: Callable[[str], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> GenerationResult:
        """Run one request to its end on the calling thread (the owner's), stepping whatever
        else is queued along with it."""
        sink = _CallbackSink(on_text)
        seq = self.submit(request, sink)
        while sink.result is None and sink.error is None:
            if cancelled is not None and cancelled():
                seq.cancel.set()
            self.step()
        if sink.error is not None:
            raise sink.error
        assert sink.result is not None
        return sink.result

    # -- the step's parts -----------------------------------------------------------------

    def _drop_cancelled(self) -> None:
        for seq in self.scheduler.waiting.take_cancelled():
            self._end(seq.sink.failed, InfercacheError("the request was cancelled before it ran"))
        for seq in [s for s in self.scheduler.running if s.cancel.is_set()]:
            self._finish(seq, "cancelled")

    def _admit(self, seq: Sequence) -> None:
        seq.admitted_s = self.clock.monotonic_s()
        size = min(seq.reserved_tokens, self.max_context_tokens)
        try:
            seq.workspace = self.model.new_workspace(size)
            if self.prefix_cache is not None:
                prompt = seq.request.prompt_ids
                lease = self.prefix_cache.acquire(seq.request.namespace, prompt, seq.workspace)
                seq.lease, seq.tier_load = lease, lease.tiers
                seq.lease_evicted = (lease.evicted_nodes, lease.evicted_tokens)
                seq.reused_tokens = seq.computed = lease.reused_tokens
        except Exception as e:
            logger.exception("admission failed")
            seq.workspace = None
            error = InfercacheError(f"the engine failed: {type(e).__name__}: {e}")
            self._end(seq.sink.failed, error)
            return
        seq.lookup_s = self.clock.monotonic_s() - seq.admitted_s
        seq.output = TextOutput(self.tokenizer, seq.request.sampling.stop, seq.sink)
        self.scheduler.add_running(seq)
        seq.sink.started()

    def _forward(self, plan: StepPlan) -> tuple[tuple[Sequence, ...], torch.Tensor]:
        segments: list[Segment] = []
        sampled: list[Sequence] = []
        for seq in plan.decode:
            assert seq.workspace is not None
            assert seq.pending is not None
            segments.append(Segment(torch.tensor([seq.pending]), seq.workspace, seq.computed))
            sampled.append(seq)
        for seq, n in plan.prefill:
            assert seq.workspace is not None
            ends_prompt = seq.computed + n == seq.prompt_len
            ids = torch.tensor(seq.tokens[seq.computed : seq.computed + n])
            segments.append(Segment(ids, seq.workspace, seq.computed, wants_logits=ends_prompt))
            if ends_prompt:
                sampled.append(seq)
        logits = self.model.forward_batch(segments)
        now = self.clock.monotonic_s()
        for seq in plan.decode:
            assert seq.pending is not None
            seq.tokens.append(seq.pending)
            seq.pending = None
            seq.computed += 1
        for seq, n in plan.prefill:
            seq.computed += n
            if not seq.prefilling:
                seq.prefilled_s = now
        return tuple(sampled), logits

    def _sample(self, seq: Sequence, logits: torch.Tensor) -> None:
        assert seq.output is not None
        token = seq.sampler(logits)
        seq.generated.append(token)
        if seq.first_token_s is None:
            seq.first_token_s = self.clock.monotonic_s()
        full = len(seq.tokens) + 1 > self.max_context_tokens  # no room to feed it
        eos = token in self.tokenizer.eos_token_ids and not seq.request.sampling.ignore_eos
        if eos or seq.output.add(token):
            self._finish(seq, "stop")
        elif len(seq.generated) >= seq.request.sampling.max_tokens or full:
            self._finish(seq, "length")
        else:
            seq.pending = token

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        assert seq.output is not None
        finish = seq.output.close(reason)
        if seq.lease is not None and self.prefix_cache is not None:
            assert seq.workspace is not None
            started = self.clock.monotonic_s()
            lease, seq.lease = seq.lease, None
            seq.release = self.prefix_cache.release(
                lease, seq.tokens[: seq.computed], seq.workspace
            )
            seq.store_s = self.clock.monotonic_s() - started
        self._leave(seq)
        stats = seq.stats(self.clock.monotonic_s())
        result = GenerationResult(seq.output.text, tuple(seq.generated), finish, stats)
        if self.accounting is not None:
            cache = self.prefix_cache.stats() if self.prefix_cache is not None else None
            self.accounting.record(self.model_id, result.stats, cache)
        self._end(seq.sink.finished, result)

    def _fail(self, seq: Sequence, error: InfercacheError) -> None:
        if seq.lease is not None and self.prefix_cache is not None:
            lease, seq.lease = seq.lease, None
            self.prefix_cache.abandon(lease)
        self._leave(seq)
        self._end(seq.sink.failed, error)

    def _end(self, tell: Callable[[_T], None], outcome: _T) -> None:
        self._ended.append(lambda: tell(outcome))

    def _settle(self) -> None:
        ended, self._ended = self._ended, []
        for tell in ended:
            tell()

    def _leave(self, seq: Sequence) -> None:
        """Out of the running set, its workspace's memory given back at once."""
        if seq in self.scheduler.running:
            self.scheduler.remove_running(seq)
        seq.workspace = None


class _CallbackSink(NullSink):
    def __init__(self, on_text: Callable[[str], None] | None) -> None:
        super().__init__()
        self._on_text = on_text

    def text(self, delta: str) -> None:
        if self._on_text is not None:
            self._on_text(delta)
