"""Per-request accounting, and how it feeds the `prefix` strategy of `infercache.metrics`.

Each request counts as one lookup: a hit when any prompt token's KV was reused (it saved
`cached_tokens` prompt tokens), an `absent` miss when none was, a `bypassed` miss when the
prefix cache is off. Every request adds its prompt tokens to the token-hit-rate denominator and
its own cost (tree match + KV gather before prefill, storing the new KV after) to the
strategy's overhead.

Seconds saved are estimated: reused tokens divided by the measured prefill rate, a running
tokens/s over every request that prefilled at least `min_tokens` (shorter prefills are
dominated by fixed costs and would overstate the savings). Before such a request, 0 s.
Strategy-specific: counters `evictions` (nodes) and `evicted_tokens`, gauges `kv_bytes` and
`kv_tokens`, histogram `ttft_s`. Thread-safe (Metrics locks; the rate is only updated by the
worker thread).
"""

from __future__ import annotations

from dataclasses import dataclass

from infercache.engine.radix import RadixStats
from infercache.metrics import Metrics, MissReason

STRATEGY = "prefix"
TTFT_BOUNDS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class RequestStats:
    """`ttft_s` runs from when the worker picked the request up to its first token; `queue_s`
    is the wait before that. `lookup_s` (tree match + KV gather) and `store_s` (caching the
    new KV, evictions included) are what the prefix cache itself costs."""

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


class PrefixAccounting:
    def __init__(self, metrics: Metrics, *, prefix_cache_enabled: bool) -> None:
        self._metrics = metrics
        self._strategy = metrics.strategy(STRATEGY)
        self._enabled = prefix_cache_enabled
        self.prefill_rate = PrefillRate()

    def record(self, model_id: str, stats: RequestStats, cache: RadixStats | None) -> None:
        s = self._strategy
        s.prompt_tokens(stats.prompt_tokens)
        s.overhead(stats.lookup_s + stats.store_s)
        self.prefill_rate.observe(stats.prompt_tokens - stats.cached_tokens, stats.prefill_s)
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
        if stats.evicted_nodes:
            s.count("evictions", stats.evicted_nodes)
            s.count("evicted_tokens", stats.evicted_tokens)
        s.observe("ttft_s", stats.ttft_s, TTFT_BOUNDS_S)
        self.record_cache(cache)

    def record_cache(self, cache: RadixStats | None) -> None:
        self._strategy.gauge("kv_bytes", cache.total_bytes if cache else 0)
        self._strategy.gauge("kv_tokens", cache.total_tokens if cache else 0)
