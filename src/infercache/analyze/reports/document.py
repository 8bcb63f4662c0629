"""The analysis as one JSON-able dict: what `--format json` prints, what the other formats render,
and what the recommendation (recommend.py) is computed from, so every figure a reason quotes is
one the report shows.

Top-level keys (schema `infercache.analyze/2`):
    requests                 requests analysed
    census                   {exact_repeat, near_duplicate, shared_prefix, unique}: shares,
                             sum 1 (estimated from the sample when near-duplicates were sampled)
    census_counts            the classes as counted (a near-duplicate only when checked)
    prefix_token_share       prompt tokens an unbounded prefix cache reuses / all prompt tokens
    prompt_tokens            prompt tokens of requests whose prompt is known
    shared_prefix            {min_share, requests, mean_tokens, tokens_histogram}: the
                             `shared_prefix` class and how long its shared parts are
    near_duplicates          {measured, reason | label, share, interval, sample_rate, ...}
    not_cacheable            {share, count, reasons{why: count}}
    breakdown                {tenant{name: figures}, model{name: figures}}
    tenant_names             {tenant: the name to show}
    reuse_distance_s         {bounds, <class>: counts, within_ttl{<class>: share}, ttl_s}
    prefix_share_histogram   per-request reused share: {bounds, counts}
    prefix_breakers          [{tenant, model, role, kind, break_char, break_tokens,
                               tail_tokens, requests, tokens_lost, token_share_lost, examples,
                               context}]
    simulation               {exact, semantic, prefix, layered} (replay_numbers.py)
    kv_sweep                 {curve[{budget_tokens, token_share, hit_share}], knee, ...}
    sweeps                   {ttl[...], exact_capacity[...]} or null
    windows                  {by, rows[...]} or null
    cost_model               {profile, models{model: rates and where they come from}}
    recommendation           {strategies, layering, reasons, prefix_scope, advice, alarms}
    inputs, settings, observed_layers, notes, timing
"""

from __future__ import annotations

import datetime
from collections import Counter
from typing import Any

from infercache.analyze.analysis import Analysis
from infercache.analyze.census import Class, Tally
from infercache.analyze.log_reader import LineFormat
from infercache.analyze.recommend import recommend
from infercache.analyze.reports.notes import notes
from infercache.analyze.reports.replay_numbers import layered, strategy
from infercache.analyze.rules import RecommendRules

SCHEMA = "infercache.analyze/2"


def build_report(
    analysis: Analysis,
    *,
    semantic_off: str | None = None,
    rules: RecommendRules | None = None,
) -> dict[str, Any]:
    """The document, its recommendation computed from its own figures (recommend.py)."""
    report = figures(analysis, semantic_off=semantic_off)
    report["recommendation"] = recommend(report, rules).to_dict()
    return report


def figures(analysis: Analysis, *, semantic_off: str | None = None) -> dict[str, Any]:
    """The document without its recommendation."""
    c = analysis.census
    total = c.total
    n = total.requests
    shared = total.classes[Class.SHARED_PREFIX]
    return {
        "schema": SCHEMA,
        "requests": n,
        "census": total.shares(),
        "census_counts": {cls.value: total.classes[cls] for cls in Class},
        "census_estimated": not total.all_checked and c.near_duplicates_measured,
        "prefix_token_share": total.prefix_token_share,
        "prompt_tokens": total.prompt_tokens,
        "shared_prefix": {
            "min_share": analysis.options.min_prefix_share,
            "requests": shared,
            "mean_tokens": total.shared_tokens / shared if shared else None,
            "tokens_histogram": c.shared_tokens.to_dict(),
        },
        "near_duplicates": _near_duplicates(analysis, semantic_off),
        "not_cacheable": {
            "share": total.not_cacheable / n,
            "count": total.not_cacheable,
            "reasons": dict(c.not_cacheable.most_common()),
        },
        "breakdown": {
            "tenant": {name: _group(t) for name, t in sorted(c.by_tenant.items())},
            "model": {name: _group(t) for name, t in sorted(c.by_model.items())},
        },
        "tenant_names": {t: display_name(t, c.tenant_names) for t in sorted(c.by_tenant)},
        "reuse_distance_s": _distances(analysis),
        "prefix_share_histogram": c.reused_share.to_dict(),
        "prefix_breakers": _breakers(analysis),
        "prefix_breakers_summary": _breakers_summary(analysis),
        "simulation": _simulation(analysis),
        "kv_sweep": _kv_sweep(analysis),
        "sweeps": _sweeps(analysis) if analysis.options.sweep else None,
        "windows": _windows(analysis),
        "cost_model": _cost_model(analysis),
        "inputs": _inputs(analysis),
        "settings": _settings(analysis),
        "observed_layers": dict(c.layers.most_common()),
        "notes": notes(analysis, semantic_off),
        "timing": {"wall_s": analysis.wall_s},
    }


def display_name(tenant: str, configured: dict[str, str]) -> str:
    """The name to show for a tenant: its configured name when the log gives one; for an
    open-mode tenant narrowed by a claim (`key:<hash>/acme`), the claim with the key's head."""
    if tenant in configured:
        return configured[tenant]
    if tenant.startswith("key:") and "/" in tenant:
        base, _, claim = tenant.partition("/")
        return f"{claim} ({base[:12]}…)"
    return tenant or "(none)"


def _group(t: Tally) -> dict[str, Any]:
    out = t.to_dict()
    interval = t.near_interval()
    out["near_duplicate_interval"] = list(interval) if interval is not None else None
    return out


def _near_duplicates(analysis: Analysis, off: str | None) -> dict[str, Any]:
    run = analysis.semantic
    total = analysis.census.total
    if run is None:
        return {"measured": False, "reason": off or "no calibrated threshold"}
    if total.checked == 0 and total.non_exact > 0:
        return {
            "measured": False,
            "reason": "near-duplicates cannot be measured without text: this log has no "
            "request text (redacted lines or block-hash traces)",
        }
    interval = total.near_interval()
    return {
        "measured": True,
        "label": run.label,
        "share": total.shares()[Class.NEAR_DUPLICATE.value],
        "interval": list(interval) if interval is not None else None,
        "confidence": 0.95,
        "estimated": not total.all_checked,
        "sample_rate": run.sample_rate,
        "checked": total.checked,
        "near_duplicates_found": total.near,
        "threshold": run.threshold,
        "threshold_source": run.source,
        "embedder": run.embedder,
        "guards": list(run.guards),
        "candidate_stage": None
        if run.candidate_embedder is None
        else {"embedder": run.candidate_embedder, "min_word_jaccard": run.min_word_jaccard},
        "texts_embedded": run.texts_embedded,
        "candidate_texts_embedded": run.candidate_texts_embedded,
        "chars_embedded": run.chars_embedded,
        "embed_s": run.embed_s,
        "texts_per_s": run.texts_embedded / run.embed_s if run.embed_s else None,
        "replayed": run.replayed,
    }


def _distances(analysis: Analysis) -> dict[str, Any]:
    c = analysis.census
    out: dict[str, Any] = {"bounds": list(c.distances[Class.EXACT_REPEAT].bounds)}
    within: dict[str, float | None] = {}
    for cls, bins in c.distances.items():
        out[cls.value] = list(bins.counts)
        counted = sum(bins.counts)
        within[cls.value] = c.within_ttl[cls] / counted if counted else None
    out["within_ttl"] = within
    out["ttl_s"] = analysis.options.ttl_s
    return out


def _breakers(analysis: Analysis) -> list[dict[str, Any]]:
    prompt_tokens = analysis.census.total.prompt_tokens
    return [
        {
            "tenant": b.tenant,
            "model": b.model,
            "role": b.role,
            "kind": b.kind,
            "break_char": b.break_char,
            "break_tokens": b.break_tokens,
            "tail_tokens": b.tail_tokens,
            "requests": b.requests,
            "tokens_lost": b.tokens_lost,
            "token_share_lost": b.tokens_lost / prompt_tokens if prompt_tokens else 0.0,
            "examples": list(b.examples),
            "context": b.context,
        }
        for b in analysis.breakers
    ]


def _breakers_summary(analysis: Analysis) -> dict[str, float]:
    """What fixing every breaker's layout would give: the prefix share plus what they lose."""
    total = analysis.census.total
    lost = sum(b.tokens_lost for b in analysis.breakers)
    lost_share = lost / total.prompt_tokens if total.prompt_tokens else 0.0
    return {
        "token_share_lost": lost_share,
        "share_if_fixed": min(1.0, total.prefix_token_share + lost_share),
    }


def _simulation(analysis: Analysis) -> dict[str, Any]:
    replays, cost = analysis.replays, analysis.cost
    if "layered" not in replays:
        return {}
    sim = {
        "exact": strategy(replays["layered"], "exact", cost),
        "semantic": strategy(replays["layered"], "semantic", cost),
        "prefix": strategy(replays["prefix"], "prefix", cost),
        "layered": layered(replays["layered"], cost),
    }
    if analysis.semantic is None or not analysis.semantic.replayed:
        why = "not measured" if analysis.semantic is None else "not replayed"
        sim["semantic"] = {"available": False, "reason": why}
    return sim


def _kv_sweep(analysis: Analysis) -> dict[str, Any] | None:
    sweep = analysis.census.kv_sweep
    if sweep is None:
        return None
    curve = sweep.curve()
    knee = sweep.knee(curve)
    return {
        "curve": [
            {
                "budget_tokens": p.budget_tokens,
                "token_share": p.token_share,
                "hit_share": p.hit_share,
            }
            for p in curve
        ],
        "knee": None
        if knee is None
        else {"budget_tokens": knee.budget_tokens, "token_share": knee.token_share},
        "unbounded_token_share": analysis.census.total.prefix_token_share,
        "working_set_tokens": analysis.census.prefix.cached_tokens,
        "bounded_by_census_memory": analysis.census.prefix_bounded,
    }


def _sweeps(analysis: Analysis) -> dict[str, list[dict[str, Any]]]:
    cost = analysis.cost
    out: dict[str, list[dict[str, Any]]] = {"ttl": [], "exact_capacity": []}
    for name, replay in analysis.replays.items():
        kind, _, value = name.partition(":")
        if kind == "ttl":
            exact, sem = strategy(replay, "exact", cost), strategy(replay, "semantic", cost)
            out["ttl"].append(
                {
                    "ttl_s": replay.setup.ttl_s,
                    "exact_hit_rate": exact.get("request_share"),
                    "semantic_hit_rate": sem.get("request_share"),
                }
            )
        elif kind == "exact_capacity":
            out["exact_capacity"].append(
                {
                    "factor": float(value),
                    "capacity_bytes": replay.setup.exact_capacity_bytes,
                    "exact_hit_rate": strategy(replay, "exact", cost).get("request_share"),
                }
            )
    for rows in out.values():
        rows.sort(key=lambda row: row.get("ttl_s") or row.get("factor") or 0.0)
    return out


def _windows(analysis: Analysis) -> dict[str, Any] | None:
    width = analysis.options.window_s
    if width is None:
        return None
    layered_windows = analysis.replays["layered"].by_window if "layered" in analysis.replays else {}
    rows = []
    for index, tally in sorted(analysis.census.by_window.items()):
        replayed = layered_windows.get(index) or Counter()
        requests, seen = replayed["requests"], replayed["prefix_seen"]
        start = datetime.datetime.fromtimestamp(index * width, datetime.UTC)
        rows.append(
            {
                "start_s": index * width,
                "start": start.isoformat(timespec="minutes"),
                "requests": tally.requests,
                "census": tally.shares(),
                "prefix_token_share": tally.prefix_token_share,
                "exact_hit_rate": replayed["exact"] / requests if requests else None,
                "semantic_hit_rate": replayed["semantic"] / requests if requests else None,
                "prefix_token_hit_rate": replayed["prefix_reused"] / seen if seen else None,
            }
        )
    return {"by": analysis.options.by, "window_s": width, "rows": rows}


def _cost_model(analysis: Analysis) -> dict[str, Any]:
    cost = analysis.cost
    profile = cost.profile.rates
    return {
        "profile": "auto" if profile is None else profile.name,
        "models": {
            model: {
                "source": m.source,
                "fitted": m.fitted,
                "timed_records": m.timed_records,
                "rates": m.rates.name,
                "overhead_s": m.rates.overhead_s,
                "prefill_tokens_per_s": m.rates.prefill_tokens_per_s,
                "decode_tokens_per_s": m.rates.decode_tokens_per_s,
            }
            for model, m in sorted(cost.by_model.items())
        },
    }


def _inputs(analysis: Analysis) -> dict[str, Any]:
    e = analysis.errors
    c = analysis.census
    return {
        "files": analysis.files,
        "lines": analysis.lines,
        "formats": dict(analysis.kinds.most_common()),
        "malformed": {
            "count": e.count,
            "lines": [{"file": f, "line": line, "error": why} for f, line, why in e.kept],
        },
        "out_of_order": e.out_of_order,
        "timestamps": c.timed,
        "first_timestamp_s": c.first_s,
        "span_s": None if c.first_s is None or c.last_s is None else c.last_s - c.first_s,
    }


def tokenizer_of(analysis: Analysis) -> str | None:
    """What counted the tokens: the analysis's tokenizer, the one behind a redacted log's
    hashes, or the block size of a block trace."""
    names = []
    if analysis.tokenizer is not None:
        names.append(analysis.tokenizer)
    names += [f"{name} (the redacted log's prefix hashes)" for name in analysis.hashed_by]
    if analysis.kinds.get(LineFormat.BLOCKS.value):
        names.append(f"block-hash trace, {analysis.options.block_tokens} tokens a block")
    return "; ".join(names) or None


def _settings(analysis: Analysis) -> dict[str, Any]:
    o = analysis.options
    prices = analysis.replays["layered"].totals.cost_usd if "layered" in analysis.replays else 0
    return {
        "ttl_s": o.ttl_s,
        "capacity": {
            "exact_bytes": o.exact_capacity_bytes,
            "prefix_tokens": o.prefix_capacity_tokens,
            "semantic_vectors": o.semantic.max_vectors if o.semantic else None,
        },
        "min_prefix_share": o.min_prefix_share,
        "block_tokens": o.block_tokens,
        "share_prefix_across_tenants": o.share_prefix_across_tenants,
        "tokenizer": tokenizer_of(analysis),
        "calibration": _calibration(analysis),
        "priced": bool(prices),
    }


def _calibration(analysis: Analysis) -> str:
    run = analysis.semantic
    if run is None:
        return "none (near-duplicates not measured)"
    if run.label is not None:
        return f"{run.label}: threshold {run.threshold:g} ({run.embedder.split(';')[0]})"
    return f"threshold {run.threshold:g} from {run.source}"
