"""`infercache analyze LOG...`: census, replay, recommendation, report.

    infercache analyze LOG... [--format text|json|html] [--out PATH] [--ttl-s N]
        [--capacity exact=1GiB,prefix=20000,semantic=100000] [--semantic-threshold X |
        --no-semantic] [--config FILE] [--embedder minilm|static] [--price MODEL=IN,OUT[,CACHED]]
        [--tokenizer smollm2|chars4|DIR] [--min-prefix-tokens N] [--sweep | --no-sweep] ...

Settings come from `Settings.load` (defaults, `--config` TOML, `INFERCACHE_*` environment),
then the flags. The semantic threshold is `--semantic-threshold`, else `[semantic] threshold`
of `--config` (written by `infercache tune --write-config`), else near-duplicates are not
measured and the report says why: a threshold is calibrated, never defaulted.
Capacities: `exact` in bytes of the exact store, `prefix` in tokens of KV (or bytes with a
unit, converted at `--kv-bytes-per-token`), `semantic` in vectors. Sizes take K/M/G (×1000)
and KiB/MiB/GiB (×1024). The sweep (hit rate vs TTL and capacity) runs by default for html.
Exit status 0, or 2 with a one-line message on stderr. Heavy imports happen in the handler.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from infercache.analyze.options import SMOLLM2_KV_BYTES_PER_TOKEN, AnalyzeOptions, SemanticOptions
from infercache.analyze.tokenizing.tokenizers import TOKENIZER_HELP
from infercache.errors import ConfigError, InfercacheError
from infercache.metrics import Price, PriceTable
from infercache.settings import Settings

if TYPE_CHECKING:
    from infercache.semantic.embedder import Embedder

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
        if not sep or kind not in ("exact", "prefix", "semantic"):
            raise ConfigError(
                f"--capacity {item!r}: expected exact=SIZE, prefix=SIZE or semantic=N"
            )
        value, in_bytes = parse_size(size)
        if kind == "prefix" and in_bytes:
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
        if not sep or not model or not 2 <= len(values) <= 3:
            raise ConfigError(f"--price {item!r}: expected MODEL=INPUT,OUTPUT[,CACHED] in USD/1M")
        price = Price(*values)
        if model == "*":
            default = price
        else:
            by_model[model] = price
    return PriceTable(by_model=by_model, default=default)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the `analyze` command to the top-level sub-parsers."""
    p = sub.add_parser(
        "analyze",
        help="census of a traffic log, replay through each strategy, a recommendation",
        description=(
            "Reads request logs (OpenAI request bodies, request records such as the gateway's "
            "request log, or Mooncake-style block-hash traces; gzip accepted), classifies every "
            "request (exact repeat, near-duplicate, shared prefix, unique), replays the log "
            "through the real cache layers and recommends which to turn on."
        ),
    )
    p.add_argument("logs", nargs="+", type=Path, metavar="LOG")
    p.add_argument("--format", choices=("text", "json", "html"), default="text")
    p.add_argument("--out", type=Path, default=None, metavar="PATH", help="default: stdout")
    p.add_argument(
        "--config", type=Path, default=None, help="TOML settings (cache, prices, semantic)"
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: on a terminal, for logs over 8 MB)",
    )
    p.add_argument(
        "--parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read and parse in a second process (default: with 2+ cores, logs over 32 MB)",
    )
    _replay_arguments(p)
    _semantic_arguments(p)
    _census_arguments(p)
    p.set_defaults(handler=handle)


def _replay_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ttl-s", type=float, default=None, help="TTL of the replay (default: config)")
    p.add_argument(
        "--capacity",
        action="append",
        default=[],
        metavar="KIND=SIZE",
        help="exact=BYTES, prefix=TOKENS (or bytes with a unit), semantic=VECTORS",
    )
    p.add_argument("--kv-bytes-per-token", type=int, default=SMOLLM2_KV_BYTES_PER_TOKEN)
    p.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="MODEL=IN,OUT[,CACHED]",
        help="USD per 1M tokens; MODEL * sets the default",
    )
    p.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay at several TTLs and capacities (default: on for html)",
    )


def _semantic_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--semantic-threshold",
        type=float,
        default=None,
        help="calibrated cosine similarity in [-1, 1] (see infercache tune)",
    )
    group.add_argument("--no-semantic", action="store_true", help="skip near-duplicates")
    p.add_argument("--embedder", choices=("minilm", "static"), default=None)


def _census_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", default="smollm2", help=TOKENIZER_HELP)
    p.add_argument("--min-prefix-tokens", type=int, default=256)
    p.add_argument("--block-tokens", type=int, default=512, help="tokens per hash_ids block")
    p.add_argument("--share-prefix-across-tenants", action="store_true")
    p.add_argument(
        "--census-max-tokens",
        type=int,
        default=100_000_000,
        help="memory bound of the census prefix tree, in tokens",
    )
    p.add_argument(
        "--census-max-identities",
        type=int,
        default=8_000_000,
        help="memory bound of the census's exact identities (~110 bytes each)",
    )


def handle(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    try:
        return _run(args, os.environ if environ is None else environ)
    except InfercacheError as exc:
        print(f"infercache analyze: error: {exc.message}", file=sys.stderr)
        return 2


def _semantic(args: argparse.Namespace, settings: Settings) -> tuple[SemanticOptions | None, str]:
    """The semantic options, or None and why near-duplicates are not measured."""
    s = settings.semantic
    if args.no_semantic:
        return None, "turned off (--no-semantic)"
    if args.semantic_threshold is not None:
        source = "--semantic-threshold"
        threshold = args.semantic_threshold
    elif s.threshold is not None:
        source, threshold = f"[semantic] threshold in {args.config}", s.threshold
    else:
        return None, (
            "no calibrated threshold: run `infercache tune PAIRS --write-config FILE` and "
            "pass --config FILE, or give --semantic-threshold"
        )
    embedder = args.embedder or s.embedder
    return SemanticOptions(threshold, source, embedder=embedder, guards=s.guards, k=s.k), ""


def options_from(args: argparse.Namespace, settings: Settings) -> tuple[AnalyzeOptions, str]:
    capacity = parse_capacity(args.capacity, args.kv_bytes_per_token)
    semantic, off = _semantic(args, settings)
    if semantic is not None and "semantic" in capacity:
        semantic = replace(semantic, max_vectors=capacity["semantic"])
    defaults = AnalyzeOptions()
    options = AnalyzeOptions(
        ttl_s=args.ttl_s if args.ttl_s is not None else settings.default_ttl_s,
        exact_capacity_bytes=capacity.get("exact", settings.max_store_bytes),
        prefix_capacity_tokens=capacity.get("prefix", defaults.prefix_capacity_tokens),
        min_prefix_tokens=args.min_prefix_tokens,
        block_tokens=args.block_tokens,
        share_prefix_across_tenants=args.share_prefix_across_tenants,
        census_capacity_tokens=args.census_max_tokens,
        census_max_identities=args.census_max_identities,
        semantic=semantic,
        sweep=args.sweep if args.sweep is not None else args.format == "html",
    )
    return options, off


def _run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from infercache.analyze.analysis import Analyzer
    from infercache.analyze.recommend import recommend
    from infercache.analyze.reports.document import build_report
    from infercache.analyze.tokenizing.tokenizers import load_tokenizer

    settings = Settings.load(environ, args.config)
    settings = replace(settings, prices=parse_prices(args.price, settings.prices))
    options, semantic_off = options_from(args, settings)
    embedder = _embedder(options, settings)
    size = sum(p.stat().st_size for p in args.logs if p.is_file())
    parallel = args.parallel
    if parallel is None:
        parallel = (os.cpu_count() or 1) >= 2 and size > 32 << 20
    analyzer = Analyzer(
        options,
        settings=settings,
        # a partial, not a lambda: the reading process gets it pickled
        tokenizer=functools.partial(load_tokenizer, args.tokenizer, settings.data_dir),
        embedder=embedder,
        parallel=parallel,
        freeze_gc=True,  # a command owns its process
    )
    analysis = _with_progress(analyzer, args)
    for source, line, why in analysis.errors.kept[:5]:
        print(f"infercache analyze: skipped {source}:{line}: {why}", file=sys.stderr)
    if analysis.errors.count > 5:
        print(
            f"infercache analyze: ... {analysis.errors.count} malformed lines in all",
            file=sys.stderr,
        )
    report = build_report(analysis, recommend(analysis, semantic_off=semantic_off or None),
                          semantic_off=semantic_off or None)  # fmt: skip
    _write(report, args)
    return 0


def _embedder(options: AnalyzeOptions, settings: Settings) -> Embedder | None:
    if options.semantic is None:
        return None
    from infercache.semantic.setup import build_embedder

    kind = options.semantic.embedder
    same = kind == settings.semantic.embedder
    s = replace(
        settings.semantic,
        embedder=kind,
        embedder_name=settings.semantic.embedder_name if same else None,
    )
    return build_embedder(s)


def _with_progress(analyzer: Any, args: argparse.Namespace) -> Any:
    total = sum(p.stat().st_size for p in args.logs if p.is_file())
    show = args.progress if args.progress is not None else sys.stderr.isatty() and total > 8 << 20
    if not show:
        return analyzer.run(args.logs)
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    columns = (BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress("analyze", *columns, transient=True) as bar:
        task = bar.add_task("analyze", total=total)
        return analyzer.run(args.logs, progress=lambda n: bar.advance(task, n))


def _write(report: dict[str, Any], args: argparse.Namespace) -> None:
    if args.out is None:
        _render(report, args.format, sys.stdout, color=None)
        return
    try:
        with args.out.open("w", encoding="utf-8") as f:
            _render(report, args.format, f, color=False)
    except OSError as exc:
        raise ConfigError(f"cannot write {args.out}: {exc.strerror or exc}") from exc


def _render(report: dict[str, Any], fmt: str, out: IO[str], *, color: bool | None) -> None:
    if fmt == "json":
        json.dump(report, out, indent=2, ensure_ascii=False)
        out.write("\n")
    elif fmt == "html":
        from infercache.analyze.reports.html_page import render_html

        out.write(render_html(report))
    else:
        from infercache.analyze.reports.text import render_text

        render_text(report, out, color=color)
