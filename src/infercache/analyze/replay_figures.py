"""The replay's figures as frozen tree nodes (report_tree.py holds the rest of the report).

Per strategy (`exact`, `semantic`, `prefix`): `StrategyFigures` when the replay looked it up
(reports/replay_numbers.py says what each figure is), else `Unavailable` (a block trace has no
bodies for the answer caches; a semantic layer not measured or not replayed). `LayeredFigures`
sums the layered replay; `SweepFigures` the replays at other TTLs and exact store sizes;
`KvSweepFigures` the KV budget sweep (the census's LRU pass) and its knee.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from infercache.analyze.kv_sweep import SweepPoint, TieredPoint
from infercache.analyze.report_json import OMIT_NONE


@dataclass(frozen=True, slots=True)
class AgeFigures:
    """How old the answers a layer served were (seconds, by bucket)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    p50_s_at_most: float | None
    p90_s_at_most: float | None
    max_s: float | None


@dataclass(frozen=True, slots=True)
class Unavailable:
    """A strategy the replay could not look up, and why when known."""

    available: bool = field(default=False, init=False)
    reason: str | None = field(default=None, metadata=OMIT_NONE)


@dataclass(frozen=True, slots=True)
class StrategyFigures:
    """One strategy in the replay (replay_numbers.py says what each figure is)."""

    available: bool = field(default=True, init=False)
    lookups: int
    hits: int
    hit_rate: float
    request_share: float
    misses: Mapping[str, int]
    prompt_tokens_saved: int
    prompt_token_share: float
    completion_tokens_saved: int
    completion_token_share: float
    upstream_s_saved: float
    upstream_share: float
    money_saved_usd: float
    money_share: float
    counters: Mapping[str, float]
    gauges: Mapping[str, float]
    token_hit_rate: float | None = field(default=None, metadata=OMIT_NONE)  # prefix only
    prompt_tokens_seen: int | None = field(default=None, metadata=OMIT_NONE)  # prefix only
    ttft_saved_ms_mean: float | None = field(default=None, metadata=OMIT_NONE)  # prefix only
    age_s: AgeFigures | None = field(default=None, metadata=OMIT_NONE)  # answer caches only


Strategy = StrategyFigures | Unavailable


@dataclass(frozen=True, slots=True)
class TotalsWithoutCache:
    """What the replayed traffic would cost with no cache at all."""

    prompt_tokens: int
    completion_tokens: int
    upstream_s: float
    cost_usd: float
    upstream_s_estimated_for: int
    completion_tokens_unknown_for: int


@dataclass(frozen=True, slots=True)
class LayeredFigures:
    """The layered replay summed: exact → semantic → prefix."""

    requests: int
    answered_by: Mapping[str, int]
    hit_rate: float
    prefix_under_caches: Strategy
    prompt_tokens_saved: float
    prompt_token_share: float
    completion_tokens_saved: float
    completion_token_share: float
    upstream_s_saved: float
    upstream_share: float
    money_saved_usd: float
    money_share: float
    totals_without_cache: TotalsWithoutCache
    skipped: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class SimulationFigures:
    """The replay, per strategy and layered."""

    exact: Strategy
    semantic: Strategy
    prefix: Strategy
    layered: LayeredFigures

    def of_strategy(self, name: str) -> Strategy:
        found: Strategy = getattr(self, name)
        return found


@dataclass(frozen=True, slots=True)
class KvKnee:
    """Where the KV sweep's gains flatten."""

    budget_tokens: int
    token_share: float


@dataclass(frozen=True, slots=True)
class KvDiskPoint:
    """One RAM budget of the KV sweep over a disk tier of `disk_tokens` (kv_sweep.with_disk)."""

    ram_tokens: int
    token_share: float  # reused from RAM or disk
    disk_share: float  # of it, loaded from disk

    @classmethod
    def of(cls, point: TieredPoint) -> KvDiskPoint:
        return cls(point.ram_tokens, point.token_share, point.disk_share)


@dataclass(frozen=True, slots=True)
class KvSweepFigures:
    """Prefix reuse against the KV budget (an LRU pass over the census's tree); with
    `disk_tokens`, also over a disk tier of that size (`--capacity disk=`)."""

    curve: tuple[SweepPoint, ...]  # one budget of the sweep and what it reuses
    knee: KvKnee | None
    unbounded_token_share: float
    working_set_tokens: int
    bounded_by_census_memory: bool
    disk_tokens: int | None = None
    with_disk: tuple[KvDiskPoint, ...] = ()


@dataclass(frozen=True, slots=True)
class TtlRow:
    """Hit rates replayed at one TTL."""

    ttl_s: float
    exact_hit_rate: float | None
    semantic_hit_rate: float | None


@dataclass(frozen=True, slots=True)
class CapacityRow:
    """The exact hit rate replayed at one store size (a factor of the one given)."""

    factor: float
    capacity_bytes: int | None
    exact_hit_rate: float | None


@dataclass(frozen=True, slots=True)
class SweepFigures:
    """The replays at other TTLs and exact store sizes (`--sweep`)."""

    ttl: tuple[TtlRow, ...]
    exact_capacity: tuple[CapacityRow, ...]
