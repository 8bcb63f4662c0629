"""One request's generation in the batch: its tokens, its KV, its text, its timings.

A `Sequence` moves through three states, driven by the runner (runner.py):

    waiting ──admit──▶ running ──finish──▶ finished
                       prefilling: `computed < len(prompt)`, a chunk of the prompt per step
                       decoding:   one token per step (`pending`, sampled, is fed next step)

- At admission it gets its own KV workspace (`reserved_tokens` = prompt + `max_tokens`
  positions) and, with a prefix cache, a lease on the longest cached prefix, whose KV is
  copied to the front of the workspace (`computed` starts there).
- `tokens` are the prompt and every generated token that went through the model, so the KV
  cached at the end covers the whole conversation turn. The last sampled token is never fed:
  nothing would use its logits.
- The consumer hears about it through its `SequenceSink`: `started` at admission, `text`
  deltas that never split a character or show part of a stop string, then exactly one of
  `finished` or `failed`.
- `cancel` (a `threading.Event`, set from any thread) is read by the runner between steps.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Literal, Protocol

from infercache.engine.accounting import RequestStats
from infercache.engine.kv import KVWorkspace
from infercache.engine.kv_tiers import TierLoad
from infercache.engine.prefix_cache import Lease, Release
from infercache.engine.sampling import Sampler, SamplingParams
from infercache.engine.stop import StopMatcher
from infercache.engine.tokenizer import ChatTokenizer
from infercache.errors import InfercacheError

FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    namespace: str = ""


@dataclass(frozen=True, slots=True)
class GenerationResult:
    text: str
    token_ids: tuple[int, ...]  # every sampled token, the end-of-sequence token included
    finish_reason: FinishReason
    stats: RequestStats


class SequenceSink(Protocol):
    """Where a sequence's progress goes. Called on the engine's worker thread; `finished` or
    `failed` is called exactly once, last."""

    def started(self) -> None: ...

    def text(self, delta: str) -> None: ...

    def finished(self, result: GenerationResult) -> None: ...

    def failed(self, error: InfercacheError) -> None: ...


class NullSink:
    """A sink that keeps only the outcome (for callers that just want the result)."""

    def __init__(self) -> None:
        self.result: GenerationResult | None = None
        self.error: InfercacheError | None = None

    def started(self) -> None:
        return None

    def text(self, delta: str) -> None:
        return None

    def finished(self, result: GenerationResult) -> None:
        self.result = result

    def failed(self, error: InfercacheError) -> None:
        self.error = error


class Sequence:
    def __init__(
        self,
        request: GenerationRequest,
        sink: SequenceSink,
        *,
        arrived_s: float,
        cancel: threading.Event | None = None,
    ) -> None:
        if not request.prompt_ids:
            raise ValueError("an empty prompt has nothing to condition on")
        self.request = request
        self.sink = sink
        self.cancel = cancel if cancel is not None else threading.Event()
        self.arrived_s = arrived_s
        self.tokens = list(request.prompt_ids)
        self.computed = 0
        self.pending: int | None = None
        self.generated: list[int] = []
        self.workspace: KVWorkspace | None = None
        self.lease: Lease | None = None
        self.release: Release | None = None
        self.output: TextOutput | None = None
        self.sampler = Sampler(request.sampling)
        self.reused_tokens = 0
        self.tier_load: TierLoad | None = None  # what the KV tiers added at admission
        self.lease_evicted = (0, 0)  # (nodes, tokens) evicted to cache what the tiers loaded
        self.admitted_s: float | None = None
        self.lookup_s = 0.0
        self.prefilled_s: float | None = None
        self.first_token_s: float | None = None
        self.store_s = 0.0

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def reserved_tokens(self) -> int:
        """Workspace positions: the prompt, and every generated token but the last."""
        return self.prompt_len + self.request.sampling.max_tokens - 1

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_len

    def stats(self, done_s: float) -> RequestStats:
        admitted = self.admitted_s if self.admitted_s is not None else done_s
        prefilled = self.prefilled_s if self.prefilled_s is not None else done_s
        first = self.first_token_s if self.first_token_s is not None else done_s
        release = self.release
        tiers = self.tier_load if self.tier_load is not None else TierLoad(self.reused_tokens)
        evicted = self.lease_evicted
        return RequestStats(
            prompt_tokens=self.prompt_len,
            cached_tokens=self.reused_tokens,
            completion_tokens=len(self.generated),
            queue_s=admitted - self.arrived_s,
            lookup_s=self.lookup_s,
            prefill_s=prefilled - admitted - self.lookup_s,
            decode_s=max(0.0, done_s - first - self.store_s),
            ttft_s=first - admitted,
            store_s=self.store_s,
            evicted_nodes=(release.evicted_nodes if release else 0) + evicted[0],
            evicted_tokens=(release.evicted_tokens if release else 0) + evicted[1],
            disk_tokens=tiers.disk_tokens,
            shared_tokens=tiers.shared_tokens,
            disk_load_s=tiers.disk_s,
            shared_load_s=tiers.shared_s,
        )


class TextOutput:
    """Generated tokens → text deltas: detokenized, stop strings held back and trimmed."""

    def __init__(self, tokenizer: ChatTokenizer, stops: Seq[str], sink: SequenceSink) -> None:
        self._detok = tokenizer.detokenizer()
        self._stop = StopMatcher(stops)
        self._sink = sink
        self._pieces: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def add(self, token: int) -> bool:
        """Emit the text `token` completes; True when a stop string was reached."""
        self._emit(self._stop.feed(self._detok.add(token)))
        return self._stop.stopped

    def close(self, finish: FinishReason) -> FinishReason:
        """Flush held-back text (which may still complete a stop string)."""
        if not self._stop.stopped:
            self._emit(self._stop.feed(self._detok.flush()))
            self._emit(self._stop.flush())
        return "stop" if self._stop.stopped else finish

    def _emit(self, text: str) -> None:
        if text:
            self._pieces.append(text)
            self._sink.text(text)
