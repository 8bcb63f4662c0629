"""A provider prompt cache's figures, priced: what the gateway shows per upstream (`/stats`,
`/metrics`: gateway/prefix_usage.py) and the analyzer per upstream of a request log (analyze/
provider_prompt_cache.py), summed by the one rule here.

Each answer adds its usage (usage.py: input, read and written tokens) priced at its model's
prices (`PriceTable`, metrics.py): a read saves the input price minus the cached-input price
(`prefix_savings_usd`); a write costs the write price minus the input price
(`write_premium_usd`: 1.25x input for Anthropic's 5-minute cache). The net is the saving minus
the premium: negative when writes are paid and not read back, which `alarm_line` says in the
words of the analyzer's alarms (analyze/advice.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infercache.metrics import PriceTable
from infercache.prompt_cache.usage import PromptCacheUsage


@dataclass
class PromptCacheFigures:
    """One upstream's prompt cache (or one model's on it), as its answers reported it."""

    requests: int = 0
    input_tokens: int = 0
    read_tokens: int = 0
    write_tokens: int = 0
    saved_usd: float = 0.0  # reads at the input price minus the cached-input price
    write_premium_usd: float = 0.0  # writes at the write price minus the input price

    def add(self, usage: PromptCacheUsage, model: str, prices: PriceTable) -> tuple[float, float]:
        """Count one answer's usage at `model`'s prices; (what its reads saved, what its
        writes cost)."""
        saved = prices.prefix_savings_usd(model, usage.read_tokens)
        premium = prices.write_premium_usd(model, usage.write_tokens)
        self.requests += 1
        self.input_tokens += usage.input_tokens
        self.read_tokens += usage.read_tokens
        self.write_tokens += usage.write_tokens
        self.saved_usd += saved
        self.write_premium_usd += premium
        return saved, premium

    def merge(self, other: PromptCacheFigures) -> None:
        """Add `other`'s figures (already priced) to these."""
        self.requests += other.requests
        self.input_tokens += other.input_tokens
        self.read_tokens += other.read_tokens
        self.write_tokens += other.write_tokens
        self.saved_usd += other.saved_usd
        self.write_premium_usd += other.write_premium_usd

    @property
    def read_rate(self) -> float:
        """Share of the prompt tokens read from the cache."""
        return self.read_tokens / self.input_tokens if self.input_tokens else 0.0

    @property
    def net_usd(self) -> float:
        return self.saved_usd - self.write_premium_usd

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "read_tokens": self.read_tokens,
            "write_tokens": self.write_tokens,
            "read_rate": self.read_rate,
            "saved_usd": self.saved_usd,
            "write_premium_usd": self.write_premium_usd,
            "net_usd": self.net_usd,
        }
        if self.net_usd < 0:
            out["alarm"] = alarm_line(self)
        return out


def alarm_line(figures: PromptCacheFigures) -> str:
    """What a negative net means, in the words of the analyzer's alarms."""
    return (
        f"alert: the provider's prompt cache cost ${-figures.net_usd:.4f} more than it saved "
        f"({figures.write_tokens:,} tokens written at a premium, {figures.read_tokens:,} read "
        "back): its writes are not read back within the cache's lifetime; look for a prefix "
        "breaker (a varying value ahead of the shared prompt), breakpoints the client marks on "
        "prompts asked once (try `--anthropic-breakpoints strip` or `inject`), or traffic "
        "too sparse for the cache's lifetime"
    )
