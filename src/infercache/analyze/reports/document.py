"""The analysis as one JSON-able dict: what `--format json` prints and the other formats render.

Top-level keys (schema `infercache.analyze/1`):
    requests                 requests analysed
    census                   {exact_repeat, near_duplicate, shared_prefix, unique}: shares, sum 1
    census_counts            the same as counts
    prefix_token_share       prompt tokens an unbounded prefix cache reuses / all prompt tokens
    prompt_tokens            prompt tokens of requests whose prompt is known
    not_cacheable            {share, count, reasons{why: count}}
    breakdown                {tenant{name: figures}, model{name: figures}}
    reuse_distance_s         {bounds, <class>: counts, within_ttl{<class>: share}, ttl_s}
    prefix_share_histogram   per-request reused share: {bounds, counts}
    prefix_breakers          [{tenant, model, role, kind, break_char, break_tokens,
                               tail_tokens, requests, tokens_lost, token_share_lost, examples,
                               context}]
    simulation               {exact, semantic, prefix, layered} (replay_numbers.py)
    sweeps                   {ttl[...], exact_capacity[...], prefix_capacity[...]} or null
    recommendation           {strategies, layering, reasons, prefix_scope, advice, alarms}
    inputs, settings, semantic, observed_layers, notes, timing
"""

from __future__ import annotations

from typing import Any

from infercache.analyze.analysis import Analysis
from infercache.analyze.census import Class
from infercache.analyze.recommend import Recommendation
from infercache.analyze.reports.replay_numbers import layered, strategy

SCHEMA = "infercache.analyze/1"


def build_report(
    analysis: Analysis, recommendation: Recommendation, *, semantic_off: str | None = None
) -> dict[str, Any]:
    c = analysis.census
    total = c.total
    n = total.requests
    return {
        "schema": SCHEMA,
        "requests": n,
        "census": {cls.value: total.classes[cls] / n for cls in Class},
        "census_counts": {cls.value: total.classes[cls] for cls in Class},
        "prefix_token_share": total.reused_tokens / total.prompt_tokens
        if total.prompt_tokens
        else 0.0,
        "prompt_tokens": total.prompt_tokens,
        "not_cacheable": {
            "share": total.not_cacheable / n,
            "count": total.not_cacheable,
            "reasons": dict(c.not_cacheable.most_common()),
        },
        "breakdown": {
            "tenant": {name: t.to_dict() for name, t in sorted(c.by_tenant.items())},
            "model": {name: t.to_dict() for name, t in sorted(c.by_model.items())},
        },
        "reuse_distance_s": _distances(analysis),
        "prefix_share_histogram": c.reused_share.to_dict(),
        "prefix_breakers": _breakers(analysis),
        "simulation": _simulation(analysis),
        "sweeps": _sweeps(analysis) if analysis.options.sweep else None,
        "recommendation": recommendation.to_dict(),
        "inputs": _inputs(analysis),
        "settings": _settings(analysis),
        "semantic": _semantic(analysis, semantic_off),
        "observed_layers": dict(c.layers.most_common()),
        "notes": notes(analysis, semantic_off),
        "timing": {"wall_s": analysis.wall_s},
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


def _simulation(analysis: Analysis) -> dict[str, Any]:
    replays = analysis.replays
    if "layered" not in replays:
        return {}
    sim = {
        "exact": strategy(replays["layered"], "exact"),
        "semantic": strategy(replays["layered"], "semantic"),
        "prefix": strategy(replays["prefix"], "prefix"),
        "layered": layered(replays["layered"]),
    }
    if analysis.semantic is None:
        sim["semantic"] = {"available": False, "reason": "not measured"}
    return sim


def _sweeps(analysis: Analysis) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"ttl": [], "exact_capacity": [], "prefix_capacity": []}
    for name, replay in analysis.replays.items():
        kind, _, value = name.partition(":")
        if kind == "ttl":
            exact, sem = strategy(replay, "exact"), strategy(replay, "semantic")
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
                    "exact_hit_rate": strategy(replay, "exact").get("request_share"),
                }
            )
        elif kind == "prefix_capacity":
            out["prefix_capacity"].append(
                {
                    "factor": float(value),
                    "capacity_tokens": replay.setup.prefix_capacity_tokens,
                    "token_hit_rate": strategy(replay, "prefix").get("token_hit_rate"),
                }
            )
    for rows in out.values():
        rows.sort(key=lambda row: row.get("ttl_s") or row.get("factor") or 0.0)
    return out


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


def _settings(analysis: Analysis) -> dict[str, Any]:
    o = analysis.options
    return {
        "ttl_s": o.ttl_s,
        "capacity": {
            "exact_bytes": o.exact_capacity_bytes,
            "prefix_tokens": o.prefix_capacity_tokens,
            "semantic_vectors": o.semantic.max_vectors if o.semantic else None,
        },
        "min_prefix_tokens": o.min_prefix_tokens,
        "block_tokens": o.block_tokens,
        "share_prefix_across_tenants": o.share_prefix_across_tenants,
        "tokenizer": analysis.tokenizer,
        "latency_model": {
            "overhead_s": o.latency.overhead_s,
            "prefill_tokens_per_s": o.latency.prefill_tokens_per_s,
            "decode_tokens_per_s": o.latency.decode_tokens_per_s,
        },
    }


def _semantic(analysis: Analysis, off: str | None) -> dict[str, Any]:
    run = analysis.semantic
    if run is None:
        return {"measured": False, "reason": off or "no calibrated threshold"}
    return {
        "measured": True,
        "threshold": run.threshold,
        "threshold_source": run.source,
        "embedder": run.embedder,
        "guards": list(run.guards),
        "texts_embedded": run.texts_embedded,
        "chars_embedded": run.chars_embedded,
        "embed_s": run.embed_s,
        "texts_per_s": run.texts_embedded / run.embed_s if run.embed_s else None,
    }


def notes(analysis: Analysis, semantic_off: str | None) -> list[str]:
    """Caveats a reader needs to weigh the figures."""
    c, out = analysis.census, []
    kinds = analysis.kinds
    if analysis.errors.count:
        out.append(f"{analysis.errors.count} malformed line(s) skipped (see inputs.malformed)")
    if c.timed < c.total.requests:
        out.append(
            f"{c.total.requests - c.timed} request(s) have no timestamp: they take the time of "
            "the line before them; TTL effects and reuse distances are not measured for them"
        )
    if kinds.get("redacted"):
        out.append(
            f"{kinds['redacted']} redacted line(s) carry only a digest of the whole body: "
            "counted for exact repeats (stricter than the exact key, so a lower bound) and as "
            "unique otherwise; not replayed"
        )
    if kinds.get("blocks"):
        out.append(
            "block-hash traces carry no request bodies: exact repeats are identical prompts "
            "(same hash_ids and length); exact and semantic caches cannot be replayed"
        )
    if analysis.tokenizer == "chars4":
        out.append("token counts are approximate (chars4: 4 bytes of UTF-8 a token)")
    if c.prefix_bounded:
        out.append(
            "the census prefix tree reached its memory bound: prefix figures are lower bounds"
        )
    if analysis.semantic is None:
        out.append(f"near-duplicates not measured: {semantic_off or 'no calibrated threshold'}")
    out += _replay_notes(analysis)
    return out


def _replay_notes(analysis: Analysis) -> list[str]:
    out: list[str] = []
    replay = analysis.replays.get("layered")
    if replay is None:
        return out
    t, o = replay.totals, analysis.options.latency
    if t.estimated_upstream:
        out.append(
            f"upstream seconds estimated for {t.estimated_upstream} request(s): "
            f"{o.overhead_s:g} s + prompt at {o.prefill_tokens_per_s:g} tok/s + completion at "
            f"{o.decode_tokens_per_s:g} tok/s"
        )
    if t.completion_unknown:
        out.append(f"completion tokens unknown for {t.completion_unknown} request(s): counted as 0")
    if not t.cost_usd:
        out.append("no prices given (--price or [prices] in --config): money figures are 0")
    return out
