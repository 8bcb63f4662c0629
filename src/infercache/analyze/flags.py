"""The analyze command's flags as the analyzer's inputs: sizes and capacities with units,
prices, where the near-duplicate threshold comes from (the user's calibration, else the
packaged public one), the frozen `AnalyzeOptions` and the recommendation's rules. Every bad
value is a `ConfigError` naming the flag."""

from __future__ import annotations

import argparse
import re
from dataclasses import replace

from infercache.analyze.cost_model import UpstreamProfile
from infercache.analyze.options import AnalyzeOptions, SemanticOptions
from infercache.analyze.rules import RecommendRules
from infercache.errors import ConfigError
from infercache.extras import available, require
from infercache.metrics import Price, PriceTable
from infercache.settings import Settings

SMOLLM2_KV_BYTES_PER_TOKEN = 46_080  # 30 layers × 3 KV heads × 64 dims × (K, V) × 4 bytes
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMG]i?B?|[KMG]|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "KIB": 2**10, "MIB": 2**20,
          "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}  # fmt: skip


def parse_size(text: str) -> tuple[int, bool]:
    """(value, whether a byte unit was given): "20000" → (20000, False), "1GiB" → (2**30, True)."""
    m = _SIZE.match(text)
    if m is None:
        raise ConfigError(f"bad size {text!r}: use a number with an optional K/M/G or KiB/MiB/GiB")
    unit = (m.group(2) or "").upper()
    return int(float(m.group(1)) * _UNITS[unit]), unit.endswith("B")


def parse_capacity(items: list[str], kv_bytes_per_token: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in (part for spec in items for part in spec.split(",") if part.strip()):
        kind, sep, size = item.partition("=")
        kind = kind.strip()
        if not sep or kind not in ("exact", "prefix", "disk", "semantic"):
            raise ConfigError(
                f"--capacity {item!r}: expected exact=SIZE, prefix=SIZE, disk=SIZE or semantic=N"
            )
        value, in_bytes = parse_size(size)
        if kind in ("prefix", "disk") and in_bytes:
            value //= kv_bytes_per_token
        if value <= 0:
            raise ConfigError(f"--capacity {item!r} must be positive")
        out[kind] = value
    return out


def parse_prices(items: list[str], base: PriceTable) -> PriceTable:
    by_model = dict(base.by_model)
    default = base.default
    for item in items:
        model, sep, numbers = item.partition("=")
        try:
            values = [float(v) for v in numbers.split(",")]
        except ValueError:
            values = []
        if not sep or not model or not 2 <= len(values) <= 4:
            raise ConfigError(
                f"--price {item!r}: expected MODEL=INPUT,OUTPUT[,CACHED[,WRITE]] in USD/1M"
            )
        price = Price(*values)
        if model == "*":
            default = price
        else:
            by_model[model] = price
    return PriceTable(by_model=by_model, default=default)


def semantic_options(
    args: argparse.Namespace, settings: Settings
) -> tuple[SemanticOptions | None, str]:
    """The near-duplicate options, or None and why near-duplicates are not measured."""
    s = settings.semantic
    if args.no_semantic:
        return None, "turned off (--no-semantic)"
    if args.semantic_threshold is not None:
        source, threshold = "--semantic-threshold", args.semantic_threshold
    elif s.threshold is not None:
        source, threshold = f"[semantic] threshold in {args.config}", s.threshold
    elif not available("semantic"):  # the default only: asked for, it is an error below
        return None, "the semantic extra is not installed (pip install 'infercache[semantic]')"
    else:
        if args.embedder not in (None, "minilm"):
            raise ConfigError(
                "the packaged calibration is for the minilm embedder: give --semantic-threshold "
                f"(calibrated with `infercache tune`) to use {args.embedder}"
            )
        from infercache.analyze.near_duplicates.default_matcher import load_default_matcher

        return load_default_matcher().options, ""
    require("semantic", f"near-duplicates ({source})")
    embedder = args.embedder or s.embedder
    return SemanticOptions(threshold, source, embedder=embedder, guards=s.guards, k=s.k), ""


def options_from(args: argparse.Namespace, settings: Settings) -> tuple[AnalyzeOptions, str]:
    capacity = parse_capacity(args.capacity, args.kv_bytes_per_token)
    semantic, off = semantic_options(args, settings)
    if semantic is not None and "semantic" in capacity:
        semantic = replace(semantic, max_vectors=capacity["semantic"])
    options = AnalyzeOptions(
        ttl_s=args.ttl_s if args.ttl_s is not None else settings.default_ttl_s,
        exact_capacity_bytes=capacity.get("exact", settings.max_store_bytes),
        prefix_capacity_tokens=capacity.get("prefix"),
        kv_disk_tokens=capacity.get("disk"),
        min_prefix_share=args.min_prefix_share,
        block_tokens=args.block_tokens,
        share_prefix_across_tenants=args.share_prefix_across_tenants,
        census_capacity_tokens=args.census_max_tokens,
        census_max_identities=args.census_max_identities,
        semantic=semantic,
        upstream=UpstreamProfile.parse(args.upstream_profile),
        sweep=args.sweep if args.sweep is not None else args.format == "html",
        by=args.by,
        seed=args.seed,
    )
    return options, off


def rules_from(args: argparse.Namespace) -> RecommendRules:
    if not 0 < args.min_prefix_saving < 1:
        raise ConfigError(f"--min-prefix-saving must be in (0, 1), got {args.min_prefix_saving}")
    return RecommendRules(min_prefix_saving=args.min_prefix_saving)
