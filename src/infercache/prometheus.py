"""The Prometheus exposition of `Metrics`: names, units and labels, following the conventions.

Conventions: base units in names (`_seconds`, `_bytes`, `_tokens_total`), every counter ends in
`_total`, and no ratio gauges: a hit rate is `rate(hits) / rate(lookups)` in PromQL, while the
JSON `/stats` keeps its friendly ratios, computed from the same counters. Every family has one
`strategy` label (exact, semantic, prefix, embeddings, passthrough):

    infercache_lookups_total                     lookups (each one a hit or a miss)
    infercache_hits_total
    infercache_misses_total{reason}              metrics.MissReason
    infercache_lookup_prompt_tokens_total        prompt tokens of the requests looked up and
                                                 answered (the token hit rate's denominator)
    infercache_saved_prompt_tokens_total         not sent upstream, or not recomputed
    infercache_saved_completion_tokens_total     not generated upstream
    infercache_saved_upstream_seconds_total      upstream time the hits did not spend
    infercache_saved_usd_total                   at the configured prices
    infercache_lookup_seconds_total              time spent deciding (keys, store, embedding)

A strategy's own events (`StrategyMetrics.count`, `gauge`, `observe`) are exported under the
names in `COUNTERS`, `GAUGES` and `HISTOGRAMS` below; an event not listed there is exported as
`infercache_<event>` (`_s` read as `_seconds`), so a new counter needs no change here to be
seen, and a line here to get a better name. The prefix counters are named as vLLM's are
(`prefix_cache_queries_total`, `prefix_cache_hits_total`, in prompt tokens), whether the
built-in engine counts them or the gateway reads them off an HTTP upstream's usage. A strategy
gauge whose name ends in `_rate` is a ratio: it stays in the JSON and is not exported.

The passthrough strategy counts its calls per API resource (a bounded set, gateway/app.py):
`infercache_passthrough_requests_total{resource}`.

Families from other parts (the gateway's per-request traffic with `model` and `tenant` labels,
the store's size) join through `Metrics.export(collector)`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

# snapshot key → (family name without `_total`, help)
CORE_COUNTERS: dict[str, tuple[str, str]] = {
    "lookups": ("infercache_lookups", "Cache lookups, each one a hit or a miss"),
    "hits": ("infercache_hits", "Lookups that served an answer (or part of one) from the cache"),
    "prompt_tokens_seen": (
        "infercache_lookup_prompt_tokens",
        "Prompt tokens of the requests looked up and answered (the token hit rate's denominator)",
    ),
    "prompt_tokens_saved": (
        "infercache_saved_prompt_tokens",
        "Prompt tokens not sent upstream or not recomputed",
    ),
    "completion_tokens_saved": (
        "infercache_saved_completion_tokens",
        "Completion tokens not generated upstream",
    ),
    "upstream_s_saved": (
        "infercache_saved_upstream_seconds",
        "Upstream seconds the hits did not spend",
    ),
    "money_saved_usd": ("infercache_saved_usd", "Money saved in USD at the configured prices"),
    "lookup_overhead_s": ("infercache_lookup_seconds", "Seconds spent on cache lookups"),
}

# `StrategyMetrics.count(event)` → (family name without `_total`, help)
COUNTERS: dict[str, tuple[str, str]] = {
    "prefix_cache_queries": (
        "infercache_prefix_cache_queries",
        "Prompt tokens looked up in the prefix cache (as vLLM's prefix_cache_queries)",
    ),
    "prefix_cache_hits": (
        "infercache_prefix_cache_hits",
        "Prompt tokens found in the prefix cache (as vLLM's prefix_cache_hits)",
    ),
    "prefix_cache_writes": (
        "infercache_prefix_cache_writes",
        "Prompt tokens a provider wrote to its prompt cache (billed at its write price)",
    ),
    "prompt_cache_write_premium_usd": (
        "infercache_spent_usd",
        "Money a strategy cost in USD at the configured prices (a provider prompt cache's write "
        "premium): the net saving is saved_usd - spent_usd",
    ),
    "prompt_tokens": ("infercache_engine_prompt_tokens", "Prompt tokens the engine processed"),
    "generation_tokens": ("infercache_engine_generation_tokens", "Tokens the engine generated"),
    "evictions": ("infercache_prefix_cache_evictions", "Radix nodes evicted from the KV cache"),
    "evicted_tokens": ("infercache_prefix_cache_evicted_tokens", "KV tokens evicted"),
    "coalesced": (
        "infercache_coalesced_requests",
        "Requests answered by an identical request already in flight",
    ),
    "stored": ("infercache_stored_entries", "Entries written to the store"),
    "not_stored": ("infercache_not_stored_entries", "Answers not stored (incomplete or refused)"),
    "store_errors": ("infercache_store_errors", "Store calls that failed (each one a miss)"),
    "store_unavailable": (
        "infercache_store_unavailable",
        "Store calls skipped or over their latency budget",
    ),
    "complaints": (
        "infercache_complaints",
        "Answers reported wrong (POST /v1/feedback), by the layer that served them",
    ),
    "complaints_on_fetched": (
        "infercache_complaints_on_fetched",
        "Answers reported wrong that were fetched upstream, not served from a cache",
    ),
    "model_version_changes": (
        "infercache_model_version_changes",
        "Model versions made current (each retires the older entries)",
    ),
    "invalidated_tags": ("infercache_invalidated_tags", "Tags invalidated"),
}

# `StrategyMetrics.gauge(name)` → (family name, help)
GAUGES: dict[str, tuple[str, str]] = {
    "kv_bytes": ("infercache_prefix_cache_bytes", "Bytes of KV held by the prefix cache"),
    "kv_tokens": ("infercache_prefix_cache_tokens", "Tokens of KV held by the prefix cache"),
    "queue_length": ("infercache_engine_requests_waiting", "Requests waiting for the engine"),
    "running_sequences": ("infercache_engine_requests_running", "Requests the engine is running"),
    "running_kv_tokens": (
        "infercache_engine_running_kv_tokens",
        "KV tokens reserved by running requests",
    ),
    "vectors": ("infercache_semantic_vectors", "Vectors in the semantic index (its entries)"),
    "threshold": (
        "infercache_semantic_threshold",
        "Similarity threshold served at, on the matcher's scale",
    ),
}

# `StrategyMetrics.observe(name)` → (family name, help)
HISTOGRAMS: dict[str, tuple[str, str]] = {
    "ttft_s": (
        "infercache_engine_time_to_first_token_seconds",
        "Time to first token in the engine, queueing included",
    ),
    "time_per_output_token_s": (
        "infercache_engine_time_per_output_token_seconds",
        "Decode seconds per output token after the first",
    ),
    "batch_size": ("infercache_engine_batch_size", "Sequences in each engine step"),
    "nn_similarity": (
        "infercache_semantic_nearest_similarity",
        "Similarity of the nearest neighbour found by each semantic lookup (matcher's scale)",
    ),
}

# strategy → (family name without `_total`, label, help): every counter of the strategy is one
# series of this family, labelled by the counter's name.
LABELLED_COUNTERS: dict[str, tuple[str, str, str]] = {
    "passthrough": (
        "infercache_passthrough_requests",
        "resource",
        "Calls passed through to the upstream, never cached, by API resource",
    ),
}


def fallback_name(event: str) -> str:
    """The family name of an event not listed: `infercache_<event>`, `_s` read as `_seconds`."""
    name = event.removesuffix("_s") + "_seconds" if event.endswith("_s") else event
    return f"infercache_{name}"


def families(strategies: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
    """Prometheus families from `Metrics.snapshot()["strategies"]`."""
    for key, (name, doc) in CORE_COUNTERS.items():
        fam = CounterMetricFamily(name, doc, labels=["strategy"])
        for strategy, s in strategies.items():
            fam.add_metric([strategy], float(s[key]))
        yield fam
    misses = CounterMetricFamily(
        "infercache_misses", "Cache misses by reason", labels=["strategy", "reason"]
    )
    for strategy, s in strategies.items():
        for reason, n in s["misses"].items():
            misses.add_metric([strategy, reason], float(n))
    yield misses
    yield from _counters(strategies)
    yield from _gauges(strategies)
    yield from _histograms(strategies)


def _counters(strategies: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
    out: dict[str, CounterMetricFamily] = {}
    for strategy, s in strategies.items():
        labelled = LABELLED_COUNTERS.get(strategy)
        for event, value in s["counters"].items():
            if labelled is not None:
                name, label, doc = labelled
                fam = out.get(name)
                if fam is None:
                    fam = out[name] = CounterMetricFamily(name, doc, labels=["strategy", label])
                fam.add_metric([strategy, event], float(value))
                continue
            name, doc = COUNTERS.get(event) or (fallback_name(event), f"Events: {event}")
            fam = out.get(name)
            if fam is None:
                fam = out[name] = CounterMetricFamily(name, doc, labels=["strategy"])
            fam.add_metric([strategy], float(value))
    yield from out.values()


def _gauges(strategies: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
    out: dict[str, GaugeMetricFamily] = {}
    for strategy, s in strategies.items():
        for gauge, value in s["gauges"].items():
            if gauge.endswith("_rate"):  # a ratio: JSON only
                continue
            name, doc = GAUGES.get(gauge) or (fallback_name(gauge), f"Gauge: {gauge}")
            fam = out.get(name)
            if fam is None:
                fam = out[name] = GaugeMetricFamily(name, doc, labels=["strategy"])
            fam.add_metric([strategy], float(value))
    yield from out.values()


def _histograms(strategies: Mapping[str, Mapping[str, Any]]) -> Iterator[Metric]:
    out: dict[str, HistogramMetricFamily] = {}
    for strategy, s in strategies.items():
        for hist, h in s["histograms"].items():
            name, doc = HISTOGRAMS.get(hist) or (fallback_name(hist), f"Histogram: {hist}")
            fam = out.get(name)
            if fam is None:
                fam = out[name] = HistogramMetricFamily(name, doc, labels=["strategy"])
            buckets = cumulative_buckets(h["bounds"], h["counts"])
            # Buckets under 0 (similarities) fold into le="0": with a negative bucket the
            # client leaves out `_sum` and `_count`, which Prometheus' rules want.
            buckets = [(le, n) for le, n in buckets if float(le) >= 0]
            fam.add_metric([strategy], buckets, h["sum"])
    yield from out.values()


def cumulative_buckets(bounds: list[float], counts: list[int]) -> list[tuple[str, float]]:
    """Per-bucket counts (the last one above every bound) as Prometheus' cumulative `le`s."""
    out, running = [], 0
    for bound, count in zip([*bounds, float("inf")], counts, strict=True):
        running += count
        out.append((floatToGoString(bound), float(running)))  # type: ignore[no-untyped-call]
    return out
