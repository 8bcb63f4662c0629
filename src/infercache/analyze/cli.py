"""`infercache analyze LOG...`: census, replay, recommendation, report.

    infercache analyze LOG... [--format text|json|html|alerts] [--out PATH] [--ttl-s N]
        [--capacity exact=1GiB,prefix=20000,semantic=100000] [--semantic-threshold X |
        --no-semantic] [--config FILE] [--embedder minilm|static]
        [--price MODEL=IN,OUT[,CACHED]] [--upstream-profile auto|provider|engine|P,D]
        [--tokenizer smollm2|chars4|DIR] [--min-prefix-share F] [--by day|hour]
        [--sweep | --no-sweep] ...
    infercache analyze --compare OLD NEW [same options]

Settings come from `Settings.load` (defaults, `--config` TOML, `INFERCACHE_*` environment),
then the flags. Near-duplicates use the user's calibrated threshold (`--semantic-threshold`,
else `[semantic] threshold` of `--config`, written by `infercache tune --write-config`), else
the packaged public calibration (default_matcher.py), labelled as such everywhere.
Capacities: `exact` in bytes of the exact store, `prefix` in tokens of KV (or bytes with a
unit, converted at `--kv-bytes-per-token`; unbounded by default), `semantic` in vectors. Sizes
take K/M/G (×1000) and KiB/MiB/GiB (×1024). The sweep (hit rate vs TTL and exact capacity)
runs by default for html. `--compare OLD NEW`: each a report written with `--format json` or a
log to analyse; says which recommendation changed and why (reports/compare.py).
Exit status 0, or 2 with a one-line message on stderr. Heavy imports happen in the handler.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from infercache.analyze.cost_model import PROFILE_HELP, UpstreamProfile
from infercache.analyze.options import AnalyzeOptions, SemanticOptions
from infercache.analyze.tokenizing.tokenizers import TOKENIZER_HELP
from infercache.errors import ConfigError, InfercacheError
from infercache.metrics import Price, PriceTable
from infercache.settings import Settings

if TYPE_CHECKING:
    from infercache.analyze.analysis import Analysis
    from infercache.semantic.embedder import Embedder, Matrix
    from infercache.settings import SemanticSettings

SMOLLM2_KV_BYTES_PER_TOKEN = 46_080  # 30 layers × 3 KV heads × 64 dims × (K, V) × 4 bytes
FORMATS = ("text", "json", "html", "alerts")
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
            "request log, redacted ones included, or Mooncake-style block-hash traces; gzip "
            "accepted), classifies every request (exact repeat, near-duplicate, shared prefix, "
            "unique), replays the log through the real cache layers and recommends which to "
            "turn on."
        ),
    )
    p.add_argument("logs", nargs="*", type=Path, metavar="LOG")
    p.add_argument("--format", choices=FORMATS, default="text")
    p.add_argument("--out", type=Path, default=None, metavar="PATH", help="default: stdout")
    p.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        default=None,
        metavar=("OLD", "NEW"),
        help="two reports (--format json) or logs: which recommendation changed, and why",
    )
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
        help="exact=BYTES, prefix=TOKENS (or bytes with a unit; default unbounded), "
        "semantic=VECTORS",
    )
    p.add_argument("--kv-bytes-per-token", type=int, default=SMOLLM2_KV_BYTES_PER_TOKEN)
    p.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="MODEL=IN,OUT[,CACHED]",
        help="USD per 1M tokens (CACHED: prompt tokens served from a prefix cache); MODEL * "
        "sets the default",
    )
    p.add_argument("--upstream-profile", default="auto", help=PROFILE_HELP)
    p.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay at several TTLs and exact-store sizes (default: on for html)",
    )
    p.add_argument("--by", choices=("day", "hour"), default=None, help="figures per window")


def _semantic_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--semantic-threshold",
        type=float,
        default=None,
        help="calibrated cosine similarity in [-1, 1] (see infercache tune); default: the "
        "packaged public calibration",
    )
    group.add_argument("--no-semantic", action="store_true", help="skip near-duplicates")
    p.add_argument("--embedder", choices=("minilm", "static"), default=None)
    p.add_argument("--seed", type=int, default=0, help="of the near-duplicate sample")


def _census_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", default="smollm2", help=TOKENIZER_HELP)
    p.add_argument(
        "--min-prefix-share",
        type=float,
        default=0.5,
        help="a request reusing at least this share of its prompt is shared_prefix",
    )
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
    """The near-duplicate options, or None and why near-duplicates are not measured."""
    s = settings.semantic
    if args.no_semantic:
        return None, "turned off (--no-semantic)"
    if args.semantic_threshold is not None:
        source, threshold = "--semantic-threshold", args.semantic_threshold
    elif s.threshold is not None:
        source, threshold = f"[semantic] threshold in {args.config}", s.threshold
    else:
        if args.embedder not in (None, "minilm"):
            raise ConfigError(
                "the packaged calibration is for the minilm embedder: give --semantic-threshold "
                f"(calibrated with `infercache tune`) to use {args.embedder}"
            )
        from infercache.analyze.default_matcher import load_default_matcher

        return load_default_matcher().options, ""
    embedder = args.embedder or s.embedder
    return SemanticOptions(threshold, source, embedder=embedder, guards=s.guards, k=s.k), ""


def options_from(args: argparse.Namespace, settings: Settings) -> tuple[AnalyzeOptions, str]:
    capacity = parse_capacity(args.capacity, args.kv_bytes_per_token)
    semantic, off = _semantic(args, settings)
    if semantic is not None and "semantic" in capacity:
        semantic = replace(semantic, max_vectors=capacity["semantic"])
    options = AnalyzeOptions(
        ttl_s=args.ttl_s if args.ttl_s is not None else settings.default_ttl_s,
        exact_capacity_bytes=capacity.get("exact", settings.max_store_bytes),
        prefix_capacity_tokens=capacity.get("prefix"),
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


def _run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from infercache.analyze.reports.document import build_report

    if args.compare is not None:
        if args.logs:
            raise ConfigError("give either LOG... or --compare OLD NEW, not both")
        return _compare(args, environ)
    if not args.logs:
        raise ConfigError("no log file given")
    settings, options, semantic_off = _configure(args, environ)
    analysis = _analyse(args.logs, args, settings, options)
    _write(build_report(analysis, semantic_off=semantic_off or None), args)
    return 0


def _configure(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> tuple[Settings, AnalyzeOptions, str]:
    settings = Settings.load(environ, args.config)
    settings = replace(settings, prices=parse_prices(args.price, settings.prices))
    options, semantic_off = options_from(args, settings)
    return settings, options, semantic_off


def _analyse(
    logs: list[Path], args: argparse.Namespace, settings: Settings, options: AnalyzeOptions
) -> Analysis:
    from infercache.analyze.analysis import Analyzer
    from infercache.analyze.tokenizing.tokenizers import load_tokenizer

    embedder, candidates = _embedders(options, settings)
    size = sum(p.stat().st_size for p in logs if p.is_file())
    parallel = args.parallel
    if parallel is None:
        parallel = (os.cpu_count() or 1) >= 2 and size > 32 << 20
    analyzer = Analyzer(
        options,
        settings=settings,
        # a partial, not a lambda: the reading process gets it pickled
        tokenizer=functools.partial(load_tokenizer, args.tokenizer, settings.data_dir),
        embedder=embedder,
        candidate_embedder=candidates,
        parallel=parallel,
        freeze_gc=True,  # a command owns its process
    )
    analysis: Analysis = _with_progress(analyzer, logs, args)
    for source, line, why in analysis.errors.kept[:5]:
        print(f"infercache analyze: skipped {source}:{line}: {why}", file=sys.stderr)
    if analysis.errors.count > 5:
        print(
            f"infercache analyze: ... {analysis.errors.count} malformed lines in all",
            file=sys.stderr,
        )
    return analysis


def _compare(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from infercache.analyze.reports.compare import compare, load_report, render_comparison
    from infercache.analyze.reports.document import build_report

    reports = []
    for path in args.compare:
        report = load_report(path)
        if report is None:
            settings, options, off = _configure(args, environ)
            report = build_report(
                _analyse([path], args, settings, options), semantic_off=off or None
            )
        reports.append(report)
    old, new = args.compare
    comparison = compare(reports[0], reports[1], names=(str(old), str(new)))
    _emit(args, lambda out: render_comparison(comparison, out, fmt=args.format))
    return 0


class LazyEmbedder:
    """An `Embedder` built on first use: a log without text never loads the model."""

    def __init__(self, build: Callable[[], Embedder], name: str) -> None:
        self._build = build
        self._name = name
        self._built: Embedder | None = None

    def _embedder(self) -> Embedder:
        if self._built is None:
            self._built = self._build()
        return self._built

    @property
    def dim(self) -> int:
        return self._embedder().dim

    @property
    def name(self) -> str:
        return self._built.name if self._built is not None else f"{self._name} (not loaded)"

    def embed(self, texts: Sequence[str]) -> Matrix:
        return self._embedder().embed(texts)


def _embedders(
    options: AnalyzeOptions, settings: Settings
) -> tuple[Embedder | None, Embedder | None]:
    """(the matcher, the fast candidate embedder when sampling), each loaded on first use."""
    s = options.semantic
    if s is None:
        return None, None
    from infercache.semantic.setup import build_embedder

    same = s.embedder == settings.semantic.embedder
    semantic = replace(
        settings.semantic,
        embedder=s.embedder,
        embedder_name=settings.semantic.embedder_name if same and not s.public else None,
    )
    matcher = LazyEmbedder(lambda: _quietly(build_embedder, semantic), s.embedder)
    if s.candidates is None:
        return matcher, None
    fast = replace(semantic, embedder="static", embedder_name=None)
    return matcher, LazyEmbedder(lambda: build_embedder(fast), "static")


def _quietly(build: Callable[[SemanticSettings], Embedder], s: SemanticSettings) -> Embedder:
    """Loading MiniLM draws a progress bar on stderr; a report command keeps stderr for its
    own messages (the setting is process-wide: a command owns its process)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    return build(s)


def _with_progress(analyzer: Any, logs: list[Path], args: argparse.Namespace) -> Any:
    total = sum(p.stat().st_size for p in logs if p.is_file())
    show = args.progress if args.progress is not None else sys.stderr.isatty() and total > 8 << 20
    if not show:
        return analyzer.run(logs)
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    columns = (BarColumn(), DownloadColumn(), TimeRemainingColumn())
    with Progress("analyze", *columns, transient=True) as bar:
        task = bar.add_task("analyze", total=total)
        return analyzer.run(logs, progress=lambda n: bar.advance(task, n))


def _write(report: dict[str, Any], args: argparse.Namespace) -> None:
    _emit(
        args,
        lambda out: _render(report, args.format, out, color=None if args.out is None else False),
    )


def _emit(args: argparse.Namespace, render: Any) -> None:
    if args.out is None:
        render(sys.stdout)
        return
    try:
        with args.out.open("w", encoding="utf-8") as f:
            render(f)
    except OSError as exc:
        raise ConfigError(f"cannot write {args.out}: {exc.strerror or exc}") from exc


def _render(report: dict[str, Any], fmt: str, out: IO[str], *, color: bool | None) -> None:
    if fmt == "json":
        json.dump(report, out, indent=2, ensure_ascii=False)
        out.write("\n")
    elif fmt == "html":
        from infercache.analyze.reports.html_page import render_html

        out.write(render_html(report))
    elif fmt == "alerts":
        from infercache.analyze.reports.alerts import render_alerts

        out.write(render_alerts(report))
    else:
        from infercache.analyze.reports.text import render_text

        render_text(report, out, color=color)
