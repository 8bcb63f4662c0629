"""`infercache tune`: choose the semantic similarity threshold on labelled pairs, or measure one.

    infercache tune PAIRS... [--target-false-hit 0.01] [--format text|json] [--plot FILE.png]
                             [--write-config FILE.toml] [--embedder minilm|static] [--guards ...]
    infercache tune eval PAIRS... --threshold X [--format text|json] [--plot FILE.png] [...]

argparse cannot hold both a positional list and an `eval` sub-command under one parser (the first
file name would be read as a sub-command), so `tune` has one parser whose first positional
selects the mode: `eval` → evaluation, anything else → a pairs file (write `./eval` for a file
named eval). Options belonging to the other mode are rejected, not ignored.

PAIRS files are read by `pairs.read_pairs` (TSV/CSV/JSONL with `a`, `b`, `same`). Exit status: 0,
or 2 with a one-line message on stderr for bad options or files. Heavy imports (torch,
transformers, matplotlib) happen inside the handler.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infercache.errors import ConfigError, InfercacheError

if TYPE_CHECKING:
    from infercache.semantic.calibrate import ScoredPair
    from infercache.semantic.embedder import Embedder
    from infercache.semantic.guards import Guard

EMBEDDERS = ("minilm", "static")
USAGE = (
    "infercache tune PAIRS... [--target-false-hit P] [--write-config FILE] [options]\n"
    "       infercache tune eval PAIRS... --threshold X [options]"
)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the `tune` command (with its `eval` form) to the top-level sub-parsers."""
    parser = sub.add_parser(
        "tune",
        help="tune the semantic-cache similarity threshold on labelled pairs (or `tune eval`)",
        usage=USAGE,
        description=(
            "Pick the lowest cosine-similarity threshold whose false-hit rate (share of "
            "non-equivalent pairs the cache would accept) has a 95% upper bound at or below "
            "the target; `tune eval` reports the same figures for a given threshold. PAIRS are "
            ".tsv/.csv files with a header a,b,same or .jsonl lines {a, b, same}; same is "
            "1/0/true/false/yes/no."
        ),
    )
    parser.add_argument("pairs", nargs="+", metavar="PAIRS", help="labelled pair files")
    parser.add_argument(
        "--target-false-hit",
        type=float,
        default=None,
        metavar="P",
        help="highest acceptable false-hit rate, as a 95%% upper bound (tune; default 0.01)",
    )
    parser.add_argument(
        "--threshold", type=float, default=None, help="cosine similarity in [-1, 1] (eval only)"
    )
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png")
    parser.add_argument(
        "--write-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the tuned [semantic] settings as TOML (tune only)",
    )
    parser.add_argument("--embedder", choices=EMBEDDERS, default="minilm")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads for the minilm embedder"
    )
    parser.add_argument(
        "--guards",
        default="default",
        help="'default', 'none' or a comma list of NAME[:differ|conflict] "
        "(numbers, dates, currencies, negation, entities)",
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    try:
        if args.pairs[0] == "eval":
            return _evaluate(args, args.pairs[1:])
        return _tune(args, args.pairs)
    except InfercacheError as exc:
        print(f"infercache tune: error: {exc.message}", file=sys.stderr)
        return 2


def _tune(args: argparse.Namespace, files: list[str]) -> int:
    if args.threshold is not None:
        raise ConfigError("--threshold belongs to `infercache tune eval`")
    target = 0.01 if args.target_false_hit is None else args.target_false_hit
    from infercache.semantic.calibrate import curve, plot, tune

    scored, guards, embedder = _scored(args, files)
    calibration = tune(scored, target_false_hit=target, guards=guards)
    report = {
        **calibration.to_dict(),
        "embedder": args.embedder,
        "embedder_name": embedder.name,
        "files": files,
    }
    if args.plot is not None:
        curves = {"with guards": curve(scored, guards=guards)} if guards else {}
        curves["no guards"] = curve(scored)
        plot(curves, args.plot, target_false_hit=target, threshold=calibration.threshold)
    if args.write_config is not None:
        _write_config(args.write_config, report)
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        _print_text(report, f"lowest with a 95% upper bound <= {target}")
    return 0


def _evaluate(args: argparse.Namespace, files: list[str]) -> int:
    if args.threshold is None:
        raise ConfigError("`infercache tune eval` needs --threshold X")
    if not files:
        raise ConfigError("`infercache tune eval` needs at least one PAIRS file")
    if args.target_false_hit is not None or args.write_config is not None:
        raise ConfigError("--target-false-hit and --write-config belong to `infercache tune`")
    from infercache.semantic.calibrate import curve, evaluate, plot

    scored, guards, embedder = _scored(args, files)
    evaluation = evaluate(scored, args.threshold, guards=guards)
    report = {
        **evaluation.to_dict(),
        "embedder": args.embedder,
        "embedder_name": embedder.name,
        "files": files,
    }
    if args.plot is not None:
        plot({"pairs": curve(scored, guards=guards)}, args.plot, threshold=args.threshold)
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        _print_text(report, "given")
    return 0


def _scored(
    args: argparse.Namespace, files: list[str]
) -> tuple[list[ScoredPair], list[Guard], Embedder]:
    from infercache.semantic.calibrate import score_pairs
    from infercache.semantic.guards import build_guards, default_guards
    from infercache.semantic.pairs import read_many

    spec = args.guards.strip()
    guards = (
        default_guards()
        if spec == "default"
        else []
        if spec == "none"
        else build_guards(s for s in spec.split(",") if s.strip())
    )
    pairs = read_many(files)
    embedder = _build_embedder(args.embedder, args.threads)
    return score_pairs(pairs, embedder), guards, embedder


def _build_embedder(kind: str, threads: int | None) -> Embedder:
    if kind == "static":
        from infercache.semantic.embedder import StaticEmbedder

        return StaticEmbedder()
    from infercache.semantic.embedder import MiniLMEmbedder

    return MiniLMEmbedder(threads=threads)


def _write_config(path: Path, report: dict[str, Any]) -> None:
    """A `[semantic]` TOML table. JSON string and number literals are valid TOML."""
    lines = [
        f"# written by `infercache tune` from {report['pairs']} pairs",
        "[semantic]",
        f"threshold = {report['threshold']!r}",
        f"embedder = {json.dumps(report['embedder'])}",
        f"embedder_name = {json.dumps(report['embedder_name'])}",
        f"target_false_hit = {report['target_false_hit']!r}",
        f"guards = {json.dumps(report['guards'])}",
        "",
    ]
    try:
        path.write_text("\n".join(lines), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write config {path}: {exc.strerror or exc}") from exc


def _print_text(report: dict[str, Any], how: str) -> None:
    def rate(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.4f}"

    upper = rate(report["false_hit_upper"])
    print(f"threshold       {report['threshold']:.4f}  ({how}; cosine similarity)")
    print(
        f"false-hit rate  {rate(report['false_hit_rate'])}  ({report['false_hits']} of "
        f"{report['negatives']} negatives accepted; 95% upper bound {upper})"
    )
    print(
        f"hit rate        {rate(report['hit_rate'])}  ({report['hits']} of "
        f"{report['positives']} positives accepted)"
    )
    print(f"pairs           {report['pairs']}")
    print(f"guards          {', '.join(report['guards']) or 'none'}")
    print(f"embedder        {report['embedder_name']}")
