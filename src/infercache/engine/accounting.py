"""What the engine measures, and how it feeds the `prefix` strategy of `infercache.metrics`.

Per finished request (`record`):
- one prefix-cache lookup: a hit when any prompt token's KV was reused (it saved
  `cached_tokens` prompt tokens), an `absent` miss when none was, a `bypassed` miss when the
  prefix cache is off; its prompt tokens go to the token-hit-rate denominator and its own cost
  (tree match + KV gather before prefill, storing the new KV after) to the strategy's overhead;
- counters in tokens, as vLLM counts them: `prefix_cache_queries` (prompt tokens looked up),
  `prefix_cache_hits` (of those, reused), `prompt_tokens`, `generation_tokens` (a rate of
  these is the engine's tokens per second);
- histograms: `ttft_s` (arrival to first token, queueing included: what a client waits) and
  `time_per_output_token_s` (first token to last, per later token).
Per step (`record_step`): histogram `batch_size` (sequences in the step), gauges
`queue_length`, `running_sequences`, `running_kv_tokens` (positions reserved by running
sequences), and the prefill rate.

With KV tiers below RAM (kv_tiers.py), per tier (`:ram`, `:disk`, `:shared`): counters
`prefix_cache_hits` (tokens reused from that tier) and `saved_prefill_s` (the prefill those
tokens would have cost, less the time loading them took: a tier that loads slower than prefill
shows a negative saving; nothing is counted before the prefill rate is known), histogram
`kv_load_s` (per request that loaded from the tier), gauge `kv_tier_bytes:ram`; and vLLM's
connector counters in tokens: `external_prefix_cache_queries` (prompt tokens RAM did not
have) and `external_prefix_cache_hits` (of those, loaded from a tier). The tiers count their
blocks themselves (loaded, written, corrupt, missing, evicted, bytes).

Seconds saved are estimated: reused tokens divided by the measured prefill rate, a running
tokens/s over every step that prefilled at least `min_tokens` (shorter prefills are dominated by
fixed costs and would overstate the savings). Before such a step, 0 s.
Also: counters `evictions` (nodes) and `evicted_tokens`, gauges `kv_bytes` and `kv_tokens`
(the cached prefixes). Thread-safe (Metrics locks; the rate is only updated by the worker).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from infercache.engine.radix import RadixStats
from infercache.metrics import Metrics, MissReason, StrategyMetrics

STRATEGY = "prefix"
TTFT_BOUNDS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TPOT_BOUNDS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0)
BATCH_BOUNDS = (1, 2, 4, 8, 16, 32, 64)
LOAD_BOUNDS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass(frozen=True, slots=True)
class RequestStats:
    """`queue_s` runs from arrival to admission; `ttft_s` from admission to the first token;
    `lookup_s` (tree match + KV gather) and `store_s` (caching the new KV, evictions included)
    are what the prefix cache itself costs; `prefill_s` and `decode_s` are wall time, shared
    with the other sequences of the same steps."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    queue_s: float
    lookup_s: float
    prefill_s: float
    decode_s: float
    ttft_s: float
    store_s: float = 0.0
    evicted_nodes: int = 0
    evicted_tokens: int = 0
    disk_tokens: int = 0  # of `cached_tokens`, loaded from the disk tier (the rest from RAM,
    shared_tokens: int = 0  # or from the shared tier): kv_tiers.py
    disk_load_s: float = 0.0
    shared_load_s: float = 0.0

    @property
    def ram_tokens(self) -> int:
        return self.cached_tokens - self.disk_tokens - self.shared_tokens


class StepFigures(Protocol):
    """What `record_step` reads from a runner's step report."""

    @property
    def sequences(self) -> int: ...

    @property
    def prefill_tokens(self) -> int: ...

    @property
    def duration_s(self) -> float: ...


class Reserving(Protocol):
    @property
    def reserved_tokens(self) -> int: ...


class PrefillRate:
    def __init__(self, *, min_tokens: int = 32) -> None:
        self._min_tokens = min_tokens
        self._tokens = 0
        self._seconds = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens >= self._min_tokens and seconds > 0:
            self._tokens += tokens
            self._seconds += seconds

    @property
    def tokens_per_s(self) -> float | None:
        return self._tokens / self._seconds if self._seconds > 0 else None

    def seconds_for(self, tokens: int) -> float:
        rate = self.tokens_per_s
        return tokens / rate if rate else 0.0


class EngineAccounting:
    def __init__(
        self, metrics: Metrics, *, prefix_cache_enabled: bool, kv_tiers: bool = False
    ) -> None:
        self._metrics = metrics
        self._strategy = metrics.strategy(STRATEGY)
        self._enabled = prefix_cache_enabled
        self._tiers = prefix_cache_enabled and kv_tiers
        self.prefill_rate = PrefillRate()

    @property
    def tier_events(self) -> StrategyMetrics:
        """Where the KV tiers count their blocks."""
        return self._strategy

    def record(self, model_id: str, stats: RequestStats, cache: RadixStats | None) -> None:
        s = self._strategy
        s.prompt_tokens(stats.prompt_tokens)
        s.overhead(stats.lookup_s + stats.store_s)
        if not self._enabled:
            s.miss(MissReason.BYPASSED)
        elif stats.cached_tokens > 0:
            s.hit(
                prompt_tokens=stats.cached_tokens,
                completion_tokens=0,
                upstream_s=self.prefill_rate.seconds_for(stats.cached_tokens),
                money_usd=self._metrics.prices.prefix_savings_usd(model_id, stats.cached_tokens),
            )
        else:
            s.miss(MissReason.ABSENT)
        if self._enabled:
            s.count("prefix_cache_queries", stats.prompt_tokens)
            s.count("prefix_cache_hits", stats.cached_tokens)
        if self._tiers:
            self._record_tiers(stats)
        s.count("prompt_tokens", stats.prompt_tokens)
        s.count("generation_tokens", stats.completion_tokens)
        if stats.evicted_nodes:
            s.count("evictions", stats.evicted_nodes)
            s.count("evicted_tokens", stats.evicted_tokens)
        if stats.completion_tokens:
            s.observe("ttft_s", stats.queue_s + stats.ttft_s, TTFT_BOUNDS_S)
        if stats.completion_tokens > 1:
            tpot = stats.decode_s / (stats.completion_tokens - 1)
            s.observe("time_per_output_token_s", tpot, TPOT_BOUNDS_S)
        self.record_cache(cache)

    def _record_tiers(self, stats: RequestStats) -> None:
        s = self._strategy
        tiers = (
            ("ram", stats.ram_tokens, 0.0),
            ("disk", stats.disk_tokens, stats.disk_load_s),
            ("shared", stats.shared_tokens, stats.shared_load_s),
        )
        for tier, tokens, load_s in tiers:
            if tokens:
                s.count(f"prefix_cache_hits:{tier}", tokens)
            if tokens and self.prefill_rate.tokens_per_s is not None:
                s.count(f"saved_prefill_s:{tier}", self.prefill_rate.seconds_for(tokens) - load_s)
            if load_s:
                s.observe(f"kv_load_s:{tier}", load_s, LOAD_BOUNDS_S)
        s.count("external_prefix_cache_queries", stats.prompt_tokens - stats.ram_tokens)
        s.count("external_prefix_cache_hits", stats.disk_tokens + stats.shared_tokens)

    def record_step(self, step: StepFigures, waiting: int, running: Sequence[Reserving]) -> None:
        s = self._strategy
        if step.sequences:
            s.observe("batch_size", step.sequences, BATCH_BOUNDS)
            self.prefill_rate.observe(step.prefill_tokens, step.duration_s)
        self.record_queue(waiting, running)

    def record_queue(self, waiting: int, running: Sequence[Reserving]) -> None:
        s = self._strategy
        s.gauge("queue_length", waiting)
        s.gauge("running_sequences", len(running))
        s.gauge("running_kv_tokens", sum(r.reserved_tokens for r in running))

    def record_cache(self, cache: RadixStats | None) -> None:
        self._strategy.gauge("kv_bytes", cache.total_bytes if cache else 0)
        self._strategy.gauge("kv_tokens", cache.total_tokens if cache else 0)
        if self._tiers:
            self._strategy.gauge("kv_tier_bytes:ram", cache.total_bytes if cache else 0)

    def snapshot(self) -> dict[str, Any]:
        snap: dict[str, Any] = self._strategy.snapshot()
        return snap
