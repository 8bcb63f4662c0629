"""The report's notes: the caveats a reader needs to weigh its figures (malformed lines, missing
timestamps, redacted or block-trace input, approximate token counts, bounded memory, the
near-duplicate calibration, where upstream time and money come from)."""

from __future__ import annotations

from infercache.analyze.analysis import Analysis
from infercache.analyze.log_reader import LineFormat


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
    if redacted := kinds.get(LineFormat.REDACTED.value):
        out.append(
            f"{redacted} redacted line(s): exact repeats from the key digest, "
            "prefix reuse from the chained prefix hashes; near-duplicates and prefix breakers "
            "cannot be measured without text"
        )
    if kinds.get(LineFormat.BLOCKS.value):
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
    run = analysis.semantic
    if run is None:
        out.append(f"near-duplicates not measured: {semantic_off or 'no calibrated threshold'}")
    elif run.label is not None and c.total.checked:  # a log without text measured none
        out.append(f"near-duplicates: {run.label}")
    out += _cost_notes(analysis)
    return out


def _cost_notes(analysis: Analysis) -> list[str]:
    out: list[str] = []
    replay = analysis.replays.get("layered")
    if replay is None:
        return out
    for model, m in sorted(analysis.cost.by_model.items()):
        out.append(f"upstream time of {model or '(no model)'}: {m.source}; {m.rates.describe()}")
    t = replay.totals
    if t.completion_unknown:
        out.append(f"completion tokens unknown for {t.completion_unknown} request(s): counted as 0")
    if not t.cost_usd:
        out.append(_unpriced(analysis))
    elif any(
        analysis.prices.price(m).cached_input_usd_per_mtok is None for m in analysis.cost.by_model
    ):
        out.append(
            "no cached-input price for some models (--price MODEL=IN,OUT,CACHED): prefix reuse "
            "is shown saving no money there, only time"
        )
    return out


def _unpriced(analysis: Analysis) -> str:
    """Why the money figures are 0: no prices at all, or prices only for other models."""
    priced = sorted(analysis.prices.by_model)
    logged = sorted(m or "(no model)" for m in analysis.cost.by_model)
    if not priced:
        return "no prices given (--price or [prices] in --config): money figures are 0"
    return (
        f"prices given for {', '.join(priced)}, but the log's requests are for "
        f"{', '.join(logged)}: money figures are 0 (--price MODEL=IN,OUT[,CACHED] for the log's "
        "models, or '*=IN,OUT[,CACHED]' for every model)"
    )
