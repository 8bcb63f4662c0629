"""The terminal summary of a report (document.py `Report`): rich tables, plain when not a
terminal. Shares, seconds, milliseconds and dollars are shown as rules.py formats them, the
same format the reasons quote them in, so a figure reads the same in a table and in a reason."""

from __future__ import annotations

from collections.abc import Mapping
from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infercache.analyze.recommend import Recommendation
from infercache.analyze.replay_figures import (
    LayeredFigures,
    SimulationFigures,
    Strategy,
    StrategyFigures,
    Unavailable,
)
from infercache.analyze.report_tree import (
    BreakerRow,
    Figures,
    GroupFigures,
    NearDuplicatesUnmeasured,
)
from infercache.analyze.reports import prompt_cache_table
from infercache.analyze.reports.document import Report
from infercache.analyze.rules import dollars, duration, milliseconds, seconds
from infercache.analyze.rules import pct as _pct

CLASS_NAMES = {
    "exact_repeat": "exact repeat",
    "near_duplicate": "near-duplicate",
    "shared_prefix": "shared prefix",
    "unique": "unique",
}


def pct(value: float | None) -> str:
    return "—" if value is None else _pct(value)


def seconds_span(value: float | None) -> str:
    return "—" if value is None else duration(value)


def header_lines(f: Figures) -> list[str]:
    """What the report is about: files, span, tokenizer, calibration (text and HTML)."""
    inputs, settings = f.inputs, f.settings
    budget = settings.capacity.prefix_tokens
    return [
        f"{f.requests:,} requests from {', '.join(inputs.files)} over "
        f"{seconds_span(inputs.span_s)}; {inputs.malformed.count} malformed line(s)",
        f"tokenizer: {settings.tokenizer or 'none needed'}",
        f"near-duplicate calibration: {settings.calibration}",
        "KV budget: "
        + (
            "unbounded (the sweep shows smaller budgets)"
            if budget is None
            else f"{budget:,} tokens"
        ),
    ]


def near_duplicate_cell(f: Figures) -> tuple[str, str]:
    """(count cell, share cell) of the near-duplicate row."""
    near = f.near_duplicates
    if isinstance(near, NearDuplicatesUnmeasured):
        return "not measured", "—"
    share = pct(near.share)
    if near.interval:
        low, high = near.interval
        share = f"{share} [{pct(low)}, {pct(high)}]"
    if near.estimated:
        count = f"~{near.share * f.requests:,.0f} (sample of {near.checked:,})"
        return count, share
    return f"{f.census_counts.near_duplicate:,.0f}", share


def class_count_cell(f: Figures, name: str) -> str:
    """The count cell of a census class (estimated from the sample when it was sampled)."""
    if f.census_estimated and name in ("shared_prefix", "unique"):
        return f"~{f.census.of_class(name) * f.requests:,.0f}"
    return f"{f.census_counts.of_class(name):,.0f}"


def replay_rows(sim: SimulationFigures) -> list[tuple[str, Strategy | LayeredFigures]]:
    """The replay table's rows: each strategy, then the layered total."""
    rows: list[tuple[str, Strategy | LayeredFigures]] = [
        (name, sim.of_strategy(name)) for name in ("exact", "semantic", "prefix")
    ]
    return [*rows, ("layered", sim.layered)]


def saved_cells(name: str, row: StrategyFigures | LayeredFigures) -> list[str]:
    """Hit rate (of prompt tokens, for prefix reuse), then what the row saved: prompt and
    completion token shares, upstream time, money."""
    hit = row.token_hit_rate if isinstance(row, StrategyFigures) and name == "prefix" else None
    return [
        pct(hit if name == "prefix" else row.hit_rate),
        pct(row.prompt_token_share),
        pct(row.completion_token_share),
        f"{seconds(row.upstream_s_saved)} ({pct(row.upstream_share)})",
        dollars(row.money_saved_usd),
    ]


def render_text(report: Report, out: IO[str], *, color: bool | None = None) -> None:
    console = Console(
        file=out,
        force_terminal=color,
        no_color=color is False,
        width=None if out.isatty() else 120,
        highlight=False,
    )
    f = report.figures
    lines = header_lines(f)
    console.print(f"[bold]infercache analyze[/bold]: {escape(lines[0])}")
    for line in lines[1:]:
        console.print(f"  {escape(line)}")
    _census(console, f)
    _groups(console, f.breakdown.tenant, "tenant", f.tenant_names)
    _groups(console, f.breakdown.model, "model", {})
    _simulation(console, f)
    _kv(console, f)
    _windows(console, f)
    _breakers(console, f.prefix_breakers, f.tenant_names)
    _prompt_cache(console, f)
    _recommendation(console, report.recommendation)
    for note in f.notes:
        console.print(f"[dim]note: {escape(note)}[/dim]")


def _census(console: Console, f: Figures) -> None:
    table = Table(title="Census", title_justify="left")
    table.add_column("class")
    table.add_column("requests", justify="right")
    table.add_column("share", justify="right")
    table.add_column("within TTL", justify="right")
    within = f.reuse_distance_s.within_ttl
    for key, name in CLASS_NAMES.items():
        if key == "near_duplicate":
            count, share = near_duplicate_cell(f)
        else:
            count, share = class_count_cell(f, key), pct(f.census.of_class(key))
        table.add_row(name, count, share, pct(within.get(key)))
    console.print(table)
    nc, mean = f.not_cacheable, f.shared_prefix.mean_tokens
    console.print(
        f"prefix token share: [bold]{pct(f.prefix_token_share)}[/bold] of "
        f"{f.prompt_tokens:,} prompt tokens reusable by an unbounded prefix cache"
        + (f"; shared-prefix requests share {mean:,.0f} tokens on average" if mean else "")
        + f"; not cacheable: {pct(nc.share)}"
        + (f" ({', '.join(f'{k}: {v}' for k, v in nc.reasons.items())})" if nc.count else "")
    )
    near = f.near_duplicates
    if not isinstance(near, NearDuplicatesUnmeasured) and near.label:
        console.print(f"[yellow]near-duplicates: {escape(near.label)}[/yellow]")


def _groups(
    console: Console, groups: Mapping[str, GroupFigures], kind: str, names: Mapping[str, str]
) -> None:
    if len(groups) < 2:
        return
    table = Table(title=f"By {kind} (largest 10)", title_justify="left")
    for column in (kind, "requests", "exact", "near-dup", "prefix", "unique", "prefix tokens"):
        table.add_column(column, justify="left" if column == kind else "right")
    ranked = sorted(groups.items(), key=lambda item: -item[1].requests)[:10]
    for name, g in ranked:
        c = g.census
        table.add_row(
            names.get(name, name) or "(none)",
            f"{g.requests:,}",
            pct(c.exact_repeat),
            pct(c.near_duplicate),
            pct(c.shared_prefix),
            pct(c.unique),
            pct(g.prefix_token_share),
        )
    console.print(table)


def _simulation(console: Console, f: Figures) -> None:
    sim = f.simulation
    if sim is None:
        return
    s = f.settings
    budget = s.capacity.prefix_tokens
    table = Table(
        title=(
            f"Replay (TTL {seconds_span(s.ttl_s)}, exact store "
            f"{s.capacity.exact_bytes:,} B, KV "
            f"{'unbounded' if budget is None else f'{budget:,} tokens'}); saved:"
        ),
        title_justify="left",
        caption="prefix hit rate: share of prompt tokens reaching the engine that were reused",
        caption_justify="left",
    )
    for column in ("strategy", "hit rate", "prompt tok", "completion tok", "upstream time",
                   "money", "age p50/p90"):  # fmt: skip
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for name, row in replay_rows(sim):
        if isinstance(row, Unavailable):
            table.add_row(name, "not available", "—", "—", "—", "—", "—")
            continue
        age = row.age_s if isinstance(row, StrategyFigures) else None
        table.add_row(
            name,
            *saved_cells(name, row),
            f"{seconds_span(age.p50_s_at_most)}/{seconds_span(age.p90_s_at_most)}" if age else "—",
        )
    console.print(table)
    if isinstance(sim.prefix, StrategyFigures) and sim.prefix.ttft_saved_ms_mean is not None:
        ttft = milliseconds(sim.prefix.ttft_saved_ms_mean)
        console.print(
            f"prefix reuse: {ttft} off the mean time to first token of a request reaching the "
            "engine"
        )


def _kv(console: Console, f: Figures) -> None:
    sweep = f.kv_sweep
    if sweep is None or not sweep.curve or sweep.knee is None:
        return
    knee = sweep.knee
    console.print(
        f"KV sweep: the knee is at {knee.budget_tokens:,} tokens ({pct(knee.token_share)} "
        f"of prompt tokens reused; {pct(sweep.unbounded_token_share)} unbounded, working set "
        f"{sweep.working_set_tokens:,} tokens)"
    )
    at_knee = [p for p in sweep.with_disk if p.ram_tokens == knee.budget_tokens]
    if at_knee and sweep.disk_tokens:
        console.print(
            f"  over a disk tier of {sweep.disk_tokens:,} tokens: {pct(at_knee[0].token_share)} "
            f"reused at that RAM budget, {pct(at_knee[0].disk_share)} of prompt tokens from disk"
        )


def _windows(console: Console, f: Figures) -> None:
    windows = f.windows
    if not windows:
        return
    table = Table(title=f"By {windows.by}", title_justify="left")
    for column in ("from (UTC)", "requests", "exact", "near-dup", "prefix", "prefix tokens",
                   "exact hit", "prefix token hit"):  # fmt: skip
        table.add_column(column, justify="left" if column.startswith("from") else "right")
    for row in windows.rows:
        c = row.census
        table.add_row(
            row.start,
            f"{row.requests:,}",
            pct(c.exact_repeat),
            pct(c.near_duplicate),
            pct(c.shared_prefix),
            pct(row.prefix_token_share),
            pct(row.exact_hit_rate),
            pct(row.prefix_token_hit_rate),
        )
    console.print(table)


def _breakers(console: Console, breakers: tuple[BreakerRow, ...], names: Mapping[str, str]) -> None:
    if not breakers:
        return
    console.print("[bold]Prefix breakers[/bold]")
    for b in breakers[:5]:
        tenant = names.get(b.tenant, b.tenant) or "-"
        console.print(
            f"  {b.kind} in the {b.role} message ({tenant} / {b.model}): ",
            markup=False,
            end="",
        )
        console.print(
            f"the shared part breaks at character {b.break_char} (token ~{b.break_tokens}); "
            f"{b.tail_tokens} tokens after it are identical; moving it to the end would "
            f"reuse {b.tokens_lost:,} more tokens ({pct(b.token_share_lost)} of all)"
        )
        console.print(f"    {b.context}", markup=False, style="dim")


def _prompt_cache(console: Console, f: Figures) -> None:
    section = f.provider_prompt_cache
    if section is None:
        return
    for found in prompt_cache_table.tables(section):
        table = Table(title=found.title, title_justify="left")
        for column in prompt_cache_table.HEADER:
            table.add_column(column, justify="left" if column == "model" else "right")
        for row in found.rows:
            table.add_row(*row)
        console.print(table)
        if found.alarm is not None:
            console.print(f"  alarm: {found.alarm}", markup=False, style="red")
    note = prompt_cache_table.unpriced_note(section)
    if note is not None:
        console.print(f"  note: {note}", markup=False, style="dim")


def _recommendation(console: Console, rec: Recommendation) -> None:
    console.print(f"[bold]Recommendation: {rec.layering}[/bold]")
    for r in rec.reasons:
        mark = "[green]on [/green]" if r.enable else "[red]off[/red]"
        console.print(f"  {mark} {r.strategy}: {escape(r.text)}")
    for line in rec.advice:
        console.print(f"  advice: {escape(line)}")
    for alarm in rec.alarms:
        console.print(f"  alarm: {escape(alarm.meaning)}")
