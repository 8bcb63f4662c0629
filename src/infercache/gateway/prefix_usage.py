"""The `prefix` strategy for HTTP upstreams, counted from what they report: a hosted provider's
own prompt cache (KV reuse as a service) measured, priced, and shown per upstream.

An upstream with its own prefix cache (vLLM, SGLang, OpenAI, Anthropic, our engine over HTTP)
reports, in its answer's usage, the prompt tokens it read from that cache and (Anthropic; some
OpenAI models) the tokens it wrote to it: prompt_cache/usage.py reads every API's shape. Each
answer adds its prompt tokens to the strategy's tokens seen; a read counts as a hit saving
those tokens at the model's input price minus its cached-input price; a write costs the
model's write premium (its cache-write price minus its input price: 1.25x input for
Anthropic's 5-minute cache), counted as `prompt_cache_write_premium_usd`. The tokens also go
to the counters named as vLLM's (`prefix_cache_queries`, `prefix_cache_hits`) and
`prefix_cache_writes`. An HTTP upstream does not say how much time the reuse saved, so no
seconds are credited. (The in-process engine records the strategy itself, with measured
times: `Upstream.records_prefix_metrics`.)

Per upstream (`PromptCacheFigures`, prompt_cache/figures.py: the pricing rule the analyzer
reads a request log's figures with too; in `/stats` under each upstream and in `/metrics` with an
`upstream` label): input, read and written tokens, the read share, what reads saved, what
writes cost, and the net: negative when writes are paid and not read back, which `/stats`
says in an alarm line, as the analyzer's alarms read (analyze/advice.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from infercache.metrics import Metrics, MissReason
from infercache.prompt_cache.figures import PromptCacheFigures
from infercache.prompt_cache.usage import prompt_cache_usage

WRITE_PREMIUM = "prompt_cache_write_premium_usd"  # the prefix strategy's counter of it


class UpstreamPrefixUsage:
    """Counts each upstream answer's prompt-cache usage: the `prefix` strategy, and figures
    per upstream. Thread-safe."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics.strategy("prefix")
        self._prices = metrics.prices
        self._lock = threading.Lock()
        self._upstreams: dict[str, PromptCacheFigures] = {}

    def count(self, upstream: str, response: dict[str, Any]) -> None:
        usage = prompt_cache_usage(response)
        model = str(response.get("model", ""))
        with self._lock:
            figures = self._upstreams.setdefault(upstream, PromptCacheFigures())
            saved, premium = figures.add(usage, model, self._prices)
        metrics = self._metrics
        metrics.prompt_tokens(usage.input_tokens)
        metrics.count("prefix_cache_queries", usage.input_tokens)
        metrics.count("prefix_cache_hits", usage.read_tokens)
        if usage.write_tokens:
            metrics.count("prefix_cache_writes", usage.write_tokens)
            metrics.count(WRITE_PREMIUM, premium)
        if usage.read_tokens:
            metrics.hit(prompt_tokens=usage.read_tokens, completion_tokens=0, upstream_s=0.0,
                        money_usd=saved)  # fmt: skip
        else:
            metrics.miss(MissReason.ABSENT)

    def figures(self, upstream: str) -> PromptCacheFigures | None:
        """A copy of one upstream's figures (None: no answer of it counted yet)."""
        with self._lock:
            found = self._upstreams.get(upstream)
            return None if found is None else PromptCacheFigures(**vars(found))

    def snapshot(self) -> dict[str, PromptCacheFigures]:
        with self._lock:
            return {name: PromptCacheFigures(**vars(f)) for name, f in self._upstreams.items()}


# /metrics, per upstream: (family name without `_total`, help, the figure it exports)
_FAMILIES = (
    ("infercache_prompt_cache_input_tokens", "Prompt tokens an upstream was sent", "input_tokens"),
    ("infercache_prompt_cache_read_tokens", "Prompt tokens an upstream read from its prompt cache",
     "read_tokens"),
    ("infercache_prompt_cache_write_tokens", "Prompt tokens an upstream wrote to its prompt cache",
     "write_tokens"),
    ("infercache_prompt_cache_saved_usd", "USD its prompt-cache reads saved", "saved_usd"),
    ("infercache_prompt_cache_write_premium_usd", "USD its prompt-cache writes cost beyond input",
     "write_premium_usd"),
)  # fmt: skip


class PromptCacheCollector(Collector):
    """The per-upstream figures as Prometheus counters (net = saved - write premium)."""

    def __init__(self, usage: UpstreamPrefixUsage) -> None:
        self._usage = usage

    def collect(self) -> Iterator[Metric]:
        snapshot = self._usage.snapshot()
        for name, doc, figure in _FAMILIES:
            family = CounterMetricFamily(name, doc, labels=["upstream"])
            for upstream, figures in sorted(snapshot.items()):
                family.add_metric([upstream], float(getattr(figures, figure)))
            yield family
