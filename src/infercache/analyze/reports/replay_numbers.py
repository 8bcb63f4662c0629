"""The replay's numbers in the report's shape: per strategy, and layered.

Per strategy (`exact`, `semantic`, `prefix`): the strategy's own `Metrics` snapshot (hits,
lookups, misses by reason, what its hits saved), plus shares of what the replayed traffic would
cost with no cache at all: `request_share` (hits / requests), `prompt_token_share`,
`completion_token_share`, `upstream_share`, `money_share`; for the answer caches the age
distribution of what they served (staleness exposure); for prefix reuse the prefill seconds
saved and the mean time-to-first-token cut per request reaching the engine. Seconds come from
the replay's ledgers priced by the analysis's cost model (cost_model.py). `exact` and
`semantic` come from the layered replay (exact is on top, so that is also exact alone;
semantic is what it adds below exact); `prefix` from the replay with KV reuse alone.
`layered` sums the layered replay.
"""

from __future__ import annotations

from infercache.analyze.census import Bins
from infercache.analyze.cost_model import CostModel
from infercache.analyze.replay import ANSWER_LAYERS, ReplayResult
from infercache.analyze.replay_figures import (
    AgeFigures,
    LayeredFigures,
    Strategy,
    StrategyFigures,
    TotalsWithoutCache,
    Unavailable,
)


def _share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def _percentile(bins: Bins, q: float) -> float | None:
    """Upper bound of the bucket holding the q-quantile (None when empty)."""
    total = sum(bins.counts)
    if not total:
        return None
    running = 0
    for bound, count in zip([*bins.bounds, float("inf")], bins.counts, strict=True):
        running += count
        if running >= q * total:
            return bound
    return None


def ages(result: ReplayResult, layer: str) -> AgeFigures:
    bins = result.ages[layer]
    return AgeFigures(
        bounds=tuple(bins.bounds),
        counts=tuple(bins.counts),
        p50_s_at_most=_percentile(bins, 0.5),
        p90_s_at_most=_percentile(bins, 0.9),
        max_s=result.max_age_s[layer] if sum(bins.counts) else None,
    )


def strategy(result: ReplayResult, name: str, cost: CostModel) -> Strategy:
    snap = result.strategies.get(name)
    t = result.totals
    if snap is None or not snap["lookups"]:
        return Unavailable()
    money = snap["money_saved_usd"]
    total_s = t.seconds.total_s(cost)
    saved_s = result.seconds_saved[name].total_s(cost)
    prefix = name == "prefix"
    return StrategyFigures(
        lookups=snap["lookups"],
        hits=snap["hits"],
        hit_rate=snap["hit_rate"],
        request_share=_share(snap["hits"], t.requests),
        misses=snap["misses"],
        prompt_tokens_saved=snap["prompt_tokens_saved"],
        prompt_token_share=_share(snap["prompt_tokens_saved"], t.prompt_tokens),
        completion_tokens_saved=snap["completion_tokens_saved"],
        completion_token_share=_share(snap["completion_tokens_saved"], t.completion_tokens),
        upstream_s_saved=saved_s,
        upstream_share=_share(saved_s, total_s),
        money_saved_usd=money,
        money_share=_share(money, t.cost_usd),
        counters=snap["counters"],
        gauges=snap["gauges"],
        # reused / prompt tokens reaching it
        token_hit_rate=snap["token_hit_rate"] if prefix else None,
        prompt_tokens_seen=snap["prompt_tokens_seen"] if prefix else None,
        ttft_saved_ms_mean=1000 * saved_s / snap["lookups"] if prefix else None,
        age_s=ages(result, name) if name in ANSWER_LAYERS else None,
    )


def layered(result: ReplayResult, cost: CostModel) -> LayeredFigures:
    t = result.totals
    parts = {name: strategy(result, name, cost) for name in (*ANSWER_LAYERS, "prefix")}
    live = [p for p in parts.values() if isinstance(p, StrategyFigures)]
    prompt = float(sum(p.prompt_tokens_saved for p in live))
    completion = float(sum(p.completion_tokens_saved for p in live))
    saved_s = float(sum(p.upstream_s_saved for p in live))
    money = float(sum(p.money_saved_usd for p in live))
    answered = sum(result.served.values())
    total_s = t.seconds.total_s(cost)
    return LayeredFigures(
        requests=t.requests,
        answered_by={k: result.served.get(k, 0) for k in ANSWER_LAYERS},
        hit_rate=_share(answered, t.requests),
        prefix_under_caches=parts["prefix"],
        prompt_tokens_saved=prompt,
        prompt_token_share=_share(prompt, t.prompt_tokens),
        completion_tokens_saved=completion,
        completion_token_share=_share(completion, t.completion_tokens),
        upstream_s_saved=saved_s,
        upstream_share=_share(saved_s, total_s),
        money_saved_usd=money,
        money_share=_share(money, t.cost_usd),
        totals_without_cache=TotalsWithoutCache(
            prompt_tokens=t.prompt_tokens,
            completion_tokens=t.completion_tokens,
            upstream_s=total_s,
            cost_usd=t.cost_usd,
            upstream_s_estimated_for=t.seconds.estimated_calls,
            completion_tokens_unknown_for=t.completion_unknown,
        ),
        skipped=dict(result.skipped),
    )
