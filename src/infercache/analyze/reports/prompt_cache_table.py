"""The provider prompt cache section (provider_prompt_cache.py) as the text and HTML reports
show it: a table per upstream, its total, then a row per model where its models are priced
differently; a negative net shown as a loss, with the gateway's alarm line under the table."""

from __future__ import annotations

from typing import NamedTuple

from infercache.analyze.provider_prompt_cache import PromptCacheRow, ProviderPromptCacheFigures
from infercache.analyze.rules import pct

TITLE = "Provider prompt cache of {upstream} (as it reported it)"
HEADER = ("model", "calls", "prompt tokens", "read", "written", "read share", "reads saved",
          "write premium", "net")  # fmt: skip


class UpstreamTable(NamedTuple):
    """One upstream's table: its title, rows (all its models, then each where priced
    differently) and its alarm line when its net is negative."""

    title: str
    rows: list[list[str]]
    alarm: str | None


def net_cell(net_usd: float) -> str:
    """The net money, a negative one as a loss."""
    return f"${net_usd:,.4f}" if net_usd >= 0 else f"-${-net_usd:,.4f} (loss)"


def _cells(name: str, row: PromptCacheRow) -> list[str]:
    return [
        name,
        f"{row.requests:,}",
        f"{row.input_tokens:,}",
        f"{row.read_tokens:,}",
        f"{row.write_tokens:,}",
        pct(row.read_rate),
        f"${row.saved_usd:,.4f}",
        f"${row.write_premium_usd:,.4f}",
        net_cell(row.net_usd),
    ]


def tables(section: ProviderPromptCacheFigures) -> list[UpstreamTable]:
    out = []
    for upstream, figures in section.upstreams.items():
        total = figures.total
        rows = [_cells("all models", total)]
        rows += [_cells(f"  {model or '(none)'}", row) for model, row in figures.models.items()]
        alarm = None if total.alarm is None else f"{upstream}: {total.alarm}"
        out.append(UpstreamTable(TITLE.format(upstream=upstream), rows, alarm))
    return out


def unpriced_note(section: ProviderPromptCacheFigures) -> str | None:
    if not section.unpriced_models:
        return None
    return (
        f"no cached-input or cache-write price for {', '.join(section.unpriced_models)} "
        "(--price MODEL=IN,OUT,CACHED[,WRITE] or [prices] in --config): its money is 0"
    )
