"""The `prefix` strategy for HTTP upstreams, counted from what they report.

An upstream with its own prefix cache (vLLM, SGLang, a provider, our engine over HTTP) reports
the reused prompt tokens as `usage.prompt_tokens_details.cached_tokens`. Each answer adds its
prompt tokens to the strategy's tokens seen, and a reuse counts as a hit saving those tokens at
the model's input price minus its cached-input price. The tokens also go to the counters named
as vLLM's (`prefix_cache_queries`, `prefix_cache_hits`, in tokens), as the engine counts them.
An HTTP upstream does not say how much time the reuse saved, so no seconds are credited. (The
in-process engine records the strategy itself, with measured times:
`Upstream.records_prefix_metrics`.)
"""

from __future__ import annotations

from typing import Any

from infercache.metrics import MissReason, PriceTable, StrategyMetrics
from infercache.policy import cached_tokens, usage_tokens


class UpstreamPrefixUsage:
    def __init__(self, metrics: StrategyMetrics, prices: PriceTable) -> None:
        self._metrics = metrics
        self._prices = prices

    def count(self, response: dict[str, Any]) -> None:
        prompt_tokens, _ = usage_tokens(response)
        reused = cached_tokens(response)
        self._metrics.prompt_tokens(prompt_tokens)
        self._metrics.count("prefix_cache_queries", prompt_tokens)
        self._metrics.count("prefix_cache_hits", max(reused, 0))
        if reused <= 0:
            self._metrics.miss(MissReason.ABSENT)
            return
        model = str(response.get("model", ""))
        self._metrics.hit(
            prompt_tokens=reused,
            completion_tokens=0,
            upstream_s=0.0,
            money_usd=self._prices.prefix_savings_usd(model, reused),
        )
