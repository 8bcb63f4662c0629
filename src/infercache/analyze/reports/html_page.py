"""One self-contained HTML page of a report (document.py `Report`), to forward to a team.

Everything is inline: CSS, the plots the report has data for as base64 PNG `<img>`s (plots.py),
and a few lines of
script that, once the page has loaded, set `data-ready="true"` on `<body>` when every image
decoded (`naturalWidth > 0`) and `data-plots-decoded` to how many did: a headless browser's
`--dump-dom` shows whether the page rendered with every plot. No external request is made.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping

from infercache.analyze.recommend import Recommendation
from infercache.analyze.replay_figures import Unavailable
from infercache.analyze.report_tree import Figures, GroupFigures, NearDuplicateFigures
from infercache.analyze.reports import prompt_cache_table
from infercache.analyze.reports.document import Report
from infercache.analyze.reports.plots import plots_for, png
from infercache.analyze.reports.text import (
    CLASS_NAMES,
    class_count_cell,
    header_lines,
    near_duplicate_cell,
    pct,
    replay_rows,
    saved_cells,
)

STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:1000px;color:#212529;
padding:0 1rem}h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid
#dee2e6}table{border-collapse:collapse;margin:.5rem 0}td,th{padding:.2rem .7rem;text-align:right;
border-bottom:1px solid #f1f3f5}td:first-child,th:first-child{text-align:left}.rec{background:
#f8f9fa;border-left:4px solid #2b8a3e;padding:.6rem 1rem}.on{color:#2b8a3e;font-weight:600}
.off{color:#c92a2a;font-weight:600}figure{margin:1rem 0}img{max-width:100%}.note{color:#868e96}
code{background:#f1f3f5;padding:0 .2rem}.warn{color:#e67700;font-weight:600}
"""

READY_SCRIPT = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var decoded = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; });
  document.body.setAttribute('data-plots-decoded', String(decoded.length));
  document.body.setAttribute('data-ready',
    imgs.length > 0 && decoded.length === imgs.length ? 'true' : 'false');
});
"""


def _e(value: object) -> str:
    return html.escape(str(value))


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _recommendation(rec: Recommendation) -> str:
    items = "".join(
        f"<li><span class={'on' if r.enable else 'off'}>"
        f"{'on' if r.enable else 'off'}</span> <b>{_e(r.strategy)}</b>: {_e(r.text)}</li>"
        for r in rec.reasons
    )
    advice = "".join(f"<li>{_e(a)}</li>" for a in rec.advice)
    alarms = "".join(f"<li>{_e(a.meaning)}</li>" for a in rec.alarms)
    return (
        f"<div class=rec><p><b>Turn on: {_e(rec.layering)}</b></p><ul>{items}</ul>"
        + (f"<p>Advice</p><ul>{advice}</ul>" if advice else "")
        + (f"<p>If hit rates fall later</p><ul>{alarms}</ul>" if alarms else "")
        + "</div>"
    )


def _census(f: Figures) -> str:
    within = f.reuse_distance_s.within_ttl
    rows = []
    for k, name in CLASS_NAMES.items():
        if k == "near_duplicate":
            count, share = near_duplicate_cell(f)
        else:
            count, share = class_count_cell(f, k), pct(f.census.of_class(k))
        rows.append([name, count, share, pct(within.get(k))])
    near = f.near_duplicates
    label = (
        f"<p class=warn>Near-duplicates: {_e(near.label)}.</p>"
        if isinstance(near, NearDuplicateFigures) and near.label
        else ""
    )
    mean = f.shared_prefix.mean_tokens
    return (
        _table(["class", "requests", "share", "within TTL"], rows)
        + label
        + f"<p>Prefix token share: <b>{pct(f.prefix_token_share)}</b> of "
        f"{f.prompt_tokens:,} prompt tokens"
        + (f"; shared-prefix requests share {mean:,.0f} tokens on average" if mean else "")
        + f". Not cacheable: {pct(f.not_cacheable.share)}.</p>"
    )


def _simulation(f: Figures) -> str:
    if f.simulation is None:
        return "<p>No replay.</p>"
    rows = []
    for name, row in replay_rows(f.simulation):
        if isinstance(row, Unavailable):
            rows.append([name, "not available", "", "", "", ""])
            continue
        rows.append([name + (" (tokens)" if name == "prefix" else ""), *saved_cells(name, row)])
    header = ["strategy", "hit rate", "prompt tokens saved", "completion tokens saved",
              "upstream time saved", "money saved"]  # fmt: skip
    return _table(header, rows)


def _breakers(f: Figures) -> str:
    if not f.prefix_breakers:
        return "<p>None found.</p>"
    rows = [
        [
            f"{f.tenant_names.get(b.tenant, b.tenant) or '-'} / {b.model}",
            f"{b.kind} in the {b.role} message",
            f"char {b.break_char} (token ~{b.break_tokens})",
            f"{b.tail_tokens:,}",
            f"{b.tokens_lost:,} ({pct(b.token_share_lost)})",
            b.context,
        ]
        for b in f.prefix_breakers[:10]
    ]
    header = ["where", "what varies", "shared part breaks at", "identical tokens after",
              "tokens lost", "context"]  # fmt: skip
    return _table(header, rows)


def _groups(groups: Mapping[str, GroupFigures], kind: str, names: Mapping[str, str]) -> str:
    ranked = sorted(groups.items(), key=lambda item: -item[1].requests)[:20]
    rows = [
        [names.get(name, name) or "(none)", f"{g.requests:,}"]
        + [pct(g.census.of_class(k)) for k in CLASS_NAMES]
        + [pct(g.prefix_token_share)]
        for name, g in ranked
    ]
    return _table([kind, "requests", *CLASS_NAMES.values(), "prefix tokens"], rows)


def _kv(f: Figures) -> str:
    sweep = f.kv_sweep
    if sweep is None or not sweep.curve or sweep.knee is None:
        return "<p>No prompt tokens to reuse.</p>"
    knee = sweep.knee
    return (
        f"<p>The knee of the sweep is at <b>{knee.budget_tokens:,} tokens</b>: "
        f"{pct(knee.token_share)} of prompt tokens reused, against "
        f"{pct(sweep.unbounded_token_share)} unbounded (working set "
        f"{sweep.working_set_tokens:,} tokens).</p>"
    )


def _windows(f: Figures) -> str:
    windows = f.windows
    if not windows:
        return ""
    rows = [
        [
            r.start,
            f"{r.requests:,}",
            pct(r.census.exact_repeat),
            pct(r.census.shared_prefix),
            pct(r.prefix_token_share),
            pct(r.exact_hit_rate),
            pct(r.prefix_token_hit_rate),
        ]
        for r in windows.rows
    ]
    header = ["from (UTC)", "requests", "exact", "shared prefix", "prefix tokens",
              "exact hit rate", "prefix token hit rate"]  # fmt: skip
    return f"<h2>By {_e(windows.by)}</h2>" + _table(header, rows)


def _cost(f: Figures) -> str:
    rows = [
        [
            model or "(none)",
            m.source,
            f"{m.overhead_s:g} s",
            f"{m.prefill_tokens_per_s:,.0f} tok/s",
            f"{m.decode_tokens_per_s:,.1f} tok/s",
        ]
        for model, m in f.cost_model.models.items()
    ]
    return _table(["model", "rates from", "overhead", "prefill", "decode"], rows)


def _prompt_cache(f: Figures) -> str:
    section = f.provider_prompt_cache
    if section is None:
        return ""
    header, note = list(prompt_cache_table.HEADER), prompt_cache_table.unpriced_note(section)
    return "".join(
        f"<h2>{_e(t.title)}</h2>{_table(header, t.rows)}"
        + (f"<p class=warn>{_e(t.alarm)}</p>" if t.alarm else "")
        for t in prompt_cache_table.tables(section)
    ) + (f"<p class=note>{_e(note)}</p>" if note else "")


def render_html(report: Report) -> str:
    f = report.figures
    figures = "".join(
        f"<figure><img id=plot-{key} alt='{_e(title)}' src='data:image/png;base64,"
        f"{base64.b64encode(png(draw(f))).decode()}'><figcaption>{_e(title)}</figcaption>"
        "</figure>"
        for key, title, draw in plots_for(f)
    )
    notes = "".join(f"<li class=note>{_e(n)}</li>" for n in f.notes)
    header = "".join(f"<p class=note>{_e(line)}</p>" for line in header_lines(f))
    return (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>infercache traffic analysis</title><style>{STYLE}</style></head><body>"
        f"<h1>Traffic analysis: {f.requests:,} requests</h1>{header}"
        f"<h2>Recommendation</h2>{_recommendation(report.recommendation)}"
        f"<h2>Census</h2>{_census(f)}"
        f"<h2>Plots</h2>{figures}"
        f"<h2>Replay</h2>{_simulation(f)}"
        f"<h2>KV budget</h2>{_kv(f)}"
        f"{_windows(f)}"
        f"<h2>Upstream time</h2>{_cost(f)}"
        f"<h2>Prefix breakers</h2>{_breakers(f)}"
        f"{_prompt_cache(f)}"
        f"<h2>By tenant</h2>{_groups(f.breakdown.tenant, 'tenant', f.tenant_names)}"
        f"<h2>By model</h2>{_groups(f.breakdown.model, 'model', {})}"
        f"<h2>Notes</h2><ul>{notes}</ul>"
        f"<script>{READY_SCRIPT}</script></body></html>"
    )
