"""One generation at a time: prefix lookup, prefill, the decode loop, caching the result.

`Runner.start(prompt, namespace)` opens a `Generation`: it leases the longest cached prefix
(when a prefix cache is configured), prefills only the rest, and exposes the next-token logits.
`Generation.advance(token)` feeds one token. Closing it caches the prompt *and* every generated
token that went through the model, so the next turn of a conversation reuses the whole previous
turn; a generation that failed half-way only gives its lease back (its KV may be incomplete).

`Runner.generate(request)` drives that loop: sample, stop on an end-of-sequence token
(`stop`), a stop string (`stop`, trimmed), `max_tokens` (`length`) or cancellation, streaming
text deltas that never split a character or emit part of a stop string.

One workspace per runner, so one generation at a time: the engine's single worker thread owns
the runner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal

import torch

from infercache.clock import Clock
from infercache.engine.accounting import RequestStats
from infercache.engine.model import LlamaModel
from infercache.engine.prefix_cache import Lease, PrefixCache, Release
from infercache.engine.sampling import Sampler, SamplingParams
from infercache.engine.stop import StopMatcher
from infercache.engine.tokenizer import ChatTokenizer

FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    namespace: str = ""
    queue_s: float = 0.0


@dataclass(frozen=True, slots=True)
class GenerationResult:
    text: str
    token_ids: tuple[int, ...]  # every sampled token, the end-of-sequence token included
    finish_reason: FinishReason
    stats: RequestStats


class Generation:
    """A sequence in the runner's workspace. Use as a context manager."""

    def __init__(self, runner: Runner, prompt: Sequence[int], namespace: str) -> None:
        if not prompt:
            raise ValueError("an empty prompt has nothing to condition on")
        self._runner = runner
        self._lease: Lease | None = None
        self._failed = False
        self.release: Release | None = None
        self.store_s = 0.0
        clock, cache, workspace = runner.clock, runner.prefix_cache, runner.workspace
        started = clock.monotonic_s()
        if cache is not None:
            self._lease = cache.acquire(namespace, prompt, workspace)
        self.reused_tokens = self._lease.reused_tokens if self._lease else 0
        looked_up = clock.monotonic_s()
        self.tokens = list(prompt)
        try:
            self.logits = runner.model.forward(
                torch.tensor(self.tokens[self.reused_tokens :]), workspace, self.reused_tokens
            )
        except BaseException:
            self._abandon()
            raise
        self.started_s = started
        self.lookup_s = looked_up - started
        self.prefill_s = clock.monotonic_s() - looked_up

    def advance(self, token: int) -> torch.Tensor:
        """Feed `token`; return the logits of the token after it."""
        try:
            self.logits = self._runner.model.forward(
                torch.tensor([token]), self._runner.workspace, len(self.tokens)
            )
        except BaseException:
            self._failed = True
            raise
        self.tokens.append(token)
        return self.logits

    def close(self) -> None:
        if self._runner.active is self:
            self._runner.active = None
        if self._lease is None:
            return
        cache = self._runner.prefix_cache
        assert cache is not None
        lease, self._lease = self._lease, None
        if self._failed:
            cache.abandon(lease)
        else:
            started = self._runner.clock.monotonic_s()
            self.release = cache.release(lease, self.tokens, self._runner.workspace)
            self.store_s = self._runner.clock.monotonic_s() - started

    def _abandon(self) -> None:
        self._failed = True
        self.close()

    def __enter__(self) -> Generation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None:
            self._failed = True
        self.close()


class Runner:
    def __init__(
        self,
        model: LlamaModel,
        tokenizer: ChatTokenizer,
        *,
        prefix_cache: PrefixCache | None,
        clock: Clock,
        max_context_tokens: int,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.prefix_cache = prefix_cache
        self.clock = clock
        self.max_context_tokens = max_context_tokens
        self.workspace = model.new_workspace(max_context_tokens)
        self.active: Generation | None = None

    def start(self, prompt: Sequence[int], namespace: str = "") -> Generation:
        """Open a generation; close it (or use it as a context manager) before the next."""
        if self.active is not None:
            raise RuntimeError("the runner's workspace is in use by another generation")
        self.active = Generation(self, prompt, namespace)
        return self.active

    def generate(
        self,
        request: GenerationRequest,
        *,
        on_text: Callable[[str], None] | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> GenerationResult:
        out = _Output(self.tokenizer, request.sampling.stop, on_text)
        with self.start(request.prompt_ids, request.namespace) as gen:
            decoded = self._decode(gen, request.sampling, out, cancelled)
        finish = out.close(decoded.finish)
        done_s = self.clock.monotonic_s()
        release = gen.release
        stats = RequestStats(
            prompt_tokens=len(request.prompt_ids),
            cached_tokens=gen.reused_tokens,
            completion_tokens=len(decoded.tokens),
            queue_s=request.queue_s,
            lookup_s=gen.lookup_s,
            prefill_s=gen.prefill_s,
            decode_s=done_s - (gen.started_s + gen.lookup_s + gen.prefill_s) - gen.store_s,
            store_s=gen.store_s,
            ttft_s=(decoded.first_token_s or done_s) - gen.started_s,
            evicted_nodes=release.evicted_nodes if release else 0,
            evicted_tokens=release.evicted_tokens if release else 0,
        )
        return GenerationResult(out.text, tuple(decoded.tokens), finish, stats)

    def _decode(
        self,
        gen: Generation,
        sampling: SamplingParams,
        out: _Output,
        cancelled: Callable[[], bool] | None,
    ) -> _Decoded:
        """Sample until a finish condition. The last sampled token is never fed back: nothing
        would use its logits."""
        sampler = Sampler(sampling)
        decoded = _Decoded()
        while True:
            if cancelled is not None and cancelled():
                decoded.finish = "cancelled"
                return decoded
            token = sampler(gen.logits)
            decoded.tokens.append(token)
            decoded.first_token_s = decoded.first_token_s or self.clock.monotonic_s()
            if token in self.tokenizer.eos_token_ids or out.add(token):
                decoded.finish = "stop"
                return decoded
            if len(decoded.tokens) >= sampling.max_tokens:
                return decoded
            if len(gen.tokens) + 1 > self.max_context_tokens:  # no room to feed it
                return decoded
            gen.advance(token)


@dataclass(slots=True)
class _Decoded:
    tokens: list[int] = field(default_factory=list)
    finish: FinishReason = "length"
    first_token_s: float | None = None


class _Output:
    """Generated tokens → text deltas: detokenized, stop strings held back and trimmed."""

    def __init__(
        self, tokenizer: ChatTokenizer, stops: Sequence[str], on_text: Callable[[str], None] | None
    ) -> None:
        self._detok = tokenizer.detokenizer()
        self._stop = StopMatcher(stops)
        self._on_text = on_text
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
            if self._on_text is not None:
                self._on_text(text)
