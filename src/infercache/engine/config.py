"""The engine's frozen settings, read once and passed down.

Parameters (units in the names):
- `data_dir`: where converted checkpoints and digests live (`models/`, `digests/` below it).
  Default: `settings.default_data_dir` (`$INFERCACHE_DATA_DIR`, else the XDG cache dir), the
  same folder the gateway's SQLite store lives in.
- `model_path`: an HF safetensors folder with `config.json`, or a `.gguf` file; `None` serves the
  packaged SmolLM2-135M-Instruct.
- `served_model_id`: the id clients send as `model`; `None` derives it from the checkpoint.
- `max_kv_bytes`: the prefix cache's KV budget. The KV pool is sized to it; it is never exceeded.
- `max_context_tokens`: prompt + completion limit; `None` uses the model's position limit.
- `default_max_tokens`: completion limit when a request gives none (capped by the context).
- `threads`: torch intra-op threads for the engine's worker; `None` uses every core.
- `prefix_cache`: `False` recomputes every prompt (reported as `bypassed` misses).
- `share_prefix_across_tenants`: `True` lets one tenant reuse another's KV. Off by default: it
  would leak, through time to first token, whether another tenant sent the same prefix.
- `weights`: the projections' weight format (weight_formats.py): `fp16` (the default: half the
  bytes a token, float32 activations) or `fp32` (the reference). Part of the model's identity.
- `dtype`: activations and KV (`float32` is the reference; `bfloat16` halves KV bytes). Part
  of the model's identity too: the answers differ.
KV tiers below the radix tree (kv_tiers.py; `TierSettings`):
- `kv_disk_bytes`: the disk tier's budget (0: no disk tier); `kv_disk_dir` its directory
  (default `<data_dir>/kv`), one engine process at a time.
- `kv_shared_url`: a Redis URL for the tier replicas share (None: none); `kv_shared_bytes` its
  budget, `kv_shared_ttl_s` how long an unused block stays.
- `kv_block_tokens`: tokens per block on those tiers (only whole blocks leave RAM).
Continuous batching (scheduler.py):
- `max_batch`: sequences that run together (one batched forward a step).
- `max_queue`: requests that may wait for a place; one more is refused with HTTP 429.
- `max_step_tokens`: tokens computed per step: every running decode, then prompt chunks. A
  long prompt is prefilled in chunks of at most this, so the running decodes never wait longer
  than one such chunk. Must exceed `max_batch`.
- `max_running_kv_bytes`: KV the running sequences may reserve together (prompt + `max_tokens`
  positions each, in their own workspaces, outside the prefix cache's `max_kv_bytes`); a
  request that does not fit waits, and one that fits nowhere runs alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from infercache.errors import ConfigError
from infercache.settings import default_data_dir

DType = Literal["float32", "bfloat16"]
WeightsName = Literal["fp32", "fp16"]
WEIGHTS_NAMES: tuple[WeightsName, ...] = ("fp32", "fp16")
# Chosen by measurement (bench/README.md, "Weight formats"): passes the quality gate, faster.
DEFAULT_WEIGHTS: WeightsName = "fp16"
DEFAULT_MAX_KV_BYTES = 512 * 2**20
DEFAULT_KV_BLOCK_TOKENS = 64  # 2.8 MiB of the packaged model's fp32 KV: one file, one key


@dataclass(frozen=True, slots=True)
class TierSettings:
    """The KV tiers' settings (see the module docstring); `enabled` when there is a tier."""

    disk_bytes: int = 0
    disk_dir: Path | None = None
    shared_url: str | None = None
    shared_bytes: int = 1 << 30
    shared_ttl_s: float = 3600.0
    block_tokens: int = DEFAULT_KV_BLOCK_TOKENS
    shared_prefix: str = "infercache:kv:"  # Redis keys: one deployment's, below this

    def __post_init__(self) -> None:
        if self.disk_bytes < 0 or self.shared_bytes < 0:
            raise ConfigError(
                f"KV tier budgets must be >= 0, got {self.disk_bytes} and {self.shared_bytes}"
            )
        if self.shared_ttl_s <= 0:
            raise ConfigError(f"kv_shared_ttl_s must be > 0, got {self.shared_ttl_s}")
        if self.block_tokens < 1:
            raise ConfigError(f"kv_block_tokens must be >= 1, got {self.block_tokens}")

    @property
    def enabled(self) -> bool:
        return self.disk_bytes > 0 or self.shared_url is not None


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """The scheduler's limits (see scheduler.py); `max_running_tokens` None is unbounded."""

    max_batch: int = 16
    max_queue: int = 64
    max_step_tokens: int = 256
    max_running_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_queue < 0:
            raise ConfigError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.max_step_tokens <= self.max_batch:
            raise ConfigError(
                f"max_step_tokens ({self.max_step_tokens}) must be larger than max_batch "
                f"({self.max_batch}): a step must have room for a prompt chunk beside the decodes"
            )
        if self.max_running_tokens is not None and self.max_running_tokens < 1:
            raise ConfigError(f"max_running_tokens must be >= 1, got {self.max_running_tokens}")


# EngineConfig's batching and `kv_*` defaults are these classes' own (one answer per default).
_BATCH_DEFAULTS = BatchLimits()
_TIER_DEFAULTS = TierSettings()


@dataclass(frozen=True, slots=True)
class EngineConfig:
    data_dir: Path
    model_path: Path | None = None
    served_model_id: str | None = None
    max_kv_bytes: int = DEFAULT_MAX_KV_BYTES
    max_context_tokens: int | None = None
    default_max_tokens: int = 256
    threads: int | None = None
    prefix_cache: bool = True
    share_prefix_across_tenants: bool = False
    dtype: DType = "float32"
    weights: WeightsName = DEFAULT_WEIGHTS
    max_batch: int = _BATCH_DEFAULTS.max_batch
    max_queue: int = _BATCH_DEFAULTS.max_queue
    max_step_tokens: int = _BATCH_DEFAULTS.max_step_tokens
    max_running_kv_bytes: int = DEFAULT_MAX_KV_BYTES
    kv_disk_bytes: int = _TIER_DEFAULTS.disk_bytes
    kv_disk_dir: Path | None = _TIER_DEFAULTS.disk_dir
    kv_shared_url: str | None = _TIER_DEFAULTS.shared_url
    kv_shared_bytes: int = _TIER_DEFAULTS.shared_bytes
    kv_shared_ttl_s: float = _TIER_DEFAULTS.shared_ttl_s
    kv_block_tokens: int = _TIER_DEFAULTS.block_tokens

    def __post_init__(self) -> None:
        if self.max_kv_bytes < 0:
            raise ConfigError(f"max_kv_bytes must be >= 0, got {self.max_kv_bytes}")
        if self.max_context_tokens is not None and self.max_context_tokens < 2:
            raise ConfigError(f"max_context_tokens must be >= 2, got {self.max_context_tokens}")
        if self.default_max_tokens < 1:
            raise ConfigError(f"default_max_tokens must be >= 1, got {self.default_max_tokens}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        if self.weights not in WEIGHTS_NAMES:
            raise ConfigError(
                f"weights must be one of {', '.join(WEIGHTS_NAMES)}, got {self.weights!r}"
            )
        if self.max_running_kv_bytes < 1:
            raise ConfigError(f"max_running_kv_bytes must be >= 1, got {self.max_running_kv_bytes}")
        self.batch_limits(bytes_per_token=1)  # checks the batch settings at start-up
        self.tier_settings()  # and the tiers'

    def batch_limits(self, *, bytes_per_token: int) -> BatchLimits:
        """The scheduler's limits for a model whose KV takes `bytes_per_token`."""
        return BatchLimits(
            max_batch=self.max_batch,
            max_queue=self.max_queue,
            max_step_tokens=self.max_step_tokens,
            max_running_tokens=max(1, self.max_running_kv_bytes // bytes_per_token),
        )

    def tier_settings(self) -> TierSettings:
        return TierSettings(
            disk_bytes=self.kv_disk_bytes,
            disk_dir=self.kv_disk_dir or self.data_dir / "kv",
            shared_url=self.kv_shared_url,
            shared_bytes=self.kv_shared_bytes,
            shared_ttl_s=self.kv_shared_ttl_s,
            block_tokens=self.kv_block_tokens,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> EngineConfig:
        """Defaults, with `data_dir` taken from the environment."""
        return cls(data_dir=default_data_dir(environ))
