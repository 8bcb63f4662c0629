"""The terminal summary of a report dict (document.py): rich tables, plain when not a terminal.
Shares, seconds, milliseconds and dollars are shown as rules.py formats them, the same format
the reasons quote them in, so a figure reads the same in a table and in a reason."""

from __future__ import annotations

from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

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


def header_lines(report: dict[str, Any]) -> list[str]:
    """What the report is about: files, span, tokenizer, calibration (text and HTML)."""
    inputs, settings = report["inputs"], report["settings"]
    return [
        f"{report['requests']:,} requests from {', '.join(inputs['files'])} over "
        f"{seconds_span(inputs['span_s'])}; {inputs['malformed']['count']} malformed line(s)",
        f"tokenizer: {settings['tokenizer'] or 'none needed'}",
        f"near-duplicate calibration: {settings['calibration']}",
        "KV budget: "
        + (
            "unbounded (the sweep shows smaller budgets)"
            if settings["capacity"]["prefix_tokens"] is None
            else f"{settings['capacity']['prefix_tokens']:,} tokens"
        ),
    ]


def near_duplicate_cell(report: dict[str, Any]) -> tuple[str, str]:
    """(count cell, share cell) of the near-duplicate row."""
    near = report["near_duplicates"]
    if not near["measured"]:
        return "not measured", "—"
    share = pct(near["share"])
    if near.get("interval"):
        low, high = near["interval"]
        share = f"{share} [{pct(low)}, {pct(high)}]"
    if near.get("estimated"):
        count = f"~{near['share'] * report['requests']:,.0f} (sample of {near['checked']:,})"
        return count, share
    return f"{report['census_counts']['near_duplicate']:,}", share


def render_text(report: dict[str, Any], out: IO[str], *, color: bool | None = None) -> None:
    console = Console(
        file=out,
        force_terminal=color,
        no_color=color is False,
        width=None if out.isatty() else 120,
        highlight=False,
    )
    lines = header_lines(report)
    console.print(f"[bold]infercache analyze[/bold]: {escape(lines[0])}")
    for line in lines[1:]:
        console.print(f"  {escape(line)}")
    _census(console, report)
    names = report.get("tenant_names", {})
    _groups(console, report["breakdown"]["tenant"], "tenant", names)
    _groups(console, report["breakdown"]["model"], "model", {})
    _simulation(console, report)
    _kv(console, report)
    _windows(console, report)
    _breakers(console, report["prefix_breakers"], names)
    _recommendation(console, report["recommendation"])
    for note in report["notes"]:
        console.print(f"[dim]note: {escape(note)}[/dim]")


def _census(console: Console, report: dict[str, Any]) -> None:
    table = Table(title="Census", title_justify="left")
    table.add_column("class")
    table.add_column("requests", justify="right")
    table.add_column("share", justify="right")
    table.add_column("within TTL", justify="right")
    within = report["reuse_distance_s"]["within_ttl"]
    for key, name in CLASS_NAMES.items():
        if key == "near_duplicate":
            count, share = near_duplicate_cell(report)
            table.add_row(name, count, share, pct(within.get(key)))
            continue
        count_text = f"{report['census_counts'][key]:,}"
        if report.get("census_estimated") and key in ("shared_prefix", "unique"):
            count_text = f"~{report['census'][key] * report['requests']:,.0f}"
        table.add_row(name, count_text, pct(report["census"][key]), pct(within.get(key)))
    console.print(table)
    nc, shared = report["not_cacheable"], report["shared_prefix"]
    mean = shared["mean_tokens"]
    console.print(
        f"prefix token share: [bold]{pct(report['prefix_token_share'])}[/bold] of "
        f"{report['prompt_tokens']:,} prompt tokens reusable by an unbounded prefix cache"
        + (f"; shared-prefix requests share {mean:,.0f} tokens on average" if mean else "")
        + f"; not cacheable: {pct(nc['share'])}"
        + (f" ({', '.join(f'{k}: {v}' for k, v in nc['reasons'].items())})" if nc["count"] else "")
    )
    near = report["near_duplicates"]
    if near["measured"] and near.get("label"):
        console.print(f"[yellow]near-duplicates: {escape(near['label'])}[/yellow]")


def _groups(console: Console, groups: dict[str, Any], kind: str, names: dict[str, str]) -> None:
    if len(groups) < 2:
        return
    table = Table(title=f"By {kind} (largest 10)", title_justify="left")
    for column in (kind, "requests", "exact", "near-dup", "prefix", "unique", "prefix tokens"):
        table.add_column(column, justify="left" if column == kind else "right")
    ranked = sorted(groups.items(), key=lambda item: -item[1]["requests"])[:10]
    for name, g in ranked:
        c = g["census"]
        table.add_row(
            names.get(name, name) or "(none)",
            f"{g['requests']:,}",
            pct(c["exact_repeat"]),
            pct(c["near_duplicate"]),
            pct(c["shared_prefix"]),
            pct(c["unique"]),
            pct(g["prefix_token_share"]),
        )
    console.print(table)


def _simulation(console: Console, report: dict[str, Any]) -> None:
    sim = report["simulation"]
    if not sim:
        return
    s = report["settings"]
    budget = s["capacity"]["prefix_tokens"]
    table = Table(
        title=(
            f"Replay (TTL {seconds_span(s['ttl_s'])}, exact store "
            f"{s['capacity']['exact_bytes']:,} B, KV "
            f"{'unbounded' if budget is None else f'{budget:,} tokens'}); saved:"
        ),
        title_justify="left",
        caption="prefix hit rate: share of prompt tokens reaching the engine that were reused",
        caption_justify="left",
    )
    for column in ("strategy", "hit rate", "prompt tok", "completion tok", "upstream time",
                   "money", "age p50/p90"):  # fmt: skip
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for name in ("exact", "semantic", "prefix", "layered"):
        f = sim[name]
        if name != "layered" and not f.get("available"):
            table.add_row(name, "not available", "—", "—", "—", "—", "—")
            continue
        age = f.get("age_s") or {}
        table.add_row(
            name,
            pct(f["token_hit_rate"] if name == "prefix" else f["hit_rate"]),
            pct(f["prompt_token_share"]),
            pct(f["completion_token_share"]),
            f"{seconds(f['upstream_s_saved'])} ({pct(f['upstream_share'])})",
            dollars(f["money_saved_usd"]),
            f"{seconds_span(age.get('p50_s_at_most'))}/{seconds_span(age.get('p90_s_at_most'))}"
            if age
            else "—",
        )
    console.print(table)
    prefix = sim["prefix"]
    if prefix.get("available"):
        ttft = milliseconds(prefix["ttft_saved_ms_mean"])
        console.print(
            f"prefix reuse: {ttft} off the mean time to first token of a request reaching the "
            "engine"
        )


def _kv(console: Console, report: dict[str, Any]) -> None:
    sweep = report.get("kv_sweep") or {}
    knee = sweep.get("knee")
    if not sweep.get("curve") or not knee:
        return
    console.print(
        f"KV sweep: the knee is at {knee['budget_tokens']:,} tokens ({pct(knee['token_share'])} "
        f"of prompt tokens reused; {pct(sweep['unbounded_token_share'])} unbounded, working set "
        f"{sweep['working_set_tokens']:,} tokens)"
    )


def _windows(console: Console, report: dict[str, Any]) -> None:
    windows = report.get("windows")
    if not windows:
        return
    table = Table(title=f"By {windows['by']}", title_justify="left")
    for column in ("from (UTC)", "requests", "exact", "near-dup", "prefix", "prefix tokens",
                   "exact hit", "prefix token hit"):  # fmt: skip
        table.add_column(column, justify="left" if column.startswith("from") else "right")
    for row in windows["rows"]:
        c = row["census"]
        table.add_row(
            row["start"],
            f"{row['requests']:,}",
            pct(c["exact_repeat"]),
            pct(c["near_duplicate"]),
            pct(c["shared_prefix"]),
            pct(row["prefix_token_share"]),
            pct(row["exact_hit_rate"]),
            pct(row["prefix_token_hit_rate"]),
        )
    console.print(table)


def _breakers(console: Console, breakers: list[dict[str, Any]], names: dict[str, str]) -> None:
    if not breakers:
        return
    console.print("[bold]Prefix breakers[/bold]")
    for b in breakers[:5]:
        tenant = names.get(b["tenant"], b["tenant"]) or "-"
        console.print(
            f"  {b['kind']} in the {b['role']} message ({tenant} / {b['model']}): ",
            markup=False,
            end="",
        )
        console.print(
            f"the shared part breaks at character {b['break_char']} (token ~{b['break_tokens']}); "
            f"{b['tail_tokens']} tokens after it are identical; moving it to the end would "
            f"reuse {b['tokens_lost']:,} more tokens ({pct(b['token_share_lost'])} of all)"
        )
        console.print(f"    {b['context']}", markup=False, style="dim")


def _recommendation(console: Console, rec: dict[str, Any]) -> None:
    console.print(f"[bold]Recommendation: {rec['layering']}[/bold]")
    for r in rec["reasons"]:
        mark = "[green]on [/green]" if r["enable"] else "[red]off[/red]"
        console.print(f"  {mark} {r['strategy']}: {escape(r['text'])}")
    for line in rec["advice"]:
        console.print(f"  advice: {escape(line)}")
    for alarm in rec["alarms"]:
        console.print(f"  alarm: {escape(alarm['meaning'])}")
