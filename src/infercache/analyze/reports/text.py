"""The terminal summary of a report dict (document.py): rich tables, plain when not a terminal."""

from __future__ import annotations

from typing import IO, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

CLASS_NAMES = {
    "exact_repeat": "exact repeat",
    "near_duplicate": "near-duplicate",
    "shared_prefix": "shared prefix",
    "unique": "unique",
}


def pct(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{100 * value:.1f}%"


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 86_400:
        return f"{value / 86_400:.1f} d"
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.3g} s"


def render_text(report: dict[str, Any], out: IO[str], *, color: bool | None = None) -> None:
    console = Console(
        file=out,
        force_terminal=color,
        no_color=color is False,
        width=None if out.isatty() else 120,
        highlight=False,
    )
    inputs = report["inputs"]
    console.print(
        f"[bold]infercache analyze[/bold]: {report['requests']:,} requests from "
        f"{', '.join(inputs['files'])} over {_seconds(inputs['span_s'])}; "
        f"{inputs['malformed']['count']} malformed line(s)"
    )
    _census(console, report)
    _groups(console, report["breakdown"]["tenant"], "tenant")
    _groups(console, report["breakdown"]["model"], "model")
    _simulation(console, report)
    _breakers(console, report["prefix_breakers"])
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
        count = report["census_counts"][key]
        if key == "near_duplicate" and not report["semantic"]["measured"]:
            table.add_row(name, "not measured", "—", "—")
            continue
        table.add_row(name, f"{count:,}", pct(report["census"][key]), pct(within.get(key)))
    console.print(table)
    nc = report["not_cacheable"]
    console.print(
        f"prefix token share: [bold]{pct(report['prefix_token_share'])}[/bold] of "
        f"{report['prompt_tokens']:,} prompt tokens reusable by an unbounded prefix cache; "
        f"not cacheable: {pct(nc['share'])}"
        + (f" ({', '.join(f'{k}: {v}' for k, v in nc['reasons'].items())})" if nc["count"] else "")
    )


def _groups(console: Console, groups: dict[str, Any], kind: str) -> None:
    if len(groups) < 2:
        return
    table = Table(title=f"By {kind} (largest 10)", title_justify="left")
    for column in (kind, "requests", "exact", "near-dup", "prefix", "unique", "prefix tokens"):
        table.add_column(column, justify="left" if column == kind else "right")
    ranked = sorted(groups.items(), key=lambda item: -item[1]["requests"])[:10]
    for name, g in ranked:
        c = g["census"]
        table.add_row(
            name or "(none)",
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
    table = Table(
        title=(
            f"Replay (TTL {_seconds(s['ttl_s'])}, exact store {s['capacity']['exact_bytes']:,} B, "
            f"KV {s['capacity']['prefix_tokens']:,} tokens); saved:"
        ),
        title_justify="left",
        caption="prefix hit rate: share of prompt tokens reaching the engine that were reused",
        caption_justify="left",
    )
    for column in ("strategy", "hit rate", "prompt tok", "completion tok", "upstream s",
                   "money", "age p50/p90"):  # fmt: skip
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for name in ("exact", "semantic", "prefix", "layered"):
        f = sim[name]
        if name != "layered" and not f.get("available"):
            table.add_row(name, "—", "—", "—", "—", "—", "—")
            continue
        age = f.get("age_s") or {}
        table.add_row(
            name,
            pct(f["token_hit_rate"] if name == "prefix" else f["hit_rate"]),
            pct(f["prompt_token_share"]),
            pct(f["completion_token_share"]),
            f"{f['upstream_s_saved']:,.0f} ({pct(f['upstream_share'])})",
            f"${f['money_saved_usd']:,.2f}",
            f"{_seconds(age.get('p50_s_at_most'))}/{_seconds(age.get('p90_s_at_most'))}"
            if age
            else "—",
        )
    console.print(table)


def _breakers(console: Console, breakers: list[dict[str, Any]]) -> None:
    if not breakers:
        return
    console.print("[bold]Prefix breakers[/bold]")
    for b in breakers[:5]:
        console.print(
            f"  {b['kind']} in the {b['role']} message ({b['tenant'] or '-'} / {b['model']}): ",
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
