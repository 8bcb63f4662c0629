"""Per-strategy metrics in one shape, shared by the exact, semantic and prefix layers.

Each strategy counts lookups, hits and misses by reason, and what its hits saved: prompt and
completion tokens, upstream seconds (the latency recorded when the entry was produced) and money
(at the configured price per 1M tokens of the model). It also counts its own lookup overhead in
seconds, so `net_s_saved = upstream_s_saved - lookup_overhead_s` is an honest figure.
Strategy-specific numbers (the prefix layer's evictions and KV bytes, the semantic layer's
similarity histogram) live in `counters`, `gauges` and `histograms` of the same object.

Invariant: `lookups == hits + sum(misses.values())`.
Thread-safety: every method takes the strategy's lock; safe from threads and the event loop.
Export: `Metrics.snapshot()` (a dict, with the friendly ratios `hit_rate` and `token_hit_rate`),
`to_json()`, and `to_prometheus()`: the text format from a private
`prometheus_client.CollectorRegistry` (never the global one), named by prometheus.py after the
conventions (counters, base units, no ratio gauges); other parts add families with `export`.

Token hit rate: `prompt_tokens_saved / prompt_tokens_seen`, at most 1 because every request a
strategy answers adds its prompt tokens to `prompt_tokens_seen` (`prompt_tokens`), hits and
shared answers included, and a hit never saves more than its request's prompt tokens.
"""

from __future__ import annotations

import bisect
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from infercache.prometheus import families


class MissReason(StrEnum):
    ABSENT = "absent"
    EXPIRED = "expired"
    STALE_MODEL_VERSION = "stale_model_version"
    RETIRED_VERSION = "retired_version"  # the version it would be sent to is retired
    VERSION_UNKNOWN = "version_unknown"  # its replica's version is being read again
    INVALIDATED_TAG = "invalidated_tag"
    BYPASSED = "bypassed"
    UNCACHEABLE = "uncacheable"
    STORE_ERROR = "store_error"
    STORE_UNAVAILABLE = "store_unavailable"  # over its latency budget, or skipped while failing
    EMBEDDER_ERROR = "embedder_error"  # the semantic layer could not embed the query
    # semantic layer: a neighbour was found but refused
    BELOW_THRESHOLD = "below_threshold"
    GUARD_REJECTED = "guard_rejected"


@dataclass(frozen=True, slots=True)
class Price:
    """USD per 1M tokens. `cached_input_usd_per_mtok` is what a provider bills for prompt tokens
    served from its prefix cache (None: billed like other input tokens);
    `cache_write_usd_per_mtok` what it bills for prompt tokens written to that cache (None:
    like other input tokens; Anthropic's 5-minute cache bills 1.25x the input price)."""

    input_usd_per_mtok: float = 0.0
    output_usd_per_mtok: float = 0.0
    cached_input_usd_per_mtok: float | None = None
    cache_write_usd_per_mtok: float | None = None


@dataclass(frozen=True, slots=True)
class PriceTable:
    """Prices by model id; `default` applies to models not listed."""

    by_model: Mapping[str, Price] = field(default_factory=dict)
    default: Price = Price()

    def price(self, model: str) -> Price:
        return self.by_model.get(model, self.default)

    def cost_usd(self, model: str, prompt_tokens: int, completion_tokens: int) -> float:
        """What a full upstream call with this usage costs."""
        p = self.price(model)
        return (
            prompt_tokens * p.input_usd_per_mtok + completion_tokens * p.output_usd_per_mtok
        ) / 1e6

    def prefix_savings_usd(self, model: str, reused_tokens: int) -> float:
        """What reusing `reused_tokens` of prompt saves against billing them as fresh input."""
        p = self.price(model)
        cached = (
            p.input_usd_per_mtok
            if p.cached_input_usd_per_mtok is None
            else (p.cached_input_usd_per_mtok)
        )
        return reused_tokens * (p.input_usd_per_mtok - cached) / 1e6

    def write_premium_usd(self, model: str, written_tokens: int) -> float:
        """What writing `written_tokens` to a provider's prompt cache costs beyond plain input."""
        p = self.price(model)
        write = (
            p.input_usd_per_mtok
            if p.cache_write_usd_per_mtok is None
            else p.cache_write_usd_per_mtok
        )
        return written_tokens * (write - p.input_usd_per_mtok) / 1e6


@dataclass
class _Histogram:
    bounds: tuple[float, ...]
    counts: list[int]
    total: float = 0.0
    n: int = 0


class StrategyMetrics:
    """Counters of one strategy (`exact`, `semantic`, `prefix`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._lookups = 0
        self._hits = 0
        self._misses: dict[str, int] = {}
        self._prompt_tokens_seen = 0
        self._prompt_tokens_saved = 0
        self._completion_tokens_saved = 0
        self._upstream_s_saved = 0.0
        self._money_saved_usd = 0.0
        self._lookup_overhead_s = 0.0
        self._counters: dict[str, float] = {}
        self._gauges: dict[str, float] = {}
        self._histograms: dict[str, _Histogram] = {}

    def hit(
        self,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        upstream_s: float,
        money_usd: float,
        seen_prompt_tokens: int = 0,
    ) -> None:
        """A lookup that served (part of) an answer and saved what the arguments say;
        `seen_prompt_tokens` as `prompt_tokens(n)` counts them (one lock for both)."""
        with self._lock:
            self._lookups += 1
            self._hits += 1
            self._prompt_tokens_seen += seen_prompt_tokens
            self._prompt_tokens_saved += prompt_tokens
            self._completion_tokens_saved += completion_tokens
            self._upstream_s_saved += upstream_s
            self._money_saved_usd += money_usd

    def miss(self, reason: MissReason) -> None:
        with self._lock:
            self._lookups += 1
            self._misses[reason.value] = self._misses.get(reason.value, 0) + 1

    def overhead(self, seconds: float) -> None:
        """Time this strategy spent deciding (key derivation, store round trips, embedding)."""
        with self._lock:
            self._lookup_overhead_s += seconds

    def prompt_tokens(self, tokens: int) -> None:
        """Prompt tokens of a request this strategy looked at (the token hit rate's denominator)."""
        with self._lock:
            self._prompt_tokens_seen += tokens

    def count(self, name: str, amount: float = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + amount

    def gauge(self, name: str, value: float) -> None:
        with self._lock:
            self._gauges[name] = value

    def observe(self, name: str, value: float, bounds: Sequence[float]) -> None:
        """Add `value` to histogram `name` whose upper bucket bounds are `bounds` (ascending)."""
        with self._lock:
            h = self._histograms.get(name)
            if h is None:
                h = _Histogram(tuple(bounds), [0] * (len(bounds) + 1))
                self._histograms[name] = h
            h.counts[bisect.bisect_left(h.bounds, value)] += 1
            h.total += value
            h.n += 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            lookups = self._lookups
            seen = self._prompt_tokens_seen
            return {
                "lookups": lookups,
                "hits": self._hits,
                "misses": dict(sorted(self._misses.items())),
                "hit_rate": self._hits / lookups if lookups else 0.0,
                "prompt_tokens_seen": seen,
                "prompt_tokens_saved": self._prompt_tokens_saved,
                "token_hit_rate": self._prompt_tokens_saved / seen if seen else 0.0,
                "completion_tokens_saved": self._completion_tokens_saved,
                "upstream_s_saved": self._upstream_s_saved,
                "money_saved_usd": self._money_saved_usd,
                "lookup_overhead_s": self._lookup_overhead_s,
                "net_s_saved": self._upstream_s_saved - self._lookup_overhead_s,
                "counters": dict(sorted(self._counters.items())),
                "gauges": dict(sorted(self._gauges.items())),
                "histograms": {
                    name: {
                        "bounds": list(h.bounds),
                        "counts": list(h.counts),
                        "sum": h.total,
                        "count": h.n,
                    }
                    for name, h in sorted(self._histograms.items())
                },
            }


class Metrics:
    """All strategies of one process. Strategies are created on first use."""

    def __init__(self, prices: PriceTable | None = None) -> None:
        self.prices = prices if prices is not None else PriceTable()
        self._lock = threading.Lock()
        self._strategies: dict[str, StrategyMetrics] = {}
        self._collectors: list[Collector] = []

    def strategy(self, name: str) -> StrategyMetrics:
        with self._lock:
            s = self._strategies.get(name)
            if s is None:
                s = self._strategies[name] = StrategyMetrics(name)
            return s

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            strategies = list(self._strategies.values())
        return {"strategies": {s.name: s.snapshot() for s in strategies}}

    def to_json(self) -> str:
        return json.dumps(self.snapshot(), sort_keys=True)

    def export(self, collector: Collector) -> None:
        """Add `collector`'s families to `to_prometheus` (the gateway's per-request traffic,
        the store's size): one exposition for the whole process."""
        with self._lock:
            self._collectors.append(collector)

    def to_prometheus(self) -> bytes:
        """The text format (prometheus.py has the names). Collectors may read the store: call
        it off the event loop."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_StrategyCollector(self))
        with self._lock:
            collectors = list(self._collectors)
        for collector in collectors:
            registry.register(collector)
        return generate_latest(registry)


class _StrategyCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        yield from families(self._metrics.snapshot()["strategies"])
