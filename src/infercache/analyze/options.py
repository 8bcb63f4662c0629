"""The analyzer's frozen parameters, validated once, passed down (built by cli.py).

- `ttl_s`: TTL of the replayed caches (and the line drawn on the reuse-distance CDF).
- `exact_capacity_bytes`: the replayed exact store's byte bound (memory store, LRU).
- `prefix_capacity_tokens`: the replayed KV budget in tokens; None (the default): unbounded.
  The analyzer never assumes the built-in engine's memory: the KV sweep (kv_sweep.py) shows
  the reuse at every budget instead, and where it stops rising.
- `min_prefix_share`: a request that is neither a repeat nor a near-duplicate is
  `shared_prefix` when it reuses at least this share of its prompt from earlier prompts'
  prefixes (the length of the shared part is reported, not used as a bar).
- `block_tokens`: tokens per `hash_ids` block in block traces (512 in Mooncake's).
- `share_prefix_across_tenants`: whether KV may be reused across tenants (the engine's default:
  no), which decides the prefix namespaces in the census and the replay.
- `census_capacity_tokens`: memory bound of the census's prefix tree (None: unbounded). When it
  is reached the least recently used prefixes go and prefix figures become lower bounds (the
  report says so). `census_max_identities` bounds the exact identities remembered likewise.
- `semantic`: the near-duplicate rule (a calibrated threshold: the user's, or the packaged
  public calibration, near_duplicates/default_matcher.py), or None (no near-duplicates, no
  semantic replay).
- `upstream`: how upstream seconds are priced (cost_model.py): fitted from the log's timings
  or a named profile.
- `sweep`: replay again at each `ttl_grid_s` and each `capacity_factors` × the exact store's
  capacity, for the hit-rate curves.
- `by`: "day" or "hour": the census and replayed hit rates per window of time too.
- `window`: requests embedded in one batch by the near-duplicate pass.
- `seed`: of the uniform sample the near-duplicate pass checks on large logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infercache.analyze.cost_model import UpstreamProfile
from infercache.errors import ConfigError

PUBLIC_LABEL = "public calibration — tune on your own pairs before serving"
WINDOW_S = {"day": 86_400.0, "hour": 3_600.0}


@dataclass(frozen=True, slots=True)
class CandidateFilter:
    """On large logs only a uniform sample of the requests is checked, and only against the
    candidates a fast embedder and shared words find (near_duplicates/finder.py): the `k` nearest
    by `embedder` and the `k` best by shared words, keeping those that share at least
    `min_word_jaccard` (in [0, 1]) of their words with the query."""

    embedder: str  # "ngram3", or a test's name for an injected embedder
    k: int = 16
    min_word_jaccard: float = 0.2

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_word_jaccard <= 1.0 or self.k < 1:
            raise ConfigError(f"bad candidate filter {self}")


@dataclass(frozen=True, slots=True)
class SemanticOptions:
    threshold: float  # cosine similarity in [-1, 1], calibrated by `infercache tune`
    source: str  # where the threshold came from (a flag, a config file, the package)
    embedder: str = "minilm"  # minilm | static | a test's name for an injected embedder
    guards: tuple[str, ...] | None = None  # None: semantic.guards.default_guards()
    k: int = 4  # neighbours examined per lookup, as the live layer does
    max_vectors: int = 200_000  # texts remembered (~1.6 KB each with MiniLM)
    public: bool = False  # the packaged public calibration: results carry PUBLIC_LABEL
    candidates: CandidateFilter | None = None  # sampled mode; None: every request embedded
    half_width: float = 0.01  # sampled mode: the sample aims at a 95% interval of ± this

    def __post_init__(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise ConfigError(f"semantic threshold must be in [-1, 1], got {self.threshold}")
        if self.k < 1 or self.max_vectors < 1:
            raise ConfigError(f"k and max_vectors must be >= 1, got {self.k}, {self.max_vectors}")
        if not 0 < self.half_width < 0.5:
            raise ConfigError(f"half_width must be in (0, 0.5), got {self.half_width}")

    @property
    def sampled(self) -> bool:
        return self.candidates is not None

    @property
    def label(self) -> str | None:
        return PUBLIC_LABEL if self.public else None


@dataclass(frozen=True, slots=True)
class AnalyzeOptions:
    ttl_s: float = 3600.0
    exact_capacity_bytes: int = 1 << 30
    prefix_capacity_tokens: int | None = None
    min_prefix_share: float = 0.5
    block_tokens: int = 512
    share_prefix_across_tenants: bool = False
    census_capacity_tokens: int | None = 100_000_000
    census_max_identities: int = 8_000_000
    semantic: SemanticOptions | None = None
    upstream: UpstreamProfile = field(default_factory=UpstreamProfile)
    sweep: bool = False
    ttl_grid_s: tuple[float, ...] = (60.0, 300.0, 900.0, 3600.0, 14_400.0, 86_400.0)
    capacity_factors: tuple[float, ...] = (1 / 64, 1 / 16, 1 / 4, 1.0, 4.0)
    by: str | None = None
    window: int = 256
    reorder_window: int = 4096
    seed: int = 0

    def __post_init__(self) -> None:
        positive = {
            "ttl_s": self.ttl_s,
            "exact_capacity_bytes": self.exact_capacity_bytes,
            "block_tokens": self.block_tokens,
            "window": self.window,
            "reorder_window": self.reorder_window,
            "census_max_identities": self.census_max_identities,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        for name, bound in (
            ("census_capacity_tokens", self.census_capacity_tokens),
            ("prefix_capacity_tokens", self.prefix_capacity_tokens),
        ):
            if bound is not None and bound <= 0:
                raise ConfigError(f"{name} must be > 0, got {bound}")
        if not 0 < self.min_prefix_share <= 1:
            raise ConfigError(f"min_prefix_share must be in (0, 1], got {self.min_prefix_share}")
        if any(t <= 0 for t in self.ttl_grid_s) or any(f <= 0 for f in self.capacity_factors):
            raise ConfigError("sweep TTLs and capacity factors must be > 0")
        if self.by is not None and self.by not in WINDOW_S:
            raise ConfigError(f"--by must be day or hour, got {self.by!r}")

    @property
    def window_s(self) -> float | None:
        return None if self.by is None else WINDOW_S[self.by]
