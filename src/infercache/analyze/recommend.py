"""Which strategies to turn on for this traffic, in which layering, each with its measured reason.

Computed from the report's figures (report_tree.py), never from anything the report does
not show: every figure a reason quotes is a `Quote` naming where the report shows it, so a
reason cannot contradict the report (tests/analyze/test_recommend_figures.py checks every
number of every reason over a grid of analyses). Rules (`RecommendRules`):
- prefix (KV reuse), checked first: it never changes an answer, so it belongs under every other
  layer whenever it saves a material share: at least `min_prefix_saving` of the prompt tokens
  (reused by an unbounded prefix cache, the census) or of the upstream time (the prefill it
  saves, priced by the cost model). The reason quotes the share, the prefill seconds and the
  cut in time to first token, and the money at the cached-input price. When only some tenants
  reach the bar on their own, it names them (`prefix_scope`). Below the bar, a prefix breaker
  whose fix would reach it turns the advice into "fix the layout first".
- exact: on when the replayed exact cache answers at least `min_exact_request_share` of the
  requests; the reason quotes the census's exact-repeat share and what the replay saved.
- semantic: only when measured. With the user's calibration: on when near-duplicates (beyond
  exact repeats) are at least `min_semantic_request_share` of the requests. With the packaged
  public calibration it is never turned on: the reason says whether tuning on your own pairs is
  worth it, with the share's 95% interval and the public-calibration label.
- layering: exact → semantic → prefix, keeping the ones turned on.
Beside the decisions, advice and alarms (advice.py); thresholds and figure formats: rules.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infercache.analyze.advice import Alarm, advice, alarms
from infercache.analyze.replay_figures import StrategyFigures
from infercache.analyze.report_tree import Figures, NearDuplicatesUnmeasured
from infercache.analyze.rules import (
    PathKey,
    RecommendRules,
    at,
    dollars,
    duration,
    milliseconds,
    pct,
    seconds,
)


@dataclass(frozen=True, slots=True)
class Quote:
    """A figure a reason shows: where the report holds it, its value, and how it is shown."""

    path: tuple[PathKey, ...]
    value: float
    shown: str


@dataclass(frozen=True, slots=True)
class StrategyDecision:
    strategy: str
    enable: bool
    text: str
    quotes: tuple[Quote, ...] = ()


@dataclass(frozen=True, slots=True)
class Recommendation:
    strategies: tuple[str, ...]  # turned on, in layering order
    reasons: tuple[StrategyDecision, ...]
    prefix_scope: tuple[str, ...]  # tenants where KV reuse pays, when not all of them
    advice: tuple[str, ...]
    alarms: tuple[Alarm, ...]

    @property
    def layering(self) -> str:
        """The strategies turned on, top to bottom (`exact → prefix`), or "none"."""
        return " → ".join(self.strategies) if self.strategies else "none"

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategies": list(self.strategies),
            "layering": self.layering,
            "reasons": [
                {
                    "strategy": r.strategy,
                    "enable": r.enable,
                    "text": r.text,
                    "quotes": [
                        {"path": list(q.path), "value": q.value, "shown": q.shown} for q in r.quotes
                    ],
                }
                for r in self.reasons
            ],
            "prefix_scope": list(self.prefix_scope),
            "advice": list(self.advice),
            "alarms": [
                {
                    "strategy": a.strategy,
                    "metric": a.metric,
                    "expected": a.expected,
                    "alert_below": a.alert_below,
                    "meaning": a.meaning,
                }
                for a in self.alarms
            ],
        }


class _Phrase:
    """Builds a reason's text while recording every figure it quotes."""

    def __init__(self, report: Figures) -> None:
        self.report = report
        self.quotes: list[Quote] = []

    def show(self, path: Sequence[PathKey], fmt: Any = pct) -> str:
        value = float(at(self.report, path))
        shown: str = fmt(value)
        self.quotes.append(Quote(tuple(path), value, shown))
        return shown

    def decide(self, strategy: str, enable: bool, text: str) -> StrategyDecision:
        return StrategyDecision(strategy, enable, text, tuple(self.quotes))


def recommend(report: Figures, rules: RecommendRules | None = None) -> Recommendation:
    r = rules or RecommendRules()
    prefix, scope = _prefix(report, r)
    exact = _exact(report, r)
    semantic = _semantic(report, r)
    on = tuple(x.strategy for x in (exact, semantic, prefix) if x.enable)
    return Recommendation(
        strategies=on,
        reasons=(exact, semantic, prefix),
        prefix_scope=scope,
        advice=tuple(advice(report, r, prefix.enable)),
        alarms=tuple(alarms(report, r, on)),
    )


def _exact(report: Figures, r: RecommendRules) -> StrategyDecision:
    p = _Phrase(report)
    repeats = p.show(("census", "exact_repeat"))
    exact = report.strategy("exact")
    if not isinstance(exact, StrategyFigures):
        return p.decide(
            "exact",
            False,
            f"{repeats} of the requests repeat exactly, but this log has no request bodies "
            "to replay an exact cache with: log full requests (or redacted ones) to decide",
        )
    served = p.show(("simulation", "exact", "request_share"))
    ttl = p.show(("settings", "ttl_s"), duration)  # as the replay's title shows it
    if exact.request_share >= r.min_exact_request_share:
        saved = p.show(("simulation", "exact", "completion_token_share"))
        return p.decide(
            "exact",
            True,
            f"{repeats} exact repeats → the exact cache (TTL {ttl}) answers {served} of "
            f"requests and saves {saved} of completion tokens",
        )
    return p.decide(
        "exact",
        False,
        f"{repeats} exact repeats → an exact cache (TTL {ttl}) would answer only {served} of "
        "requests: not worth running",
    )


def _semantic(report: Figures, r: RecommendRules) -> StrategyDecision:
    """Decided on the census: near-duplicates are what only a semantic layer can answer."""
    near = report.near_duplicates
    p = _Phrase(report)
    if isinstance(near, NearDuplicatesUnmeasured):
        return p.decide("semantic", False, f"not measured: {near.reason}")
    share = p.show(("near_duplicates", "share"))
    within = ""
    if near.interval is not None:
        level = p.show(("near_duplicates", "confidence"), lambda v: f"{100 * v:.0f}%")
        low = p.show(("near_duplicates", "interval", 0))
        high = p.show(("near_duplicates", "interval", 1))
        sample = ", on a uniform sample" if near.estimated else ""
        within = f" ({level} interval {low} to {high}{sample})"
    threshold = p.show(("near_duplicates", "threshold"), lambda v: f"{v:g}")
    worth = near.share >= r.min_semantic_request_share
    if near.label:
        verdict = (
            "worth tuning on your own labelled pairs (`infercache tune`), then a semantic "
            "cache with live verification"
            if worth
            else "semantic not worth its risk"
        )
        return p.decide(
            "semantic",
            False,
            f"near-duplicates add {share}{within} of requests beyond exact repeats at the "
            f"threshold {threshold} ({near.label}) → {verdict}",
        )
    also = ""
    if isinstance(report.strategy("semantic"), StrategyFigures):
        replayed = p.show(("simulation", "semantic", "request_share"))
        of_misses = p.show(("simulation", "semantic", "hit_rate"))
        also = (
            f" (in the replay it answered {replayed} of all requests: {of_misses} of the exact "
            "cache's misses)"
        )
    if worth:
        return p.decide(
            "semantic",
            True,
            f"near-duplicates add {share}{within} of requests beyond exact repeats at the "
            f"calibrated threshold {threshold}{also} → semantic cache; keep live verification "
            "on to hold its false-hit rate",
        )
    return p.decide(
        "semantic",
        False,
        f"near-duplicates add {share}{within} at the calibrated threshold {threshold}{also} → "
        "semantic not worth its risk",
    )


def _prefix(report: Figures, r: RecommendRules) -> tuple[StrategyDecision, tuple[str, ...]]:
    p = _Phrase(report)
    share = p.show(("prefix_token_share",))
    time_value = 0.0
    saving = ""
    sim = report.strategy("prefix")
    if isinstance(sim, StrategyFigures):
        time_value = sim.upstream_share
        prefill = p.show(("simulation", "prefix", "upstream_s_saved"), seconds)
        time_share = p.show(("simulation", "prefix", "upstream_share"))
        ttft = p.show(("simulation", "prefix", "ttft_saved_ms_mean"), milliseconds)
        money = p.show(("simulation", "prefix", "money_saved_usd"), dollars)
        saving = (
            f": it saves {prefill} of prefill ({time_share} of upstream time; {ttft} off the "
            f"mean time to first token) and {money} at the cached-input price"
        )
    if max(report.prefix_token_share, time_value) < r.min_prefix_saving:
        return p.decide("prefix", False, _prefix_off(report, p, share, saving, r)), ()
    tenants = {name: g for name, g in report.breakdown.tenant.items() if g.prompt_tokens}
    paying = sorted(n for n, g in tenants.items() if g.prefix_token_share >= r.min_prefix_saving)
    scope: tuple[str, ...] = ()
    where = ""
    if paying and len(paying) < len(tenants):
        scope = tuple(paying)
        skipped = sorted(set(tenants) - set(paying))
        where = (
            f"; only where prefixes are shared: tenant(s) {_names(p, paying)}, not "
            f"{_names(p, skipped)}"
        )
    under = ""
    exact = report.strategy("exact")
    below = report.simulation.layered.prefix_under_caches if report.simulation else None
    if isinstance(below, StrategyFigures) and isinstance(exact, StrategyFigures) and exact.hits:
        reused = p.show(("simulation", "layered", "prefix_under_caches", "token_hit_rate"))
        under = (
            f"; under the exact cache it reuses {reused} of the prompt tokens still reaching "
            "the engine"
        )
    return p.decide(
        "prefix",
        True,
        f"{share} of prompt tokens reuse an earlier prompt's prefix → KV reuse under every "
        f"other layer (it never changes an answer){saving}{under}{where}",
    ), scope


def _prefix_off(report: Figures, p: _Phrase, share: str, saving: str, r: RecommendRules) -> str:
    text = (
        f"only {share} of prompt tokens reuse an earlier prompt's prefix{saving} → KV reuse "
        "would save little"
    )
    breakers = report.prefix_breakers
    if breakers and report.prefix_breakers_summary.share_if_fixed >= r.min_prefix_saving:
        top = breakers[0]
        better = p.show(("prefix_breakers_summary", "share_if_fixed"))
        text += (
            f" as prompts are laid out now; moving the {top.kind} in the {top.role} "
            f"message to the end would raise that to {better} → fix the layout first, then "
            "turn on KV reuse"
        )
    return text


def _names(p: _Phrase, tenants: list[str]) -> str:
    shown = []
    for t in tenants[:5]:
        tenant_share = p.show(("breakdown", "tenant", t, "prefix_token_share"))
        shown.append(f"{p.report.name_of(t)} ({tenant_share})")
    return ", ".join(shown) + (f" and {len(tenants) - 5} more" if len(tenants) > 5 else "")
