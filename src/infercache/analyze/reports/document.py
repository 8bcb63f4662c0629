"""The analysis as a report: its figures as a frozen tree (report_tree.py), and the
recommendation (recommend.py) computed from those figures, so every figure a reason quotes is
one the report shows. `build_report(analysis)` gives the `Report` the text, HTML, plot and
alert renderers read; `Report.to_dict()` is the JSON document `--format json` prints (its
keys: report_tree.py).
"""

from __future__ import annotations

import datetime
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any

from infercache.analyze.analysis import Analysis
from infercache.analyze.census import Bins, Class, Tally
from infercache.analyze.log_reader import LineFormat
from infercache.analyze.recommend import Recommendation, recommend
from infercache.analyze.replay_figures import (
    CapacityRow,
    KvDiskPoint,
    KvKnee,
    KvSweepFigures,
    SimulationFigures,
    StrategyFigures,
    SweepFigures,
    TtlRow,
    Unavailable,
)
from infercache.analyze.report_json import to_json
from infercache.analyze.report_tree import (
    SCHEMA,
    Breakdown,
    BreakerRow,
    BreakersSummary,
    CandidateStageFigures,
    Capacity,
    ClassShares,
    CostModelFigures,
    Figures,
    GroupFigures,
    Histogram,
    InputFigures,
    MalformedFigures,
    MalformedLineFigures,
    ModelRatesFigures,
    NearDuplicateFigures,
    NearDuplicatesUnmeasured,
    NotCacheableFigures,
    ReportSettings,
    ReuseDistances,
    SharedPrefixFigures,
    TimingFigures,
    WindowFigures,
    WindowRow,
)
from infercache.analyze.reports.notes import notes
from infercache.analyze.reports.replay_numbers import layered, strategy
from infercache.analyze.rules import RecommendRules


@dataclass(frozen=True, slots=True)
class Report:
    """What every renderer reads: the figures and the recommendation made from them."""

    figures: Figures
    recommendation: Recommendation

    def to_dict(self) -> dict[str, Any]:
        """The JSON document (`--format json`): the figures, then `recommendation`."""
        out: dict[str, Any] = to_json(self.figures)
        if self.figures.simulation is None:
            out["simulation"] = {}  # no replay: an empty section, as the schema always had
        out["recommendation"] = self.recommendation.to_dict()
        return out


def build_report(
    analysis: Analysis,
    *,
    semantic_off: str | None = None,
    rules: RecommendRules | None = None,
) -> Report:
    """The report, its recommendation computed from its own figures (recommend.py)."""
    found = figures(analysis, semantic_off=semantic_off)
    return Report(found, recommend(found, rules))


def figures(analysis: Analysis, *, semantic_off: str | None = None) -> Figures:
    """The report's figures, without its recommendation."""
    c = analysis.census
    total = c.total
    n = total.requests
    shared = total.classes[Class.SHARED_PREFIX]
    return Figures(
        schema=SCHEMA,
        requests=n,
        census=ClassShares.of(total.shares()),
        census_counts=ClassShares.of({cls.value: total.classes[cls] for cls in Class}),
        census_estimated=not total.all_checked and c.near_duplicates_measured,
        prefix_token_share=total.prefix_token_share,
        prompt_tokens=total.prompt_tokens,
        shared_prefix=SharedPrefixFigures(
            min_share=analysis.options.min_prefix_share,
            requests=shared,
            mean_tokens=total.shared_tokens / shared if shared else None,
            tokens_histogram=_histogram(c.shared_tokens),
        ),
        near_duplicates=_near_duplicates(analysis, semantic_off),
        not_cacheable=NotCacheableFigures(
            share=total.not_cacheable / n,
            count=total.not_cacheable,
            reasons=dict(c.not_cacheable.most_common()),
        ),
        breakdown=Breakdown(
            tenant={name: _group(t) for name, t in sorted(c.by_tenant.items())},
            model={name: _group(t) for name, t in sorted(c.by_model.items())},
        ),
        tenant_names={t: display_name(t, c.tenant_names) for t in sorted(c.by_tenant)},
        reuse_distance_s=_distances(analysis),
        prefix_share_histogram=_histogram(c.reused_share),
        prefix_breakers=_breakers(analysis),
        prefix_breakers_summary=_breakers_summary(analysis),
        simulation=_simulation(analysis),
        kv_sweep=_kv_sweep(analysis),
        sweeps=_sweeps(analysis) if analysis.options.sweep else None,
        windows=_windows(analysis),
        cost_model=_cost_model(analysis),
        provider_prompt_cache=analysis.prompt_caches.section(),
        inputs=_inputs(analysis),
        settings=_settings(analysis),
        observed_layers=dict(c.layers.most_common()),
        notes=tuple(notes(analysis, semantic_off)),
        timing=TimingFigures(wall_s=analysis.wall_s),
    )


def display_name(tenant: str, configured: dict[str, str]) -> str:
    """The name to show for a tenant: its configured name when the log gives one; for an
    open-mode tenant narrowed by a claim (`key:<hash>/acme`), the claim with the key's head."""
    if tenant in configured:
        return configured[tenant]
    if tenant.startswith("key:") and "/" in tenant:
        base, _, claim = tenant.partition("/")
        return f"{claim} ({base[:12]}…)"
    return tenant or "(none)"


def _histogram(bins: Bins) -> Histogram:
    return Histogram(tuple(bins.bounds), tuple(bins.counts))


def _group(t: Tally) -> GroupFigures:
    shared = t.classes[Class.SHARED_PREFIX]
    return GroupFigures(
        requests=t.requests,
        census=ClassShares.of(t.shares()),
        prompt_tokens=t.prompt_tokens,
        prefix_token_share=t.prefix_token_share,
        shared_prefix_mean_tokens=t.shared_tokens / shared if shared else None,
        not_cacheable_share=t.not_cacheable / (t.requests or 1),
        near_duplicate_interval=t.near_interval(),
    )


def _near_duplicates(
    analysis: Analysis, off: str | None
) -> NearDuplicateFigures | NearDuplicatesUnmeasured:
    run = analysis.semantic
    total = analysis.census.total
    if run is None:
        return NearDuplicatesUnmeasured(off or "no calibrated threshold")
    if total.checked == 0 and total.non_exact > 0:
        return NearDuplicatesUnmeasured(
            "near-duplicates cannot be measured without text: this log has no "
            "request text (redacted lines or block-hash traces)"
        )
    return NearDuplicateFigures(
        label=run.label,
        share=total.shares()[Class.NEAR_DUPLICATE.value],
        interval=total.near_interval(),
        confidence=0.95,
        estimated=not total.all_checked,
        sample_rate=run.sample_rate,
        checked=total.checked,
        near_duplicates_found=total.near,
        threshold=run.threshold,
        threshold_source=run.source,
        embedder=run.embedder,
        guards=tuple(run.guards),
        candidate_stage=None
        if run.candidate_embedder is None
        else CandidateStageFigures(run.candidate_embedder, run.min_word_jaccard),
        texts_embedded=run.texts_embedded,
        candidate_texts_embedded=run.candidate_texts_embedded,
        chars_embedded=run.chars_embedded,
        embed_s=run.embed_s,
        texts_per_s=run.texts_embedded / run.embed_s if run.embed_s else None,
        replayed=run.replayed,
    )


def _distances(analysis: Analysis) -> ReuseDistances:
    c = analysis.census
    counts = {cls.value: tuple(bins.counts) for cls, bins in c.distances.items()}
    within: dict[str, float | None] = {}
    for cls, bins in c.distances.items():
        counted = sum(bins.counts)
        within[cls.value] = c.within_ttl[cls] / counted if counted else None
    return ReuseDistances(
        bounds=tuple(c.distances[Class.EXACT_REPEAT].bounds),
        exact_repeat=counts[Class.EXACT_REPEAT.value],
        near_duplicate=counts[Class.NEAR_DUPLICATE.value],
        shared_prefix=counts[Class.SHARED_PREFIX.value],
        within_ttl=within,
        ttl_s=analysis.options.ttl_s,
    )


def _breakers(analysis: Analysis) -> tuple[BreakerRow, ...]:
    """Each breaker's row: its own figures by name, and the share of all prompt tokens it loses."""
    prompt_tokens = analysis.census.total.prompt_tokens
    own = [f.name for f in fields(BreakerRow) if f.name not in ("examples", "token_share_lost")]
    return tuple(
        BreakerRow(
            **{name: getattr(b, name) for name in own},
            examples=tuple(b.examples),
            token_share_lost=b.tokens_lost / prompt_tokens if prompt_tokens else 0.0,
        )
        for b in analysis.breakers
    )


def _breakers_summary(analysis: Analysis) -> BreakersSummary:
    """What fixing every breaker's layout would give: the prefix share plus what they lose."""
    total = analysis.census.total
    lost = sum(b.tokens_lost for b in analysis.breakers)
    lost_share = lost / total.prompt_tokens if total.prompt_tokens else 0.0
    return BreakersSummary(lost_share, min(1.0, total.prefix_token_share + lost_share))


def _simulation(analysis: Analysis) -> SimulationFigures | None:
    replays, cost = analysis.replays, analysis.cost
    if "layered" not in replays:
        return None
    semantic = strategy(replays["layered"], "semantic", cost)
    if analysis.semantic is None or not analysis.semantic.replayed:
        semantic = Unavailable("not measured" if analysis.semantic is None else "not replayed")
    return SimulationFigures(
        exact=strategy(replays["layered"], "exact", cost),
        semantic=semantic,
        prefix=strategy(replays["prefix"], "prefix", cost),
        layered=layered(replays["layered"], cost),
    )


def _kv_sweep(analysis: Analysis) -> KvSweepFigures | None:
    sweep = analysis.census.kv_sweep
    if sweep is None:
        return None
    curve = sweep.curve()
    knee = sweep.knee(curve)
    return KvSweepFigures(
        curve=tuple(curve),
        knee=None if knee is None else KvKnee(knee.budget_tokens, knee.token_share),
        unbounded_token_share=analysis.census.total.prefix_token_share,
        working_set_tokens=analysis.census.prefix.cached_tokens,
        bounded_by_census_memory=analysis.census.prefix_bounded,
        disk_tokens=(disk := analysis.options.kv_disk_tokens),
        with_disk=tuple(KvDiskPoint.of(p) for p in sweep.with_disk(disk, curve)),
    )


def _request_share(figures: StrategyFigures | Unavailable) -> float | None:
    return figures.request_share if isinstance(figures, StrategyFigures) else None


def _sweeps(analysis: Analysis) -> SweepFigures:
    cost = analysis.cost
    ttl: list[TtlRow] = []
    capacity: list[CapacityRow] = []
    for name, replay in analysis.replays.items():
        kind, _, value = name.partition(":")
        exact = _request_share(strategy(replay, "exact", cost))
        if kind == "ttl":
            semantic = _request_share(strategy(replay, "semantic", cost))
            ttl.append(TtlRow(replay.setup.ttl_s, exact, semantic))
        elif kind == "exact_capacity":
            capacity.append(CapacityRow(float(value), replay.setup.exact_capacity_bytes, exact))
    ttl.sort(key=lambda row: row.ttl_s or 0.0)
    capacity.sort(key=lambda row: row.factor or 0.0)
    return SweepFigures(tuple(ttl), tuple(capacity))


def _windows(analysis: Analysis) -> WindowFigures | None:
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
            WindowRow(
                start_s=index * width,
                start=start.isoformat(timespec="minutes"),
                requests=tally.requests,
                census=ClassShares.of(tally.shares()),
                prefix_token_share=tally.prefix_token_share,
                exact_hit_rate=replayed["exact"] / requests if requests else None,
                semantic_hit_rate=replayed["semantic"] / requests if requests else None,
                prefix_token_hit_rate=replayed["prefix_reused"] / seen if seen else None,
            )
        )
    return WindowFigures(analysis.options.by, width, tuple(rows))


def _cost_model(analysis: Analysis) -> CostModelFigures:
    cost = analysis.cost
    profile = cost.profile.rates
    return CostModelFigures(
        profile="auto" if profile is None else profile.name,
        models={
            model: ModelRatesFigures(
                source=m.source,
                fitted=m.fitted,
                timed_records=m.timed_records,
                rates=m.rates.name,
                overhead_s=m.rates.overhead_s,
                prefill_tokens_per_s=m.rates.prefill_tokens_per_s,
                decode_tokens_per_s=m.rates.decode_tokens_per_s,
            )
            for model, m in sorted(cost.by_model.items())
        },
    )


def _inputs(analysis: Analysis) -> InputFigures:
    e = analysis.errors
    c = analysis.census
    return InputFigures(
        files=tuple(analysis.files),
        lines=analysis.lines,
        formats=dict(analysis.kinds.most_common()),
        malformed=MalformedFigures(e.count, tuple(MalformedLineFigures(*kept) for kept in e.kept)),
        out_of_order=e.out_of_order,
        timestamps=c.timed,
        first_timestamp_s=c.first_s,
        span_s=None if c.first_s is None or c.last_s is None else c.last_s - c.first_s,
    )


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


def _settings(analysis: Analysis) -> ReportSettings:
    o = analysis.options
    prices = analysis.replays["layered"].totals.cost_usd if "layered" in analysis.replays else 0
    return ReportSettings(
        ttl_s=o.ttl_s,
        capacity=Capacity(
            exact_bytes=o.exact_capacity_bytes,
            prefix_tokens=o.prefix_capacity_tokens,
            semantic_vectors=o.semantic.max_vectors if o.semantic else None,
        ),
        min_prefix_share=o.min_prefix_share,
        block_tokens=o.block_tokens,
        share_prefix_across_tenants=o.share_prefix_across_tenants,
        tokenizer=tokenizer_of(analysis),
        calibration=_calibration(analysis),
        priced=bool(prices),
    )


def _calibration(analysis: Analysis) -> str:
    run = analysis.semantic
    if run is None:
        return "none (near-duplicates not measured)"
    if run.label is not None:
        return f"{run.label}: threshold {run.threshold:g} ({run.embedder.split(';')[0]})"
    return f"threshold {run.threshold:g} from {run.source}"
