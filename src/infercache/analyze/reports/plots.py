"""The report's plots as PNG bytes, drawn from its figures (report_tree.py) with matplotlib's
object API (no pyplot, so no global figure state).

Each function returns a matplotlib `Figure`; `png(figure)` renders it. `plots_for(figures)`
lists the plots
the report has data for, and only those: a strategy the
replay table calls not available gets no plot (a flat line at 0 would read as a measurement).
Census bar; hit rate vs TTL (exact, semantic when replayed); exact hit rate vs store size; KV
reuse vs budget (the sweep, its knee marked); prefix-share distribution; reuse-distance CDF;
per window of time (`--by`). Every rate axis starts at 0; legends sit outside the axes, below
them, in a constrained layout that makes room for them.
"""

from __future__ import annotations

import datetime
import io
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from infercache.analyze.replay_figures import StrategyFigures
from infercache.analyze.report_tree import CLASSES, ClassShares, Figures, NearDuplicateFigures

CLASS_COLORS = ("#2b8a3e", "#1971c2", "#f08c00", "#868e96")
SIZE_IN = (6.4, 3.6)
Draw = Callable[[Figures], Any]  # the report's figures → a matplotlib Figure


def _figure(size: tuple[float, float] = SIZE_IN) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=size, dpi=100, layout="constrained")


def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _legend_below(fig: Any, ax: Any, ncols: int = 4) -> None:
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize="small")


def _rates(
    fig: Any, ax: Any, title: str, xlabel: str | None, ylabel: str, *, ncols: int = 4
) -> Any:
    """A plot of rates finished: labels, the rate axis from 0 to 100%, the legend below."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 100.0)
    ax.set_title(title)
    _legend_below(fig, ax, ncols)
    return fig


def census_bar(report: Figures) -> Any:
    """Class shares overall and, when there are several, per tenant (stacked bars)."""
    fig = _figure()
    ax = fig.add_subplot()
    rows: list[tuple[str, ClassShares]] = [("all", report.census)]
    tenants = report.breakdown.tenant
    if 1 < len(tenants) <= 12:
        rows += [(report.name_of(t), g.census) for t, g in sorted(tenants.items())]
    labels = [name for name, _ in rows]
    left = [0.0] * len(rows)
    measured = isinstance(report.near_duplicates, NearDuplicateFigures)
    for cls, color in zip(CLASSES, CLASS_COLORS, strict=True):
        widths = [100 * shares.of_class(cls) for _, shares in rows]
        label = cls.replace("_", " ")
        if cls == "near_duplicate" and not measured:
            label += " (not measured)"
        ax.barh(labels, widths, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of requests (%)")
    ax.set_title("Census: each request in exactly one class")
    _legend_below(fig, ax)
    return fig


def hit_rate_vs_ttl(report: Figures) -> Any:
    fig = _figure()
    ax = fig.add_subplot()
    rows = report.sweeps.ttl if report.sweeps else ()
    ttl = [r.ttl_s for r in rows]
    ax.plot(ttl, [100 * (r.exact_hit_rate or 0) for r in rows], "o-", label="exact")
    if isinstance(report.strategy("semantic"), StrategyFigures):
        ax.plot(ttl, [100 * (r.semantic_hit_rate or 0) for r in rows], "s-", label="semantic")
    ax.axvline(report.settings.ttl_s, color="#868e96", linestyle="--", label="TTL given")
    ax.set_xscale("log")
    return _rates(fig, ax, "Hit rate vs TTL (replay)", "TTL (s)", "requests answered (%)")


def exact_hit_rate_vs_capacity(report: Figures) -> Any:
    fig = _figure()
    ax = fig.add_subplot()
    sweep = report.sweeps.exact_capacity if report.sweeps else ()
    rows = [(r.capacity_bytes, r.exact_hit_rate) for r in sweep if r.capacity_bytes is not None]
    ax.plot(
        [capacity / 2**20 for capacity, _ in rows],
        [100 * (rate or 0) for _, rate in rows],
        "o-",
        label="exact cache",
    )
    ax.set_xscale("log")
    title = "Exact hit rate vs store size (replay)"
    return _rates(fig, ax, title, "exact store (MiB)", "requests answered (%)")


def kv_reuse_vs_budget(report: Figures) -> Any:
    fig = _figure()
    ax = fig.add_subplot()
    sweep = report.kv_sweep
    curve = sweep.curve if sweep else ()
    budgets = [p.budget_tokens for p in curve]
    ax.plot(budgets, [100 * p.token_share for p in curve], "o-", color="#f08c00",
            label="prompt tokens reused")  # fmt: skip
    ax.plot(budgets, [100 * p.hit_share for p in curve], "s--", color="#1971c2",
            label="requests reusing a prefix")  # fmt: skip
    knee = sweep.knee if sweep else None
    if knee is not None:
        ax.axvline(knee.budget_tokens, color="#c92a2a", linestyle=":",
                   label=f"knee: {knee.budget_tokens:,} tokens")  # fmt: skip
    budget = report.settings.capacity.prefix_tokens
    if budget is not None:
        ax.axvline(budget, color="#868e96", linestyle="--", label="budget given")
    ax.set_xscale("log", base=2)
    title = "KV prefix reuse vs budget (LRU, one pass)"
    return _rates(fig, ax, title, "KV budget (tokens)", "share (%)", ncols=2)


def prefix_share_distribution(report: Figures) -> Any:
    fig = _figure()
    ax = fig.add_subplot()
    hist = report.prefix_share_histogram
    counts: Sequence[int] = hist.counts[: len(hist.bounds)]
    total = sum(counts)
    bounds = [0.0, *hist.bounds]
    ax.bar(
        [100 * b for b in bounds[:-1]],
        [100 * c / total for c in counts],
        width=[100 * (b - a) for a, b in itertools.pairwise(bounds)],
        align="edge",
        color="#f08c00",
        edgecolor="white",
    )
    ax.set_xlim(0, 100)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("share of the request's prompt an unbounded prefix cache reuses (%)")
    ax.set_ylabel("requests (%)")
    ax.set_title(f"Prefix share per request (overall {100 * report.prefix_token_share:.1f}%)")
    return fig


def reuse_distance_cdf(report: Figures) -> Any:
    fig = _figure()
    ax = fig.add_subplot()
    distances = report.reuse_distance_s
    bounds = distances.bounds
    for cls, color in zip(CLASSES[:3], CLASS_COLORS, strict=False):
        counts = distances.counts_of(cls)
        total = sum(counts)
        if not total:
            continue
        running, ys = 0, []
        for count in counts[: len(bounds)]:
            running += count
            ys.append(100 * running / total)
        ax.step(bounds, ys, where="post", color=color, label=cls.replace("_", " "))
    ax.axvline(distances.ttl_s, color="#868e96", linestyle="--", label="TTL")
    ax.set_xscale("log")
    xlabel = "time since the request it reuses (s)"
    return _rates(fig, ax, "Reuse distance CDF", xlabel, "cumulative share (%)")


def per_window(report: Figures) -> Any:
    fig = _figure((7.2, 3.8))
    ax = fig.add_subplot()
    by = report.windows.by if report.windows else ""
    rows = report.windows.rows if report.windows else ()
    x = list(range(len(rows)))
    ax.plot(x, [100 * r.census.exact_repeat for r in rows], "o-", color=CLASS_COLORS[0],
            label="exact repeats")  # fmt: skip
    ax.plot(x, [100 * r.prefix_token_share for r in rows], "s-", color=CLASS_COLORS[2],
            label="prefix token share")  # fmt: skip
    if any(r.exact_hit_rate is not None for r in rows):
        ax.plot(x, [100 * (r.exact_hit_rate or 0) for r in rows], "^--",
                color="#2f9e44", label="exact hit rate (replay)")  # fmt: skip
    if any(r.prefix_token_hit_rate is not None for r in rows):
        ax.plot(x, [100 * (r.prefix_token_hit_rate or 0) for r in rows], "v--",
                color="#e8590c", label="prefix token hit rate (replay)")  # fmt: skip
    step = max(1, len(rows) // 8)
    daily = by == "day"
    labels = [_utc(r.start_s, "%Y-%m-%d" if daily else "%m-%d %H:%M") for r in rows]
    ax.set_xticks(x[::step], labels[::step], rotation=20, fontsize="small")
    return _rates(fig, ax, f"Per {by} (UTC)", None, "share (%)", ncols=2)


def _utc(seconds: float, fmt: str) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime(fmt)


def plots_for(report: Figures) -> list[tuple[str, str, Draw]]:
    """(key, title, draw) of every plot the report has data for."""
    sweeps = report.sweeps
    exact = isinstance(report.strategy("exact"), StrategyFigures)
    out: list[tuple[str, str, Draw]] = [("census", "Census", census_bar)]
    if exact and sweeps and sweeps.ttl:
        out.append(("ttl", "Hit rate vs TTL", hit_rate_vs_ttl))
    if exact and sweeps and sweeps.exact_capacity:
        out.append(("exact-capacity", "Exact hit rate vs store size", exact_hit_rate_vs_capacity))
    if report.kv_sweep and report.kv_sweep.curve:
        out.append(("kv-budget", "KV prefix reuse vs budget", kv_reuse_vs_budget))
    if sum(report.prefix_share_histogram.counts):
        out.append(("prefix-share", "Prefix share distribution", prefix_share_distribution))
    distances = report.reuse_distance_s
    if any(sum(distances.counts_of(c)) for c in CLASSES[:3]):
        out.append(("reuse-distance", "Reuse distance CDF", reuse_distance_cdf))
    if report.windows and report.windows.rows:
        out.append(("windows", f"Per {report.windows.by}", per_window))
    return out
