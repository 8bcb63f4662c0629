"""`infercache analyze LOG...`: census, replay, recommendation, report.

    infercache analyze LOG... [--format text|json|html|alerts] [--out PATH] [--ttl-s N]
        [--capacity exact=1GiB,prefix=20000,semantic=100000] [--semantic-threshold X |
        --no-semantic] [--config FILE] [--embedder minilm|static]
        [--price MODEL=IN,OUT[,CACHED[,WRITE]]] [--upstream-profile auto|provider|engine|P,D]
        [--tokenizer smollm2|chars4|DIR] [--min-prefix-share F] [--by day|hour]
        [--sweep | --no-sweep] ...
    infercache analyze --compare OLD NEW [same options]

Settings come from `Settings.load` (defaults, `--config` TOML, `INFERCACHE_*` environment),
then the flags. Near-duplicates use the user's calibrated threshold (`--semantic-threshold`,
else `[semantic] threshold` of `--config`, written by `infercache tune --write-config`), else
the packaged public calibration (near_duplicates/default_matcher.py), labelled as such everywhere.
Optional parts (extras.py): without `infercache[semantic]` the default measures no
near-duplicates (the report says why), without `infercache[engine]` tokens are counted with
chars4, and `--format html` needs `infercache[report]`; each asked for explicitly is an error
naming the extra.
Capacities: `exact` in bytes of the exact store, `prefix` in tokens of KV (or bytes with a
unit, converted at `--kv-bytes-per-token`; unbounded by default), `disk` a KV disk tier below
it for the KV sweep (the same units), `semantic` in vectors. Sizes
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
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from infercache.analyze.cost_model import PROFILE_HELP
from infercache.analyze.flags import (
    SMOLLM2_KV_BYTES_PER_TOKEN,
    options_from,
    parse_capacity,
    parse_prices,
    parse_size,
    rules_from,
)
from infercache.analyze.near_duplicates.embedders import embedders
from infercache.analyze.options import AnalyzeOptions
from infercache.errors import ConfigError, InfercacheError
from infercache.extras import available, require
from infercache.settings import Settings
from infercache.tokenizing.tokenizers import TOKENIZER_HELP

if TYPE_CHECKING:
    from infercache.analyze.analysis import Analysis
    from infercache.analyze.reports.document import Report

__all__ = ["parse_capacity", "parse_size", "register"]

FORMATS = ("text", "json", "html", "alerts")


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
    p.add_argument(
        "logs",
        nargs="*",
        type=Path,
        metavar="LOG",
        help="request logs: OpenAI bodies, the gateway's --request-log (redacted too) or "
        "block-hash traces, one JSON a line; .gz too",
    )
    p.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="report format; alerts: Prometheus alerting rules (default text)",
    )
    p.add_argument("--out", type=Path, default=None, metavar="PATH", help="default: stdout")
    p.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        default=None,
        metavar=("OLD", "NEW"),
        help="two reports (--format json) or logs: which recommendation changed, and why "
        "(default: analyze LOG instead)",
    )
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help="TOML settings: [cache], [prices], [semantic] (`tune --write-config`) (default: none)",
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
        "disk=TOKENS (a KV disk tier below it, for the KV sweep; or bytes), semantic=VECTORS",
    )
    p.add_argument(
        "--kv-bytes-per-token",
        type=int,
        default=SMOLLM2_KV_BYTES_PER_TOKEN,
        help="KV cache bytes a token takes, for prefix capacities in bytes (default "
        f"{SMOLLM2_KV_BYTES_PER_TOKEN}, SmolLM2-135M in float32)",
    )
    p.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="MODEL=IN,OUT[,CACHED[,WRITE]]",
        help="USD per 1M tokens (CACHED: prompt tokens served from a prefix cache; WRITE: "
        "written to a provider's prompt cache, as [prices] says), repeatable; "
        "MODEL * prices every model not named (default: none, money figures are 0)",
    )
    p.add_argument("--upstream-profile", default="auto", help=f"{PROFILE_HELP} (default auto)")
    p.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="replay at several TTLs and exact-store sizes (default: on for html)",
    )
    p.add_argument(
        "--by",
        choices=("day", "hour"),
        default=None,
        help="figures per window (default: one window, the whole log)",
    )


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
    p.add_argument(
        "--embedder",
        choices=("minilm", "static"),
        default=None,
        help="near-duplicate embedder (default: --config's, else minilm)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the near-duplicate sample (default 0)"
    )


def _census_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer",
        default=None,
        help=f"{TOKENIZER_HELP}; default smollm2 with infercache[engine] installed, else chars4",
    )
    p.add_argument(
        "--min-prefix-share",
        type=float,
        default=0.5,
        help="a request reusing at least this share of its prompt is shared_prefix (default 0.5)",
    )
    p.add_argument(
        "--min-prefix-saving",
        type=float,
        default=0.10,
        help="recommend KV reuse when it saves at least this share of prompt tokens or "
        "upstream time (default 0.1)",
    )
    p.add_argument(
        "--block-tokens",
        type=int,
        default=512,
        help="tokens per hash_ids block of a block-hash trace (default 512)",
    )
    p.add_argument(
        "--share-prefix-across-tenants",
        action="store_true",
        help="count prefix reuse across tenants (default: within a tenant, as served)",
    )
    p.add_argument(
        "--census-max-tokens",
        type=int,
        default=100_000_000,
        help="memory bound of the census prefix tree, in tokens (default 100000000)",
    )
    p.add_argument(
        "--census-max-identities",
        type=int,
        default=8_000_000,
        help="memory bound of the census's exact identities, ~110 bytes each (default 8000000)",
    )


def handle(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    try:
        return _run(args, os.environ if environ is None else environ)
    except InfercacheError as exc:
        print(f"infercache analyze: error: {exc.message}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from infercache.analyze.reports.document import build_report

    if args.compare is not None:
        if args.logs:
            raise ConfigError("give either LOG... or --compare OLD NEW, not both")
        return _compare(args, environ)
    if not args.logs:
        raise ConfigError("no log file given")
    if args.format == "html":  # checked before the analysis, not after it
        require("report", "the HTML report's plots (--format html)")
    settings, options, semantic_off = _configure(args, environ)
    analysis = _analyse(args.logs, args, settings, options)
    _write(build_report(analysis, semantic_off=semantic_off or None, rules=rules_from(args)), args)
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
    from infercache.tokenizing.tokenizers import load_tokenizer

    embedder, candidates = embedders(options, settings)
    size = sum(p.stat().st_size for p in logs if p.is_file())
    parallel = args.parallel
    if parallel is None:
        parallel = (os.cpu_count() or 1) >= 2 and size > 32 << 20
    analyzer = Analyzer(
        options,
        settings=settings,
        # a partial, not a lambda: the reading process gets it pickled
        tokenizer=functools.partial(load_tokenizer, _tokenizer_spec(args), settings.data_dir),
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


def _tokenizer_spec(args: argparse.Namespace) -> str:
    """The tokenizer asked for; by default the packaged SmolLM2's when the engine extra is
    installed, else chars4 (the report notes that its counts are approximate)."""
    asked: str | None = args.tokenizer
    if asked is None:
        return "smollm2" if available("engine") else "chars4"
    if asked != "chars4":  # the template tokenizers render with transformers
        require("engine", f"--tokenizer {asked}")
    return asked


def _compare(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from infercache.analyze.reports.compare import compare, load_report, render_comparison
    from infercache.analyze.reports.document import build_report

    reports = []
    for path in args.compare:
        report = load_report(path)
        if report is None:
            settings, options, off = _configure(args, environ)
            analysis = _analyse([path], args, settings, options)
            built = build_report(analysis, semantic_off=off or None, rules=rules_from(args))
            report = built.to_dict()
        reports.append(report)
    old, new = args.compare
    comparison = compare(reports[0], reports[1], names=(str(old), str(new)))
    _emit(args, lambda out: render_comparison(comparison, out, fmt=args.format))
    return 0


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


def _write(report: Report, args: argparse.Namespace) -> None:
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


def _render(report: Report, fmt: str, out: IO[str], *, color: bool | None) -> None:
    if fmt == "json":
        json.dump(report.to_dict(), out, indent=2, ensure_ascii=False)
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
