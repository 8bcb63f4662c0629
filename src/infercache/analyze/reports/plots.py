"""The report's plots as PNG bytes, drawn from a report dict (document.py) with matplotlib's
object API (no pyplot, so no global figure state). Each function returns one figure:
census bar, hit rate vs TTL, hit rate vs capacity, prefix-share distribution, reuse-distance
CDF. A plot whose data was not computed says so inside the figure rather than disappearing.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Sequence
from typing import Any

CLASS_ORDER = ("exact_repeat", "near_duplicate", "shared_prefix", "unique")
CLASS_COLORS = ("#2b8a3e", "#1971c2", "#f08c00", "#868e96")
SIZE_IN = (6.4, 3.4)


def _figure() -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=SIZE_IN, dpi=100, layout="constrained")


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _empty(ax: Any, why: str) -> None:
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="#868e96")
    ax.set_xticks([])
    ax.set_yticks([])


def census_bar(report: dict[str, Any]) -> bytes:
    """Class shares overall and, when there are several, per tenant (stacked bars)."""
    fig = _figure()
    ax = fig.add_subplot()
    rows: list[tuple[str, dict[str, float]]] = [("all", report["census"])]
    tenants = report["breakdown"]["tenant"]
    if 1 < len(tenants) <= 12:
        rows += [(name or "(none)", g["census"]) for name, g in sorted(tenants.items())]
    labels = [name for name, _ in rows]
    left = [0.0] * len(rows)
    for cls, color in zip(CLASS_ORDER, CLASS_COLORS, strict=True):
        widths = [100 * shares[cls] for _, shares in rows]
        ax.barh(labels, widths, left=left, color=color, label=cls.replace("_", " "))
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of requests (%)")
    ax.set_title("Census: each request in exactly one class")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.08), ncols=4, fontsize="small")
    return _png(fig)


def hit_rate_vs_ttl(report: dict[str, Any]) -> bytes:
    fig = _figure()
    ax = fig.add_subplot()
    rows = (report.get("sweeps") or {}).get("ttl") or []
    if not rows:
        _empty(ax, "TTL sweep not computed (run with --sweep)")
        return _png(fig)
    ttl = [r["ttl_s"] for r in rows]
    ax.plot(ttl, [100 * (r["exact_hit_rate"] or 0) for r in rows], "o-", label="exact")
    if any(r["semantic_hit_rate"] is not None for r in rows):
        ax.plot(ttl, [100 * (r["semantic_hit_rate"] or 0) for r in rows], "s-", label="semantic")
    ax.axvline(report["settings"]["ttl_s"], color="#868e96", linestyle="--", label="TTL given")
    ax.set_xscale("log")
    ax.set_xlabel("TTL (s)")
    ax.set_ylabel("requests answered (%)")
    ax.set_title("Hit rate vs TTL (replay)")
    ax.legend(fontsize="small")
    return _png(fig)


def hit_rate_vs_capacity(report: dict[str, Any]) -> bytes:
    fig = _figure()
    sweeps = report.get("sweeps") or {}
    exact_rows, prefix_rows = (
        sweeps.get("exact_capacity") or [],
        sweeps.get("prefix_capacity") or [],
    )
    left, right = fig.subplots(1, 2)
    if exact_rows:
        left.plot(
            [r["capacity_bytes"] / 2**20 for r in exact_rows],
            [100 * (r["exact_hit_rate"] or 0) for r in exact_rows],
            "o-",
        )
        left.set_xscale("log")
        left.set_xlabel("exact store (MiB)")
        left.set_ylabel("requests answered (%)")
        left.set_title("exact cache", fontsize="medium")
    else:
        _empty(left, "not computed")
    if prefix_rows:
        right.plot(
            [r["capacity_tokens"] for r in prefix_rows],
            [100 * (r["token_hit_rate"] or 0) for r in prefix_rows],
            "o-",
            color="#f08c00",
        )
        right.set_xscale("log")
        right.set_xlabel("KV budget (tokens)")
        right.set_ylabel("prompt tokens reused (%)")
        right.set_title("KV prefix reuse", fontsize="medium")
    else:
        _empty(right, "not computed")
    fig.suptitle("Hit rate vs capacity (replay)")
    return _png(fig)


def prefix_share_distribution(report: dict[str, Any]) -> bytes:
    fig = _figure()
    ax = fig.add_subplot()
    hist = report["prefix_share_histogram"]
    counts: Sequence[int] = hist["counts"][: len(hist["bounds"])]
    total = sum(counts)
    if not total:
        _empty(ax, "no prompt known")
        return _png(fig)
    bounds = [0.0, *hist["bounds"]]
    ax.bar(
        [100 * b for b in bounds[:-1]],
        [100 * c / total for c in counts],
        width=[100 * (b - a) for a, b in itertools.pairwise(bounds)],
        align="edge",
        color="#f08c00",
        edgecolor="white",
    )
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the request's prompt an unbounded prefix cache reuses (%)")
    ax.set_ylabel("requests (%)")
    ax.set_title(f"Prefix share per request (overall {100 * report['prefix_token_share']:.1f}%)")
    return _png(fig)


def reuse_distance_cdf(report: dict[str, Any]) -> bytes:
    fig = _figure()
    ax = fig.add_subplot()
    distances = report["reuse_distance_s"]
    bounds = distances["bounds"]
    drawn = False
    for cls, color in zip(CLASS_ORDER[:3], CLASS_COLORS, strict=False):
        counts = distances.get(cls) or []
        total = sum(counts)
        if not total:
            continue
        running, ys = 0, []
        for count in counts[: len(bounds)]:
            running += count
            ys.append(100 * running / total)
        ax.step(bounds, ys, where="post", color=color, label=cls.replace("_", " "))
        drawn = True
    if not drawn:
        _empty(ax, "no repeats with timestamps")
        return _png(fig)
    ax.axvline(distances["ttl_s"], color="#868e96", linestyle="--", label="TTL")
    ax.set_xscale("log")
    ax.set_ylim(0, 100)
    ax.set_xlabel("time since the request it reuses (s)")
    ax.set_ylabel("cumulative share (%)")
    ax.set_title("Reuse distance CDF")
    ax.legend(fontsize="small")
    return _png(fig)


PLOTS = (
    ("census", "Census", census_bar),
    ("ttl", "Hit rate vs TTL", hit_rate_vs_ttl),
    ("capacity", "Hit rate vs capacity", hit_rate_vs_capacity),
    ("prefix-share", "Prefix share distribution", prefix_share_distribution),
    ("reuse-distance", "Reuse distance CDF", reuse_distance_cdf),
)
