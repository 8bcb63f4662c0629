"""What the recommendation adds beside its decisions, from the report's figures alone: advice
(TTL, prefix breakers, traffic the cache cannot serve, the KV budget's knee, the exact store's
size) and alarms (the misconfiguration alarm: for each strategy turned on, the hit rate
measured here, a floor at `alarm_fraction` of it, and what falling under it means; written as
Prometheus rules by reports/alerts.py)."""

from __future__ import annotations

from dataclasses import dataclass

from infercache.analyze.census import DISTANCE_BOUNDS_S
from infercache.analyze.replay_figures import Strategy, StrategyFigures
from infercache.analyze.report_tree import Figures
from infercache.analyze.rules import RecommendRules, duration, pct
from infercache.prefix_breakers import advice_line


@dataclass(frozen=True, slots=True)
class Alarm:
    strategy: str
    metric: str  # "hit_rate" (requests) or "token_hit_rate" (prompt tokens, prefix)
    expected: float
    alert_below: float
    meaning: str


def advice(report: Figures, r: RecommendRules, prefix_on: bool) -> list[str]:
    out = _ttl_advice(report, r)
    for b in report.prefix_breakers[:3]:
        tenant = report.tenant_names.get(b.tenant, b.tenant)
        who = f"tenant {tenant!r}, model {b.model!r}" if b.tenant else f"model {b.model!r}"
        out.append(advice_line(b, who))
    total = report.requests
    for why, n in report.not_cacheable.reasons.items():
        if n / total >= 0.1:
            hint = (
                "; if they do not need a fresh sample, send temperature 0 or a seed"
                if why.startswith("sampled")
                else ""
            )
            out.append(f"{pct(n / total)} of requests are not cacheable ({why}){hint}")
    if prefix_on:
        out += _kv_advice(report)
    out += _exact_capacity_advice(report)
    return out


def _ttl_advice(report: Figures, r: RecommendRules) -> list[str]:
    distances = report.reuse_distance_s
    counts = distances.exact_repeat
    timed = sum(counts)
    within = distances.within_ttl.get("exact_repeat")
    if not timed or within is None or within >= r.ttl_coverage:
        return []
    running, better = 0, None
    for bound, count in zip(DISTANCE_BOUNDS_S, counts, strict=False):
        running += count
        if running >= 0.9 * timed:
            better = bound
            break
    hint = f"; a TTL of {better:g} s would cover 90%" if better is not None else ""
    return [
        f"only {pct(within)} of the {report.census_counts.exact_repeat:,.0f} exact repeats "
        f"come back within the {duration(distances.ttl_s)} TTL{hint} (if the answers stay valid "
        "that long)"
    ]


def _kv_advice(report: Figures) -> list[str]:
    sweep = report.kv_sweep
    if sweep is None or sweep.knee is None:
        return []
    budget = report.settings.capacity.prefix_tokens
    text = (
        f"KV budget: {sweep.knee.budget_tokens:,} tokens (the knee of the sweep) reuse "
        f"{pct(sweep.knee.token_share)} of prompt tokens, against "
        f"{pct(sweep.unbounded_token_share)} with no bound; past the knee each doubling "
        "adds less"
    )
    if budget is not None:
        text += f" (the replay used {budget:,} tokens)"
    return [text]


def _exact_capacity_advice(report: Figures) -> list[str]:
    rows = report.sweeps.exact_capacity if report.sweeps else ()
    by_factor = {row.factor: row.exact_hit_rate or 0.0 for row in rows}
    now, big = by_factor.get(1.0), by_factor.get(4.0)
    if now is not None and big is not None and big - now >= 0.02:
        return [
            f"a 4× larger exact store would answer {pct(big)} instead of {pct(now)} of requests"
        ]
    return []


_MEANING = {
    "exact": (
        "on this traffic that means requests stopped repeating byte for byte: look for a "
        "per-request value added to the messages (a timestamp, an id), a parameter that now "
        "varies, a shorter TTL, a model-version swap, or evictions from a too-small store"
    ),
    "semantic": (
        "live verification may have tightened the threshold, or the scope now varies per "
        "request (a system prompt or parameter that changes)"
    ),
    "prefix": (
        "the shared prompt prefix is broken: varying text moved in front of the shared part "
        "(see prefix breakers), the KV budget is too small for the working set, or requests "
        "of one tenant are spread over engines"
    ),
}


def alarms(report: Figures, r: RecommendRules, on: tuple[str, ...]) -> list[Alarm]:
    alarms = []
    for name in on:
        fig: Strategy = report.strategy(name)
        metric = "hit_rate"
        if name == "prefix":
            # What the engine's own metrics will show: below the exact cache when it is on.
            if "exact" in on and report.simulation is not None:
                fig = report.simulation.layered.prefix_under_caches
            metric = "token_hit_rate"
        if not isinstance(fig, StrategyFigures):
            continue
        expected = float(getattr(fig, metric))
        floor = r.alarm_fraction * expected
        alarms.append(
            Alarm(
                name,
                metric,
                expected,
                floor,
                f"alert when the {name} {metric.replace('_', ' ')} stays under {pct(floor)} "
                f"(measured here: {pct(expected)}): " + _MEANING[name],
            )
        )
    return alarms
