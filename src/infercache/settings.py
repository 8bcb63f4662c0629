"""Settings, read once and passed down frozen. Nothing reads the environment anywhere else.

Sources, later ones winning: the defaults below, a TOML file (`--config FILE`), then the
environment (`INFERCACHE_*`). Every value is validated here; a bad one raises `ConfigError`
naming it.

    [cache]                              # env
    store = "sqlite:///path.db"          # INFERCACHE_STORE (default: SQLite in data_dir)
    data_dir = "~/.cache/infercache"     # INFERCACHE_DATA_DIR
    max_store_bytes = 1073741824         # INFERCACHE_MAX_STORE_BYTES
    default_ttl_s = 3600                 # INFERCACHE_DEFAULT_TTL_S (required > 0; no forever)
    max_ttl_s = 604800                   # INFERCACHE_MAX_TTL_S (caps per-request ttl_s)
    cache_sampled = false                # INFERCACHE_CACHE_SAMPLED: cache temperature > 0
                                         #   without a seed too
    default_temperature = 1.0            # what a request without temperature samples at
    feedback_max_answers = 50000         # INFERCACHE_FEEDBACK_MAX_ANSWERS: recent answers a
    feedback_ttl_s = 86400               #   complaint can name (INFERCACHE_FEEDBACK_TTL_S)
    metrics_top_tenants = 20             # INFERCACHE_METRICS_TOP_TENANTS: tenants with their
    metrics_top_models = 20              #   own /metrics series, the rest `other` (and models:
                                         #   INFERCACHE_METRICS_TOP_MODELS)
    hit_usage = "zero"                   # INFERCACHE_HIT_USAGE: the usage a hit reports:
                                         #   zero | cached | original (hit_usage.py)

    [prices."gpt-4o-mini"]               # INFERCACHE_PRICES='{"gpt-4o-mini": [0.15, 0.6, 0.075]}'
    input_usd_per_mtok = 0.15
    output_usd_per_mtok = 0.6
    cached_input_usd_per_mtok = 0.075
    [prices."claude-sonnet-4-5"]         # a provider prompt cache's write price, where it has
    input_usd_per_mtok = 3.0             #   one (4th of the list form): Anthropic's 5-minute
    output_usd_per_mtok = 15.0           #   cache bills writes at 1.25x input, reads at 0.1x
    cached_input_usd_per_mtok = 0.3
    cache_write_usd_per_mtok = 3.75

    [semantic]                           # written by `infercache tune --write-config`, then:
    enabled = true                       # INFERCACHE_SEMANTIC=1 (or `serve --semantic`)
    mode = "auto"                        # auto | calibrated | shadow (auto: shadow without
                                         #   a threshold, calibrated with one)
    threshold = 0.83                     # on the matcher's scale; from `tune`, never defaulted
    matcher = "/path/to/matcher"         # a fitted matcher (`tune --fit`); absent: plain cosine
    embedder = "minilm"                  # minilm | static | openai (embedder_url, embedder_model)
    guards = ["numbers", "dates", ...]   # see semantic/guards.py
    target_false_hit = 0.01              # the bound live verification and shadow mode hold
    verify_sample_rate = 0.02            # share of semantic hits re-asked upstream (shadow: 0.05)
    judge = "embedding"                  # exact | equality | embedding | llm
    shadow_min_pairs = 300               # judged pairs at the operating point before serving
    shadow_refit_every = 200             # judged pairs between shadow's background refits of
                                         #   its matcher's head (0: never; shadow_fit.py)
    answer_stats = true                  # per-answer thresholds learned from judged outcomes
    k = 4                                # neighbours examined per lookup
    min_seen = 2                         # plain cosine (`tune` writes 2): an answer cached
                                         #   for fewer questions is never served
    store_hits_as_exact = false          # also store a hit under the new wording's exact key
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from infercache.errors import ConfigError
from infercache.hit_usage import DEFAULT_HIT_USAGE, HitUsage
from infercache.keys import IGNORABLE_FIELDS
from infercache.metrics import Price, PriceTable
from infercache.policy import CachePolicy


def default_data_dir(environ: Mapping[str, str]) -> Path:
    """`$INFERCACHE_DATA_DIR`, else `$XDG_CACHE_HOME/infercache`, else `~/.cache/infercache`."""
    if environ.get("INFERCACHE_DATA_DIR"):
        return Path(environ["INFERCACHE_DATA_DIR"]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "~")) / ".cache")
    return Path(base).expanduser() / "infercache"


@dataclass(frozen=True, slots=True)
class SemanticSettings:
    enabled: bool = False
    mode: str = "auto"  # auto | calibrated | shadow
    threshold: float | None = None  # on the matcher's score scale; from `infercache tune`
    matcher: str | None = None  # directory of a fitted matcher (`infercache tune --fit`)
    embedder: str = "minilm"
    embedder_name: str | None = None  # the exact model `tune` calibrated with (checked)
    embedder_url: str | None = None
    embedder_model: str | None = None
    embedder_dim: int | None = None
    guards: tuple[str, ...] | None = None  # None: the default guards
    target_false_hit: float = 0.01
    verify_sample_rate: float | None = None  # None: 0.05 in shadow mode, else 0
    judge: str = "embedding"
    shadow_min_pairs: int = 300
    shadow_window: int = 5000
    shadow_refit_every: int = 200  # judged pairs between shadow's head refits (0: never)
    answer_stats: bool = True
    k: int = 4
    store_hits_as_exact: bool = False
    floor: float | None = None  # what unrelated text reaches (`tune`): never served below
    min_seen: int = 1  # plain cosine: an answer cached for fewer questions is never served
    calibrated_on: str | None = None  # `tune`'s line on its data, bound and floor

    def __post_init__(self) -> None:
        if self.threshold is not None and not -1.0 <= self.threshold <= 1.0:
            raise ConfigError(f"semantic threshold must be in [-1, 1], got {self.threshold}")
        if self.mode not in ("auto", "calibrated", "shadow"):
            raise ConfigError(f"semantic mode must be auto, calibrated or shadow: {self.mode}")
        if self.enabled and self.mode == "calibrated" and self.threshold is None:
            raise ConfigError(
                "the calibrated semantic layer needs a threshold: run `infercache tune FILE "
                '--write-config FILE` and pass --config FILE, or use mode = "shadow" to '
                "calibrate on live traffic (there is no safe default)"
            )
        if self.embedder not in ("minilm", "static", "openai"):
            raise ConfigError(
                f"semantic embedder must be minilm, static or openai: {self.embedder}"
            )
        if self.judge not in ("exact", "equality", "embedding", "llm"):
            raise ConfigError(
                f"semantic judge must be exact, equality, embedding or llm: {self.judge}"
            )
        rate = self.verify_sample_rate
        if rate is not None and not 0 <= rate <= 1:
            raise ConfigError(f"verify_sample_rate must be in [0, 1]: {rate}")
        if not 0 < self.target_false_hit < 1:
            raise ConfigError(f"target_false_hit must be in (0, 1): {self.target_false_hit}")
        if self.min_seen < 1:
            raise ConfigError(f"semantic min_seen must be at least 1: {self.min_seen}")
        if self.min_seen > 1 and self.matcher is not None:
            raise ConfigError(
                "semantic min_seen is the plain cosine's; a fitted matcher carries its own "
                "(its matcher.json): remove min_seen or the matcher"
            )
        if not 1 <= self.shadow_min_pairs <= self.shadow_window:
            raise ConfigError(
                f"need 1 <= shadow_min_pairs <= shadow_window, got {self.shadow_min_pairs}, "
                f"{self.shadow_window}"
            )

    @property
    def shadow(self) -> bool:
        """Whether the layer calibrates on live traffic before serving."""
        return self.mode == "shadow" or (self.mode == "auto" and self.threshold is None)

    @property
    def sample_rate(self) -> float:
        """The share of hits verified (the default depends on the mode)."""
        if self.verify_sample_rate is not None:
            return self.verify_sample_rate
        return 0.05 if self.shadow else 0.0


@dataclass(frozen=True, slots=True)
class Settings:
    data_dir: Path
    store_url: str | None = None  # None: sqlite in data_dir
    max_store_bytes: int = 1 << 30
    default_ttl_s: float = 3600.0
    max_ttl_s: float = 7 * 86400.0
    cache_sampled: bool = False
    default_temperature: float = 1.0
    ignorable_fields: frozenset[str] = IGNORABLE_FIELDS
    prices: PriceTable = field(default_factory=PriceTable)
    feedback_max_answers: int = 50_000  # answers remembered for `report_wrong` (0: none)
    feedback_ttl_s: float = 86_400.0  # how long after it was served an answer can be reported
    metrics_top_tenants: int = 20  # tenants with their own /metrics series; the rest `other`
    metrics_top_models: int = 20  # the same bound for the `model` label
    hit_usage: HitUsage = DEFAULT_HIT_USAGE  # the usage a hit reports (hit_usage.py)
    semantic: SemanticSettings = field(default_factory=SemanticSettings)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hit_usage", HitUsage.of(str(self.hit_usage)))
        if not self.default_ttl_s > 0:
            raise ConfigError(f"default_ttl_s must be > 0, got {self.default_ttl_s}")
        if self.max_ttl_s < self.default_ttl_s:
            raise ConfigError(
                f"max_ttl_s ({self.max_ttl_s}) must be >= default_ttl_s ({self.default_ttl_s})"
            )
        if self.max_store_bytes <= 0:
            raise ConfigError(f"max_store_bytes must be > 0, got {self.max_store_bytes}")
        if self.feedback_max_answers < 0 or not self.feedback_ttl_s > 0:
            raise ConfigError(
                "need feedback_max_answers >= 0 and feedback_ttl_s > 0, got "
                f"{self.feedback_max_answers}, {self.feedback_ttl_s}"
            )
        if self.metrics_top_tenants < 0 or self.metrics_top_models < 0:
            raise ConfigError(
                "metrics_top_tenants and metrics_top_models must be >= 0, got "
                f"{self.metrics_top_tenants}, {self.metrics_top_models}"
            )

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or f"sqlite:///{self.data_dir / 'cache.sqlite3'}"

    def policy(self) -> CachePolicy:
        """The cache policy these settings give: each of its fields, the setting of its name."""
        return CachePolicy(**{f.name: getattr(self, f.name) for f in fields(CachePolicy)})

    @classmethod
    def load(
        cls, environ: Mapping[str, str] | None = None, config_file: Path | None = None
    ) -> Settings:
        """Defaults, then `config_file` (TOML), then `environ` (default: os.environ)."""
        env = os.environ if environ is None else environ
        settings = cls(data_dir=default_data_dir(env))
        if config_file is not None:
            settings = settings.with_toml(config_file)
        return settings.with_env(env)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        return cls.load(environ)

    def with_toml(self, path: Path) -> Settings:
        try:
            doc = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        changes = _cache_section(doc.get("cache", {}), str(path))
        if "prices" in doc:
            changes["prices"] = _prices(doc["prices"], str(path))
        if "semantic" in doc:
            changes["semantic"] = self.semantic_with(doc["semantic"], str(path))
        return self._replace(changes)

    def semantic_with(self, values: Mapping[str, Any], source: str) -> SemanticSettings:
        known = {f.name for f in fields(SemanticSettings)}
        unknown = set(values) - known
        if unknown:
            raise ConfigError(f"{source}: unknown [semantic] setting(s) {sorted(unknown)}")
        changes = dict(values)
        if changes.get("guards") is not None:
            changes["guards"] = tuple(changes["guards"])
        try:
            return replace(self.semantic, **changes)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {exc}") from exc

    def with_env(self, environ: Mapping[str, str]) -> Settings:
        names = {
            "INFERCACHE_STORE": "store",
            "INFERCACHE_DATA_DIR": "data_dir",
            "INFERCACHE_MAX_STORE_BYTES": "max_store_bytes",
            "INFERCACHE_DEFAULT_TTL_S": "default_ttl_s",
            "INFERCACHE_MAX_TTL_S": "max_ttl_s",
            "INFERCACHE_CACHE_SAMPLED": "cache_sampled",
            "INFERCACHE_DEFAULT_TEMPERATURE": "default_temperature",
            "INFERCACHE_FEEDBACK_MAX_ANSWERS": "feedback_max_answers",
            "INFERCACHE_FEEDBACK_TTL_S": "feedback_ttl_s",
            "INFERCACHE_METRICS_TOP_TENANTS": "metrics_top_tenants",
            "INFERCACHE_METRICS_TOP_MODELS": "metrics_top_models",
            "INFERCACHE_HIT_USAGE": "hit_usage",
        }
        raw = {field_name: environ[var] for var, field_name in names.items() if var in environ}
        changes = _cache_section(raw, "environment", from_strings=True)
        if "INFERCACHE_PRICES" in environ:
            try:
                doc = json.loads(environ["INFERCACHE_PRICES"])
            except ValueError as exc:
                raise ConfigError(f"INFERCACHE_PRICES is not JSON: {exc}") from exc
            changes["prices"] = _prices(doc, "INFERCACHE_PRICES")
        if "INFERCACHE_SEMANTIC" in environ:
            enabled = _convert(environ["INFERCACHE_SEMANTIC"], bool, "semantic", "env", True)
            changes["semantic"] = self.semantic_with({"enabled": enabled}, "environment")
        return self._replace(changes)

    def _replace(self, changes: dict[str, Any]) -> Settings:
        try:
            return replace(self, **changes)
        except (TypeError, ValueError) as exc:
            raise ConfigError(str(exc)) from exc


# The [cache] section's settings by kind; each sets the field of its name, but `store`.
_CACHE_KINDS: dict[type, tuple[str, ...]] = {
    str: ("store", "hit_usage"),
    Path: ("data_dir",),
    int: ("max_store_bytes", "feedback_max_answers", "metrics_top_tenants", "metrics_top_models"),
    float: ("default_ttl_s", "max_ttl_s", "default_temperature", "feedback_ttl_s"),
    bool: ("cache_sampled",),
}
_CACHE_FIELDS = {name: kind for kind, names in _CACHE_KINDS.items() for name in names}
_CACHE_ATTRS = {"store": "store_url"}


def _convert(value: object, kind: type, name: str, source: str, from_strings: bool) -> object:
    if kind is bool and from_strings and isinstance(value, str):
        if value.lower() in ("1", "true", "yes", "on"):
            return True
        if value.lower() in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{source}: {name} must be a boolean, got {value!r}")
    if kind is bool and not isinstance(value, bool):
        raise ConfigError(f"{source}: {name} must be a boolean, got {value!r}")
    if kind is Path:
        return Path(str(value)).expanduser()
    try:
        return kind(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: {name} must be {kind.__name__}, got {value!r}") from exc


def _cache_section(
    section: Mapping[str, Any], source: str, *, from_strings: bool = False
) -> dict[str, Any]:
    unknown = set(section) - set(_CACHE_FIELDS)
    if unknown:
        raise ConfigError(f"{source}: unknown [cache] setting(s) {sorted(unknown)}")
    out: dict[str, Any] = {}
    for name, value in section.items():
        kind = _CACHE_FIELDS[name]
        out[_CACHE_ATTRS.get(name, name)] = _convert(value, kind, name, source, from_strings)
    return out


def _prices(doc: object, source: str) -> PriceTable:
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: prices must be a table of models")
    price_fields = [f.name for f in fields(Price)]
    by_model: dict[str, Price] = {}
    for model, spec in doc.items():
        if isinstance(spec, list) and 2 <= len(spec) <= 4:
            spec = dict(zip(price_fields, spec, strict=False))
        if not isinstance(spec, dict) or set(spec) - set(price_fields):
            raise ConfigError(f"{source}: bad price for {model!r}: {spec!r}")
        try:
            by_model[model] = Price(**{k: float(v) for k, v in spec.items()})
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: bad price for {model!r}: {exc}") from exc
    default = by_model.pop("*", Price())
    return PriceTable(by_model=by_model, default=default)
