"""The analyzer's frozen parameters, validated once, passed down (built by cli.py).

- `ttl_s`: TTL of the replayed caches (and the line drawn on the reuse-distance CDF).
- `exact_capacity_bytes`: the replayed exact store's byte bound (memory store, LRU).
- `prefix_capacity_tokens`: the replayed KV budget in tokens. Default: the engine's default
  budget (engine/config.py, 512 MiB) at SmolLM2-135M's 46,080 bytes a token (fp32).
- `min_prefix_tokens`: a request is `shared_prefix` when at least this many of its prompt
  tokens equal an earlier prompt's prefix.
- `block_tokens`: tokens per `hash_ids` block in block traces (512 in Mooncake's).
- `share_prefix_across_tenants`: whether KV may be reused across tenants (the engine's default:
  no), which decides the prefix namespaces in the census and the replay.
- `census_capacity_tokens`: memory bound of the census's prefix tree (None: unbounded). When it
  is reached the least recently used prefixes go and prefix figures become lower bounds (the
  report says so). `census_max_identities` bounds the exact identities remembered likewise.
- `semantic`: the calibrated near-duplicate rule, or None (no near-duplicate census, no
  semantic replay). Its threshold is never defaulted.
- `latency`: how upstream seconds are estimated for requests the log has no latency for.
- `sweep`: replay again at each `ttl_grid_s` and each `capacity_factors` × the configured
  capacities, for the hit-rate curves.
- `window`: requests embedded in one batch by the near-duplicate pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infercache.errors import ConfigError

SMOLLM2_KV_BYTES_PER_TOKEN = 46_080  # 30 layers × 3 KV heads × 64 dims × (K, V) × 4 bytes
ENGINE_DEFAULT_KV_BYTES = 512 * 2**20  # engine/config.py DEFAULT_MAX_KV_BYTES


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """Upstream seconds of a request whose log line carries no latency: an overhead, then
    prefill and decode at constant rates. Assumptions, stated in every report that used them."""

    overhead_s: float = 0.3
    prefill_tokens_per_s: float = 5_000.0
    decode_tokens_per_s: float = 50.0

    def __post_init__(self) -> None:
        if self.overhead_s < 0 or self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            raise ConfigError(f"latency model needs positive rates, got {self}")

    def upstream_s(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (
            self.overhead_s
            + self.prefill_s(prompt_tokens)
            + (completion_tokens / self.decode_tokens_per_s)
        )

    def prefill_s(self, tokens: int) -> float:
        return tokens / self.prefill_tokens_per_s


@dataclass(frozen=True, slots=True)
class SemanticOptions:
    threshold: float  # cosine similarity in [-1, 1], calibrated by `infercache tune`
    source: str  # where the threshold came from (a flag, a config file)
    embedder: str = "minilm"  # minilm | static | a test's name for an injected embedder
    guards: tuple[str, ...] | None = None  # None: semantic.guards.default_guards()
    k: int = 4  # neighbours examined per lookup, as the live layer does
    max_vectors: int = 200_000  # ~1.6 KB each (MiniLM), in the census and in the replay

    def __post_init__(self) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise ConfigError(f"semantic threshold must be in [-1, 1], got {self.threshold}")
        if self.k < 1 or self.max_vectors < 1:
            raise ConfigError(f"k and max_vectors must be >= 1, got {self.k}, {self.max_vectors}")


@dataclass(frozen=True, slots=True)
class AnalyzeOptions:
    ttl_s: float = 3600.0
    exact_capacity_bytes: int = 1 << 30
    prefix_capacity_tokens: int = ENGINE_DEFAULT_KV_BYTES // SMOLLM2_KV_BYTES_PER_TOKEN
    min_prefix_tokens: int = 256
    block_tokens: int = 512
    share_prefix_across_tenants: bool = False
    census_capacity_tokens: int | None = 100_000_000
    census_max_identities: int = 8_000_000
    semantic: SemanticOptions | None = None
    latency: LatencyModel = field(default_factory=LatencyModel)
    sweep: bool = False
    ttl_grid_s: tuple[float, ...] = (60.0, 300.0, 900.0, 3600.0, 14_400.0, 86_400.0)
    capacity_factors: tuple[float, ...] = (1 / 64, 1 / 16, 1 / 4, 1.0, 4.0)
    window: int = 256
    reorder_window: int = 4096

    def __post_init__(self) -> None:
        positive = {
            "ttl_s": self.ttl_s,
            "exact_capacity_bytes": self.exact_capacity_bytes,
            "prefix_capacity_tokens": self.prefix_capacity_tokens,
            "min_prefix_tokens": self.min_prefix_tokens,
            "block_tokens": self.block_tokens,
            "window": self.window,
            "reorder_window": self.reorder_window,
            "census_max_identities": self.census_max_identities,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.census_capacity_tokens is not None and self.census_capacity_tokens <= 0:
            raise ConfigError(
                f"census_capacity_tokens must be > 0, got {self.census_capacity_tokens}"
            )
        if any(t <= 0 for t in self.ttl_grid_s) or any(f <= 0 for f in self.capacity_factors):
            raise ConfigError("sweep TTLs and capacity factors must be > 0")
