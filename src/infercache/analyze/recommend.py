"""Which strategies to turn on for this traffic, in which layering, each with its measured reason.

Rules (`RecommendRules`, every figure from this analysis):
- exact: on when the replayed exact cache serves at least `min_exact_request_share` of the
  requests. The reason quotes the census's exact-repeat share and what the replay saved.
- semantic: only when measured (a calibrated threshold was given); on when near-duplicates
  (the census class, beyond exact repeats) are at least `min_semantic_request_share` of the
  requests at that threshold, otherwise "not worth its risk" (every semantic hit carries some
  false-hit risk, exact hits none). The reason also quotes the replay.
- prefix (KV reuse): on for the tenants where it pays: an unbounded prefix cache would reuse
  at least `min_prefix_token_share` of their prompt tokens, and at least
  `min_long_prefix_share` of their requests reuse a long prefix (`min_prefix_tokens` or
  more; a short shared preamble alone saves little). When only some tenants qualify, the
  recommendation names them (`prefix_scope`). The reason also quotes the replay at the
  configured KV budget.
- layering: exact → semantic → prefix, keeping the ones turned on.
Advice: TTL (repeats coming back after it), capacity (when the sweep shows a bigger store or KV
budget pays), prefix breakers, traffic the cache cannot serve.
Alarms (the misconfiguration alarm): for each strategy turned on, the hit rate measured here,
a floor at `alarm_fraction` of it, and what falling under it means for this traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infercache.analyze.analysis import Analysis
from infercache.analyze.census import DISTANCE_BOUNDS_S, Class
from infercache.analyze.reports.replay_numbers import strategy


@dataclass(frozen=True, slots=True)
class RecommendRules:
    min_exact_request_share: float = 0.05
    min_semantic_request_share: float = 0.05
    min_prefix_token_share: float = 0.10
    min_long_prefix_share: float = 0.2
    alarm_fraction: float = 0.5
    ttl_coverage: float = 0.8  # advise a longer TTL when fewer repeats than this come back in it


@dataclass(frozen=True, slots=True)
class StrategyDecision:
    strategy: str
    enable: bool
    text: str


@dataclass(frozen=True, slots=True)
class Alarm:
    strategy: str
    metric: str
    expected: float
    alert_below: float
    meaning: str


@dataclass(frozen=True, slots=True)
class Recommendation:
    strategies: tuple[str, ...]  # turned on, in layering order
    reasons: tuple[StrategyDecision, ...]
    prefix_scope: tuple[str, ...]  # tenants where KV reuse pays, when not all of them
    advice: tuple[str, ...]
    alarms: tuple[Alarm, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategies": list(self.strategies),
            "layering": " → ".join(self.strategies) if self.strategies else "none",
            "reasons": [
                {"strategy": r.strategy, "enable": r.enable, "text": r.text} for r in self.reasons
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


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.095 or x == 0 else f"{100 * x:.1f}%"


def recommend(
    analysis: Analysis, *, semantic_off: str | None = None, rules: RecommendRules | None = None
) -> Recommendation:
    r = rules or RecommendRules()
    reasons = [_exact(analysis, r), _semantic(analysis, r, semantic_off)]
    prefix_reason, scope = _prefix(analysis, r)
    reasons.append(prefix_reason)
    on = tuple(x.strategy for x in reasons if x.enable)
    return Recommendation(
        strategies=on,
        reasons=tuple(reasons),
        prefix_scope=scope,
        advice=tuple(_advice(analysis, r)),
        alarms=tuple(_alarms(analysis, r, on)),
    )


def _census_share(analysis: Analysis, cls: Class) -> float:
    total = analysis.census.total
    return total.classes[cls] / total.requests if total.requests else 0.0


def _exact(analysis: Analysis, r: RecommendRules) -> StrategyDecision:
    repeats = _census_share(analysis, Class.EXACT_REPEAT)
    fig = strategy(analysis.replays["layered"], "exact") if "layered" in analysis.replays else {}
    if not fig.get("available"):
        return StrategyDecision(
            "exact",
            False,
            f"{_pct(repeats)} of the prompts repeat exactly, but this log has no request "
            "bodies to replay an exact cache with: log full requests to decide",
        )
    served, completion = fig["request_share"], fig["completion_token_share"]
    ttl = analysis.options.ttl_s
    if served >= r.min_exact_request_share:
        return StrategyDecision(
            "exact",
            True,
            f"{_pct(repeats)} exact repeats → the exact cache (TTL {ttl:g} s) answers "
            f"{_pct(served)} of requests and saves {_pct(completion)} of completion tokens",
        )
    return StrategyDecision(
        "exact",
        False,
        f"{_pct(repeats)} exact repeats → an exact cache would answer only {_pct(served)} of "
        "requests: not worth running",
    )


def _semantic(analysis: Analysis, r: RecommendRules, off: str | None) -> StrategyDecision:
    """Decided on the census: near-duplicates are what only a semantic layer can answer. The
    replay's semantic hits also include repeats whose own exact entry had expired while a
    reworded one had not; a longer TTL gets those without the risk."""
    run = analysis.semantic
    if run is None:
        return StrategyDecision(
            "semantic", False, f"not measured: {off or 'no calibrated threshold'}"
        )
    near = _census_share(analysis, Class.NEAR_DUPLICATE)
    fig = strategy(analysis.replays["layered"], "semantic") if "layered" in analysis.replays else {}
    replayed = fig.get("request_share", 0.0) if fig.get("available") else 0.0
    at = f"at the calibrated threshold {run.threshold:g}"
    also = f" (in the replay it answered {_pct(replayed)} of requests after exact misses)"
    if near >= r.min_semantic_request_share:
        return StrategyDecision(
            "semantic",
            True,
            f"near-duplicates add {_pct(near)} of requests beyond exact repeats {at}{also} → "
            "semantic cache; keep live verification on to hold its false-hit rate",
        )
    return StrategyDecision(
        "semantic",
        False,
        f"near-duplicates add {_pct(near)} {at}{also} → semantic not worth its risk",
    )


def _prefix(analysis: Analysis, r: RecommendRules) -> tuple[StrategyDecision, tuple[str, ...]]:
    total = analysis.census.total
    share = total.reused_tokens / total.prompt_tokens if total.prompt_tokens else 0.0
    groups = {n: t for n, t in analysis.census.by_tenant.items() if t.prompt_tokens}
    tenants = {name: t.prefix_token_share for name, t in groups.items()}
    paying = sorted(
        name
        for name, t in groups.items()
        if t.prefix_token_share >= r.min_prefix_token_share
        and t.long_prefix >= r.min_long_prefix_share * t.requests
    )
    fig = strategy(analysis.replays["prefix"], "prefix") if "prefix" in analysis.replays else {}
    at_budget = ""
    if fig.get("available"):
        budget = analysis.options.prefix_capacity_tokens
        at_budget = (
            f"; with a {budget:,}-token KV budget the replay reuses "
            f"{_pct(fig['token_hit_rate'])} of prompt tokens"
        )
    if not paying:
        return StrategyDecision("prefix", False, _prefix_off(analysis, share, r)), ()
    scope: tuple[str, ...] = ()
    where = ""
    if len(paying) < len(tenants):
        scope = tuple(paying)
        skipped = sorted(set(tenants) - set(paying))
        where = (
            f"; only where prefixes are shared: tenant(s) {_names(paying, tenants)}, not "
            f"{_names(skipped, tenants)}"
        )
    return StrategyDecision(
        "prefix",
        True,
        f"{_pct(share)} of prompt tokens sit in shared prefixes → KV reuse{where}{at_budget}",
    ), scope


def _prefix_off(analysis: Analysis, share: float, r: RecommendRules) -> str:
    text = (
        f"only {_pct(share)} of prompt tokens sit in shared prefixes → KV reuse would save little"
    )
    total = analysis.census.total.prompt_tokens
    lost = sum(b.tokens_lost for b in analysis.breakers)
    if total and analysis.breakers and share + lost / total >= r.min_prefix_token_share:
        top = analysis.breakers[0]
        text += (
            f" as prompts are laid out now; moving the {top.kind} in the {top.role} message to "
            f"the end would raise that to {_pct(min(1.0, share + lost / total))} → fix the "
            "layout first, then turn on KV reuse"
        )
    return text


def _names(names: list[str], shares: dict[str, float]) -> str:
    shown = [f"{n or '(none)'} ({_pct(shares[n])})" for n in names[:5]]
    return ", ".join(shown) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _advice(analysis: Analysis, r: RecommendRules) -> list[str]:
    out: list[str] = []
    ttl = analysis.options.ttl_s
    repeats = analysis.census.total.classes[Class.EXACT_REPEAT]
    bins = analysis.census.distances[Class.EXACT_REPEAT]
    timed = sum(bins.counts)
    if timed and analysis.census.within_ttl[Class.EXACT_REPEAT] < r.ttl_coverage * timed:
        running, better = 0, None
        for bound, count in zip(DISTANCE_BOUNDS_S, bins.counts, strict=False):
            running += count
            if running >= 0.9 * timed:
                better = bound
                break
        covered = analysis.census.within_ttl[Class.EXACT_REPEAT] / timed
        hint = f"; a TTL of {better:g} s would cover 90%" if better is not None else ""
        out.append(
            f"only {_pct(covered)} of the {repeats} exact repeats come back within the "
            f"{ttl:g} s TTL{hint} (if the answers stay valid that long)"
        )
    for b in analysis.breakers[:3]:
        who = f"tenant {b.tenant!r}, model {b.model!r}" if b.tenant else f"model {b.model!r}"
        out.append(
            f"prefix breaker ({who}): the {b.role} message varies at character "
            f"{b.break_char} with a {b.kind} ({', '.join(repr(e) for e in b.examples[:2])}); "
            f"moving it to the end would let {b.requests} requests reuse {b.tail_tokens} more "
            "tokens each"
        )
    not_cacheable = analysis.census.not_cacheable
    total = analysis.census.total.requests
    for why, n in not_cacheable.most_common():
        if n / total >= 0.1:
            out.append(
                f"{_pct(n / total)} of requests are not cacheable ({why}); if they do not "
                "need a fresh sample, send temperature 0 or a seed"
                if why.startswith("sampled")
                else f"{_pct(n / total)} of requests are not cacheable ({why})"
            )
    out += _capacity_advice(analysis)
    return out


def _capacity_advice(analysis: Analysis) -> list[str]:
    out = []
    replays = analysis.replays
    total = analysis.census.total
    unbounded = total.reused_tokens / total.prompt_tokens if total.prompt_tokens else 0.0
    alone = strategy(replays["prefix"], "prefix") if "prefix" in replays else {}
    if alone.get("available") and alone["token_hit_rate"] < 0.8 * unbounded:
        out.append(
            f"with a {analysis.options.prefix_capacity_tokens:,}-token KV budget the replay "
            f"reuses {_pct(alone['token_hit_rate'])} of prompt tokens against "
            f"{_pct(unbounded)} with no bound: a larger KV budget pays (see --sweep)"
        )
    exact_now, exact_big = replays.get("exact_capacity:1"), replays.get("exact_capacity:4")
    if exact_now is not None and exact_big is not None:
        now, big = (strategy(x, "exact").get("request_share", 0.0) for x in (exact_now, exact_big))
        if big - now >= 0.02:
            out.append(
                f"a 4× larger exact store would answer {_pct(big)} instead of {_pct(now)} of "
                "requests"
            )
    prefix_now, prefix_big = replays.get("prefix_capacity:1"), replays.get("prefix_capacity:4")
    if prefix_now is not None and prefix_big is not None:
        now, big = (
            strategy(x, "prefix").get("token_hit_rate", 0.0) for x in (prefix_now, prefix_big)
        )
        if big - now >= 0.02:
            out.append(
                f"a 4× larger KV budget would reuse {_pct(big)} instead of {_pct(now)} of "
                "prompt tokens"
            )
    return out


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


def _alarms(analysis: Analysis, r: RecommendRules, on: tuple[str, ...]) -> list[Alarm]:
    alarms = []
    for name in on:
        replay = analysis.replays.get("prefix" if name == "prefix" else "layered")
        if replay is None:
            continue
        fig = strategy(replay, name)
        if not fig.get("available"):
            continue
        metric = "token_hit_rate" if name == "prefix" else "hit_rate"
        expected = float(fig[metric])
        alarms.append(
            Alarm(
                name,
                metric,
                expected,
                r.alarm_fraction * expected,
                f"alert when the {name} {metric.replace('_', ' ')} stays under "
                f"{_pct(r.alarm_fraction * expected)} (measured here: {_pct(expected)}): "
                + _MEANING[name],
            )
        )
    return alarms
