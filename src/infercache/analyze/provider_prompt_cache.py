"""The provider's own prompt cache, as a gateway request log recorded it: reads, writes and net
money per upstream, the figures `/stats` shows for the same traffic.

The gateway's request log (gateway/requestlog.py) gives each line whose own call went upstream
`"upstream"` and `"prompt_cache": {model, input_tokens, read_tokens, write_tokens}` (the
answer's usage in one shape, whatever the provider's API). The log reader keeps them as a
`LoggedPromptCache`; `ProviderPromptCaches` sums them per (upstream, model), each priced by the
rule the gateway prices its own with (`PromptCacheFigures.add`, prompt_cache/figures.py, at the
analysis's price table: `--config`'s `[prices]` and `--price`). Every line the reader can parse
counts, whether or not the replay can use its request (a Responses body, say), because the
upstream was called and billed either way. An older log without these fields has no section.

The report's section (`ProviderPromptCacheFigures`, in `Figures.provider_prompt_cache`): per
upstream its tokens sent, read and written, the share read, what reads saved, what writes cost
and the net, with the gateway's alarm line when the net is negative; per model as well where
the upstream's models are priced differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from infercache.analyze.report_json import OMIT_NONE
from infercache.metrics import PriceTable
from infercache.prompt_cache.figures import PromptCacheFigures, alarm_line
from infercache.prompt_cache.usage import PromptCacheUsage


class LoggedPromptCache(NamedTuple):
    """One upstream call's prompt-cache usage, as its log line recorded it."""

    upstream: str
    model: str  # the answer's model: what the usage is priced at
    usage: PromptCacheUsage


@dataclass
class ProviderPromptCaches:
    """The logged usage summed per (upstream, model), priced as it is added (picklable: the
    reader process sends it back in its summary)."""

    prices: PriceTable = field(default_factory=PriceTable)
    by_upstream_model: dict[tuple[str, str], PromptCacheFigures] = field(default_factory=dict)

    def add(self, logged: LoggedPromptCache) -> None:
        key = (logged.upstream, logged.model)
        figures = self.by_upstream_model.setdefault(key, PromptCacheFigures())
        figures.add(logged.usage, logged.model, self.prices)

    def section(self) -> ProviderPromptCacheFigures | None:
        """The report's section, or None when no line recorded an upstream call's usage."""
        return provider_prompt_cache(self)


@dataclass(frozen=True, slots=True)
class PromptCacheRow:
    """One upstream's (or one of its models') prompt cache, priced."""

    requests: int
    input_tokens: int
    read_tokens: int
    write_tokens: int
    read_rate: float  # read / input tokens
    saved_usd: float  # reads at the input price minus the cached-input price
    write_premium_usd: float  # writes at the write price minus the input price
    net_usd: float  # saved - write premium: negative is a loss
    alarm: str | None = field(default=None, metadata=OMIT_NONE)  # when the net is negative

    @classmethod
    def of(cls, figures: PromptCacheFigures) -> PromptCacheRow:
        f, net = figures, figures.net_usd
        counts = (f.requests, f.input_tokens, f.read_tokens, f.write_tokens, f.read_rate)
        money = (f.saved_usd, f.write_premium_usd, net)
        return cls(*counts, *money, alarm_line(f) if net < 0 else None)


@dataclass(frozen=True, slots=True)
class UpstreamPromptCache:
    """One upstream: its total, and per model when its models are priced differently."""

    total: PromptCacheRow
    models: Mapping[str, PromptCacheRow]  # empty when every model has the same prices


@dataclass(frozen=True, slots=True)
class ProviderPromptCacheFigures:
    """The provider prompt cache section: per upstream, and the models without a price for
    it (no cached-input or cache-write price: their money figures are 0)."""

    upstreams: Mapping[str, UpstreamPromptCache]
    unpriced_models: tuple[str, ...]


def provider_prompt_cache(caches: ProviderPromptCaches) -> ProviderPromptCacheFigures | None:
    """The section, or None when no line recorded an upstream call's prompt-cache usage."""
    if not caches.by_upstream_model:
        return None
    prices = caches.prices
    models_of: dict[str, dict[str, PromptCacheFigures]] = {}
    for (upstream, model), figures in sorted(caches.by_upstream_model.items()):
        models_of.setdefault(upstream, {})[model] = figures
    upstreams = {}
    for upstream, models in models_of.items():
        total = PromptCacheFigures()
        for figures in models.values():
            total.merge(figures)
        priced_alike = len({prices.price(m) for m in models}) == 1
        upstreams[upstream] = UpstreamPromptCache(
            PromptCacheRow.of(total),
            {} if priced_alike else {m: PromptCacheRow.of(f) for m, f in models.items()},
        )
    unpriced = sorted(
        {
            model
            for _, model in caches.by_upstream_model
            if prices.price(model).cached_input_usd_per_mtok is None
            and prices.price(model).cache_write_usd_per_mtok is None
        }
    )
    return ProviderPromptCacheFigures(upstreams, tuple(unpriced))
