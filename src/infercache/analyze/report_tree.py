"""The analyzer's figures as a frozen dataclass tree: what the recommendation and renderers read.

`Figures` holds every measured figure, one typed node per section (reports/document.py builds
it from an `Analysis`, and pairs it with the recommendation computed from it as a `Report`).
The replay's nodes (`SimulationFigures`, sweeps, the KV sweep) are in replay_figures.py.
`to_json(figures)` (report_json.py) is the JSON document `--format json` prints (schema
`infercache.analyze/2`); a node's field names are the document's keys, so a path into the
document (a reason's `Quote`, `rules.at`) reads the tree the same way.

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
    provider_prompt_cache    {upstreams{name: {total, models}}, unpriced_models} or null: the
                             provider's own prompt cache as the log recorded it, each row
                             {requests, input_tokens, read_tokens, write_tokens, read_rate,
                             saved_usd, write_premium_usd, net_usd, alarm?}
                             (provider_prompt_cache.py)
    recommendation           {strategies, layering, reasons, prefix_scope, advice, alarms}
    inputs, settings, observed_layers, notes, timing

Two sections have two shapes, told apart by a flag the document carries: `near_duplicates`
is `NearDuplicateFigures` (`measured: true`) or `NearDuplicatesUnmeasured` (`measured: false`,
with the reason); each replayed strategy is `StrategyFigures` (`available: true`) or
`Unavailable` (`available: false`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from infercache.analyze.provider_prompt_cache import ProviderPromptCacheFigures
from infercache.analyze.replay_figures import (
    KvSweepFigures,
    SimulationFigures,
    Strategy,
    SweepFigures,
    Unavailable,
)

SCHEMA = "infercache.analyze/2"
CLASSES = ("exact_repeat", "near_duplicate", "shared_prefix", "unique")


@dataclass(frozen=True, slots=True)
class ClassShares:
    """One figure per census class (a share of requests, or a count)."""

    exact_repeat: float
    near_duplicate: float
    shared_prefix: float
    unique: float

    @classmethod
    def of(cls, by_class: Mapping[str, float]) -> ClassShares:
        return cls(*(by_class[name] for name in CLASSES))

    def of_class(self, name: str) -> float:
        value: float = getattr(self, name)
        return value


@dataclass(frozen=True, slots=True)
class Histogram:
    """Counts per upper bucket bound; the last bucket is unbounded."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]  # one more than bounds: the last bucket is unbounded


@dataclass(frozen=True, slots=True)
class SharedPrefixFigures:
    """The `shared_prefix` class: how many, and how long their shared parts are."""

    min_share: float
    requests: int
    mean_tokens: float | None
    tokens_histogram: Histogram


@dataclass(frozen=True, slots=True)
class CandidateStageFigures:
    """The fast embedder in front of the matcher, when sampling."""

    embedder: str
    min_word_jaccard: float | None


@dataclass(frozen=True, slots=True)
class NearDuplicateFigures:
    """Near-duplicates as measured: the share, its interval, and how it was measured."""

    measured: bool = field(default=True, init=False)
    label: str | None
    share: float
    interval: tuple[float, float] | None
    confidence: float
    estimated: bool
    sample_rate: float
    checked: int
    near_duplicates_found: int
    threshold: float
    threshold_source: str
    embedder: str
    guards: tuple[str, ...]
    candidate_stage: CandidateStageFigures | None
    texts_embedded: int
    candidate_texts_embedded: int
    chars_embedded: int
    embed_s: float
    texts_per_s: float | None
    replayed: bool


@dataclass(frozen=True, slots=True)
class NearDuplicatesUnmeasured:
    """Why near-duplicates were not measured."""

    measured: bool = field(default=False, init=False)
    reason: str


@dataclass(frozen=True, slots=True)
class NotCacheableFigures:
    """Requests the exact cache would not serve, by the phrase policy.py gives."""

    share: float
    count: int
    reasons: Mapping[str, int]  # the phrase (policy.not_cacheable_reason) → requests


@dataclass(frozen=True, slots=True)
class GroupFigures:
    """One tenant's or model's figures."""

    requests: int
    census: ClassShares
    prompt_tokens: int
    prefix_token_share: float
    shared_prefix_mean_tokens: float | None
    not_cacheable_share: float
    near_duplicate_interval: tuple[float, float] | None


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Figures per tenant and per model."""

    tenant: Mapping[str, GroupFigures]
    model: Mapping[str, GroupFigures]


@dataclass(frozen=True, slots=True)
class ReuseDistances:
    """Seconds since the request each reuses, per class (counts per bound of `bounds`)."""

    bounds: tuple[float, ...]
    exact_repeat: tuple[int, ...]
    near_duplicate: tuple[int, ...]
    shared_prefix: tuple[int, ...]
    within_ttl: Mapping[str, float | None]  # class → share reused within the TTL
    ttl_s: float

    def counts_of(self, name: str) -> tuple[int, ...]:
        counts: tuple[int, ...] = getattr(self, name, ())
        return counts


@dataclass(frozen=True, slots=True)
class BreakerRow:
    """One prompt layout that defeats prefix reuse (prefix_breakers.py)."""

    tenant: str
    model: str
    role: str
    kind: str
    break_char: int
    break_tokens: int
    tail_tokens: int
    requests: int
    tokens_lost: int
    token_share_lost: float
    examples: tuple[str, ...]
    context: str


@dataclass(frozen=True, slots=True)
class BreakersSummary:
    """What fixing every breaker's layout would give."""

    token_share_lost: float
    share_if_fixed: float


@dataclass(frozen=True, slots=True)
class WindowRow:
    """One window of time (`--by`): its census and, when replayed, its hit rates."""

    start_s: float
    start: str  # ISO 8601, UTC, to the minute
    requests: int
    census: ClassShares
    prefix_token_share: float
    exact_hit_rate: float | None
    semantic_hit_rate: float | None
    prefix_token_hit_rate: float | None


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """The log cut into windows of `window_s`."""

    by: str | None
    window_s: float
    rows: tuple[WindowRow, ...]


@dataclass(frozen=True, slots=True)
class ModelRatesFigures:
    """One model's upstream rates, and where they come from (cost_model.py)."""

    source: str
    fitted: bool
    timed_records: int
    rates: str
    overhead_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float


@dataclass(frozen=True, slots=True)
class CostModelFigures:
    """How upstream seconds are priced: the profile and each model's rates."""

    profile: str
    models: Mapping[str, ModelRatesFigures]


@dataclass(frozen=True, slots=True)
class MalformedLineFigures:
    """A line the reader skipped, and why."""

    file: str
    line: int
    error: str


@dataclass(frozen=True, slots=True)
class MalformedFigures:
    """Lines the reader skipped: how many, and the first ones."""

    count: int
    lines: tuple[MalformedLineFigures, ...]


@dataclass(frozen=True, slots=True)
class InputFigures:
    """What was read: files, lines, formats, time span."""

    files: tuple[str, ...]
    lines: int
    formats: Mapping[str, int]
    malformed: MalformedFigures
    out_of_order: int
    timestamps: int
    first_timestamp_s: float | None
    span_s: float | None


@dataclass(frozen=True, slots=True)
class Capacity:
    """The capacities the replay assumed (None: unbounded)."""

    exact_bytes: int
    prefix_tokens: int | None
    semantic_vectors: int | None


@dataclass(frozen=True, slots=True)
class ReportSettings:
    """The settings the figures were measured with."""

    ttl_s: float
    capacity: Capacity
    min_prefix_share: float
    block_tokens: int
    share_prefix_across_tenants: bool
    tokenizer: str | None
    calibration: str
    priced: bool


@dataclass(frozen=True, slots=True)
class TimingFigures:
    """How long the analysis took."""

    wall_s: float


@dataclass(frozen=True, slots=True)
class Figures:
    """Every measured figure of the report (document.py builds it from an `Analysis`)."""

    schema: str
    requests: int
    census: ClassShares  # shares, sum 1 (estimated from the sample when sampled)
    census_counts: ClassShares  # as counted (a near-duplicate only when checked)
    census_estimated: bool
    prefix_token_share: float  # reused by an unbounded prefix cache / all prompt tokens
    prompt_tokens: int
    shared_prefix: SharedPrefixFigures
    near_duplicates: NearDuplicateFigures | NearDuplicatesUnmeasured
    not_cacheable: NotCacheableFigures
    breakdown: Breakdown
    tenant_names: Mapping[str, str]  # tenant → the name to show
    reuse_distance_s: ReuseDistances
    prefix_share_histogram: Histogram
    prefix_breakers: tuple[BreakerRow, ...]
    prefix_breakers_summary: BreakersSummary
    simulation: SimulationFigures | None  # None (`{}` in the document): no replay
    kv_sweep: KvSweepFigures | None
    sweeps: SweepFigures | None
    windows: WindowFigures | None
    cost_model: CostModelFigures
    provider_prompt_cache: ProviderPromptCacheFigures | None  # None: not in the log
    inputs: InputFigures
    settings: ReportSettings
    observed_layers: Mapping[str, int]
    notes: tuple[str, ...]
    timing: TimingFigures

    def name_of(self, tenant: str) -> str:
        """The name to show for a tenant."""
        return self.tenant_names.get(tenant, tenant) or "(none)"

    def strategy(self, name: str) -> Strategy:
        """A replayed strategy's figures (unavailable when there was no replay)."""
        if self.simulation is None:
            return Unavailable()
        return self.simulation.of_strategy(name)
