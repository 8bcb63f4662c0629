"""`infercache tune`: calibrate the semantic layer on labelled data, fit a matcher, or measure.

    infercache tune FILE... [--fit] [--target-false-hit 0.01] [--write-config FILE.toml]
                            [--out DIR] [--format text|json] [--plot FILE.png]
                            [--embedder minilm|static] [--guards ...] [--threads N]
    infercache tune eval FILE... (--threshold X | --config FILE.toml) [--target P]
                                 [--format text|json] [...]

FILE is either a pairs file (`pairs.read_pairs`: TSV/CSV/JSONL with a, b, same) or intent-
labelled texts (`intents.read_labelled`: text and label); `intents.file_kind` tells them apart
by their header, and one call takes one kind. Pairs are measured pair by pair (calibrate.py:
false-hit rate = accepted negatives / negatives); labelled texts by simulated lookups
(cache_sim.py: false-hit rate = wrong answers served / answers served).

`--fit` (labelled texts only) fits a matcher on part of the texts and calibrates it on the
rest (fit.py), writes its artefacts under `--out` (default: `{data dir}/matchers/` plus a
digest of the data), and `--write-config` points the `[semantic]` table at them. `tune eval
--config` measures exactly what a written config serves: its embedder, matcher, threshold and
guards.

argparse cannot hold both a positional list and an `eval` sub-command under one parser (the
first file name would be read as a sub-command), so `tune` has one parser whose first
positional selects the mode: `eval` → evaluation, anything else → a file (write `./eval` for a
file named eval). Options belonging to the other mode are rejected, not ignored. Exit status: 0,
or 2 with a one-line message on stderr for bad options or files, or 1 when `tune eval --target P`
finds the false-hit rate's 95% upper bound above P (marked in the report: `above_target`).
Both forms show a progress bar on stderr while they embed, when stderr is a terminal. Heavy
imports (torch, transformers, matplotlib) happen inside the handler.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from infercache.errors import InfercacheError
from infercache.extras import require

EMBEDDERS = ("minilm", "static")
USAGE = (
    "infercache tune PAIRS... [--fit] [--target-false-hit P] [--write-config FILE] [options]\n"
    "       infercache tune eval PAIRS... (--threshold X | --config FILE) [--target P] [options]"
)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add the `tune` command (with its `eval` form) to the top-level sub-parsers."""
    parser = sub.add_parser(
        "tune",
        help="calibrate the semantic cache on labelled pairs or texts, fit a matcher, or measure",
        usage=USAGE,
        description=(
            "Pick the lowest threshold whose false-hit rate has a 95% upper bound at or below "
            "the target; `tune eval` reports the same figures for a threshold or a written "
            "config. Files are pairs (.tsv/.csv with a header a,b,same or .jsonl {a, b, same}; "
            "same is 1/0/true/false/yes/no) or intent-labelled texts (header text,label or "
            ".jsonl {text, label}: the same label means the same answer). --fit fits a matcher "
            "to labelled texts."
        ),
    )
    parser.add_argument(
        "files",
        nargs="+",
        metavar="PAIRS",
        help="pairs (a,b,same) or labelled-text (text,label) files: TSV, CSV or JSONL",
    )
    _target_options(parser)
    _fit_options(parser)
    _output_options(parser)
    _embedding_options(parser)
    parser.set_defaults(handler=handle)


def _target_options(parser: argparse.ArgumentParser) -> None:
    """What to certify (tune) or measure (eval)."""
    parser.add_argument(
        "--target-false-hit",
        type=float,
        default=None,
        metavar="P",
        help="highest acceptable false-hit rate, as a 95%% upper bound (tune; default 0.01)",
    )
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="eval only: the threshold to measure (default: the one --config holds)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="eval only: a config `tune --write-config` wrote, measured as served (default: none)",
    )
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        metavar="P",
        help="eval only: mark a 95%% upper bound on the false-hit rate above P, and exit 1 "
        "(default: no target, exit 0)",
    )


def _fit_options(parser: argparse.ArgumentParser) -> None:
    """A matcher fitted to labelled texts."""
    parser.add_argument("--fit", action="store_true", help="fit a matcher to labelled texts")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where --fit writes the matcher (default: a folder named for its inputs under "
        "<data dir>/matchers/)",
    )
    parser.add_argument(
        "--epochs", type=int, default=30, help="adapter training passes, with --fit (default 30)"
    )


def _output_options(parser: argparse.ArgumentParser) -> None:
    """What tune prints, draws and writes."""
    parser.add_argument(
        "--format", choices=("text", "json"), default="text", help="output (default text)"
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png",
        help="draw the hit and false-hit rates against the threshold (default: no plot)",
    )
    parser.add_argument(
        "--write-config",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the tuned [semantic] settings as TOML, for `serve --config` (tune only; "
        "default: not written)",
    )


def _embedding_options(parser: argparse.ArgumentParser) -> None:
    """How texts are embedded and judged, and what the calibration replays beside them."""
    parser.add_argument(
        "--embedder",
        choices=EMBEDDERS,
        default="minilm",
        help="the packaged all-MiniLM-L6-v2, or a static model (faster, coarser) (default minilm)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads for the minilm embedder (default: torch's, every core)",
    )
    parser.add_argument(
        "--judge",
        choices=("exact", "equality", "embedding"),
        default="embedding",
        help="request logs: which answers count as the same (default embedding)",
    )
    parser.add_argument(
        "--judge-similarity",
        type=float,
        default=0.85,
        metavar="COS",
        help="request logs, --judge embedding: the answers' cosine at or above which they are "
        "the same (default 0.85)",
    )
    parser.add_argument(
        "--ood",
        default=None,
        metavar="FILE|none",
        help="out-of-domain questions every calibration also replays and measures its floor "
        "on (default: the packaged set; a .csv/.tsv with a text column or one per line)",
    )
    parser.add_argument(
        "--guards",
        default="default",
        help="'default', 'none' or a comma list of NAME[:differ|conflict] "
        "(numbers, dates, currencies, negation, entities) (default: 'default')",
    )


def handle(args: argparse.Namespace) -> int:
    from infercache.semantic.tuning.tune import evaluate_files, tune_files

    try:
        require("semantic", "infercache tune")
        if args.plot is not None:
            require("report", "--plot")
        if args.files[0] == "eval":
            report = evaluate_files(args, args.files[1:])
            how = "given"
        else:
            report = tune_files(args, args.files)
            how = f"lowest with a 95% upper bound <= {report['target_false_hit']}"
    except InfercacheError as exc:
        print(f"infercache tune: error: {exc.message}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print_text(report, how)
    return 1 if report.get("above_target") else 0


def print_text(report: dict[str, Any], how: str) -> None:
    def rate(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.4f}"

    upper = rate(report["false_hit_upper"])
    lookups = report.get("kind") == "lookups"
    wrong_of = "answers served wrong" if lookups else "negatives accepted"
    right_of = "answerable lookups served right" if lookups else "positives accepted"
    print(f"threshold       {report['threshold']:.4f}  ({how}; {report['scale']})")
    print(
        f"false-hit rate  {rate(report['false_hit_rate'])}  ({report['false_hits']} of "
        f"{report['served'] if lookups else report['negatives']} {wrong_of}; "
        f"95% upper bound {upper})"
    )
    print(
        f"hit rate        {rate(report['hit_rate'])}  ({report['hits']} of "
        f"{report['positives']} {right_of})"
    )
    print(f"{report['counted']:<15} {report['pairs']}")
    print(f"guards          {', '.join(report['guards']) or 'none'}")
    if "above_target" in report:
        verdict = "ABOVE TARGET" if report["above_target"] else "within target"
        print(f"target          {report['target_false_hit']}  {verdict} (95% upper bound {upper})")
    print(f"embedder        {report['embedder_name']}")
    if report.get("matcher") is not None:
        print(f"matcher         {report['matcher']}")
    plain = report.get("plain_cosine")
    if report.get("fit") is not None:
        print(f"fitted in       {report['fit']['seconds']} s on {report['fit']['split']}")
        if plain is None:
            print("plain cosine    no threshold meets the target on the same lookups")
        else:
            print(
                f"plain cosine    threshold {plain['threshold']:.4f}: hit rate "
                f"{rate(plain['hit_rate'])}, false-hit rate {rate(plain['false_hit_rate'])}"
            )
