"""What `infercache tune` does with its files (cli.py parses and prints; this module decides).

- pairs files → `calibrate.tune` / `calibrate.evaluate`, pair by pair;
- labelled texts → simulated lookups (`cache_sim`), with the plain cosine matcher, or with a
  matcher fitted on part of the texts (`--fit`, fit.py) and calibrated on the rest;
- `eval --config FILE` rebuilds the embedder, matcher, threshold and guards a written config
  serves (setup.py) and measures them on the files.
Every report is a dict with the keys `pairs`, `positives`, `negatives`, `hits`,
`false_hits`, `hit_rate`, `false_hit_rate`, `false_hit_upper`, `threshold`, `guards` and
`embedder_name` (plus `kind`, "pairs" or "lookups", and what the mode adds).
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from infercache.errors import ConfigError
from infercache.semantic.embedder import Embedder
from infercache.semantic.guards import Guard, build_guards, default_guards
from infercache.semantic.matcher import CosineMatcher, Matcher, NearbyAnswer
from infercache.semantic.tuning.config_file import PLAIN_MIN_SEEN, write_config
from infercache.semantic.tuning.intents import FileKind, LabelledText, file_kind, read_labelled
from infercache.semantic.tuning.pairs import Pair
from infercache.semantic.tuning.progress import ProgressBar, Reporting, progress_bar
from infercache.semantic.tuning.request_log import LoggedTexts
from infercache.semantic.tuning.tune_log import on_log, replay_log, tune_log

if TYPE_CHECKING:
    from infercache.semantic.tuning.calibrate import ScoredPair

SCALES = {"cosine": "cosine similarity", "fitted": "fitted match probability"}


def tune_files(args: argparse.Namespace, files: list[str]) -> dict[str, Any]:
    check_modes(args, evaluating=False)
    target = 0.01 if args.target_false_hit is None else args.target_false_hit
    kind = _kind(files)
    guards = parse_guards(args.guards)
    base = build_base(args.embedder, args.threads)
    if kind == "pairs" and args.fit:
        raise ConfigError("--fit needs intent-labelled texts (text,label) or a log, not pairs")
    with progress_bar() as bar:
        if kind == "log":

            def tuned(logged: LoggedTexts) -> dict[str, Any]:
                return tune_log(args, logged, base, guards, target, _ood(args), bar.update)

            report = on_log(args, files, base, tuned)
        elif kind == "pairs":
            report = _tune_pairs(args, files, Reporting(base, bar.update), guards, target)
        elif args.fit:
            report = _fit(args, _labelled(files), base, guards, target, bar)
        else:
            rows = _labelled(files)
            matcher = CosineMatcher(min_seen=PLAIN_MIN_SEEN)
            report = _replayed(rows, base, matcher, guards, _ood(args), bar.update, target)
            report["min_seen"] = PLAIN_MIN_SEEN
    report.update(
        embedder=args.embedder,
        embedder_name=report.get("embedder_name", base.name),
        target_false_hit=target,
        files=files,
    )
    if args.write_config is not None:
        write_config(args.write_config, report)
    return report


def evaluate_files(args: argparse.Namespace, files: list[str]) -> dict[str, Any]:
    check_modes(args, evaluating=True)
    if not files:
        raise ConfigError("`infercache tune eval` needs at least one PAIRS file")
    kind = _kind(files)
    if args.config is not None:
        served = load_served(args.config, args.threads)
    else:
        base = build_base(args.embedder, args.threads)
        served = Served(base, CosineMatcher(), args.threshold, parse_guards(args.guards), None)
    embedder, matcher, threshold, guards, matcher_dir = served
    embedder_kind = args.embedder if args.config is None else served_kind(args.config)
    with progress_bar() as bar:
        if kind == "log":

            def replayed(logged: LoggedTexts) -> dict[str, Any]:
                ood = _ood(args)
                return replay_log(
                    logged, embedder, matcher, guards, ood, bar.update, threshold=threshold
                )

            report = on_log(args, files, embedder, replayed)
        elif kind == "pairs":
            reporting = Reporting(embedder, bar.update)
            report = _evaluate_pairs(args, files, reporting, matcher, guards, threshold)
        else:
            rows = _labelled(files)
            ood = _ood(args)
            report = _replayed(rows, embedder, matcher, guards, ood, bar.update, None, threshold)
    report.update(
        embedder=embedder_kind,
        embedder_name=embedder.name,
        matcher=matcher_dir,
        scale=_scale(matcher),
        files=files,
    )
    if args.target is not None:  # the bound tune holds: the false-hit rate's 95% upper bound
        upper = report["false_hit_upper"]
        report.update(
            target_false_hit=args.target, above_target=upper is None or upper > args.target
        )
    return report


class Served(NamedTuple):
    """What a config serves: the matcher's embedder, the matcher, its threshold, the guards."""

    embedder: Embedder
    matcher: Matcher
    threshold: float
    guards: list[Guard]
    matcher_dir: str | None


def load_served(config: Path, threads: int | None = None) -> Served:
    """Rebuild what the `[semantic]` table of `config` serves (setup.py's rules)."""
    from infercache.semantic.from_settings import build_matcher
    from infercache.settings import Settings

    s = Settings.load(environ={}, config_file=config).semantic
    if s.threshold is None:
        raise ConfigError(f"{config} holds no semantic threshold")
    embedder, matcher = build_matcher(s, build_base(s.embedder, threads))
    guards = default_guards() if s.guards is None else build_guards(s.guards)
    return Served(embedder, matcher, s.threshold, guards, s.matcher)


def served_kind(config: Path) -> str:
    from infercache.settings import Settings

    return Settings.load(environ={}, config_file=config).semantic.embedder


def check_modes(args: argparse.Namespace, *, evaluating: bool) -> None:
    """Refuse options that belong to the other mode."""
    if evaluating:
        if args.target_false_hit is not None or args.write_config is not None or args.fit:
            raise ConfigError(
                "--target-false-hit, --write-config and --fit belong to `infercache tune`"
            )
        if (args.threshold is None) == (args.config is None):
            raise ConfigError("`infercache tune eval` needs --threshold X or --config FILE")
    elif args.threshold is not None or args.config is not None:
        raise ConfigError("--threshold and --config belong to `infercache tune eval`")
    elif args.target is not None:
        raise ConfigError("--target belongs to `infercache tune eval` (tune: --target-false-hit)")
    if args.target is not None and not 0 < args.target < 1:
        raise ConfigError(f"--target must lie in (0, 1), got {args.target}")
    if args.target_false_hit is not None and not 0 < args.target_false_hit < 1:
        raise ConfigError(f"--target-false-hit must lie in (0, 1), got {args.target_false_hit}")
    if args.epochs < 1:
        raise ConfigError(f"--epochs must be at least 1, got {args.epochs}")


def parse_guards(spec: str) -> list[Guard]:
    spec = spec.strip()
    if spec == "default":
        return default_guards()
    if spec == "none":
        return []
    return build_guards(s for s in spec.split(",") if s.strip())


def build_base(kind: str, threads: int | None) -> Embedder:
    if kind == "static":
        from infercache.semantic.embedder import StaticEmbedder

        return StaticEmbedder()
    from infercache.semantic.embedder import MiniLMEmbedder

    return MiniLMEmbedder(threads=threads)


def _kind(files: Sequence[str]) -> FileKind | Literal["log"]:
    from infercache.semantic.tuning.request_log import is_request_log

    kinds: set[FileKind | Literal["log"]] = {
        "log" if is_request_log(f) else file_kind(f) for f in files
    }
    if len(kinds) > 1:
        raise ConfigError("pass one kind of file: request logs, pairs or labelled texts")
    return kinds.pop()


def _labelled(files: Sequence[str]) -> list[LabelledText]:
    seen: dict[str, LabelledText] = {}
    for path in files:
        for row in read_labelled(path):
            seen.setdefault(row.text, row)
    return list(seen.values())


def _scale(matcher: Matcher) -> str:
    return SCALES["cosine" if isinstance(matcher, CosineMatcher) else "fitted"]


def _tune_pairs(
    args: argparse.Namespace, files: list[str], base: Embedder, guards: list[Guard], target: float
) -> dict[str, Any]:
    from infercache.semantic.tuning.calibrate import curve, evaluate, plot, score_pairs, tune
    from infercache.semantic.tuning.pairs import read_many

    pairs = read_many(files)
    scored = score_pairs(pairs, base)
    calibration = tune(scored, target_false_hit=target, guards=guards)
    figures = calibration.to_dict()
    floor = _pairs_floor(pairs, base, guards, _ood(args))
    if floor is not None and floor > calibration.threshold:  # unrelated text reaches higher
        figures.update(evaluate(scored, floor, guards=guards).to_dict())
    if args.plot is not None:
        curves = {"with guards": curve(scored, guards=guards)} if guards else {}
        curves["no guards"] = curve(scored)
        plot(curves, args.plot, target_false_hit=target, threshold=figures["threshold"])
    return {
        **figures,
        "floor": floor,
        "kind": "pairs",
        "counted": "pairs",
        "served": None,
        "scale": SCALES["cosine"],
    }


def _pairs_floor(
    pairs: Sequence[Pair], base: Embedder, guards: list[Guard], ood: Sequence[str]
) -> float | None:
    """What the out-of-domain questions reach against the pairs' texts (replay.ood_floor)."""
    from infercache.semantic.tuning.cache_sim import Embedded
    from infercache.semantic.tuning.fit import embed_all
    from infercache.semantic.tuning.replay import ood_floor

    texts = list(dict.fromkeys(t for p in pairs for t in (p.a, p.b)))
    if not ood or not texts:
        return None
    domain = [LabelledText(t, str(i)) for i, t in enumerate(texts)]
    vectors = embed_all(base, [*texts, *ood], None)
    tail = vectors[len(texts) :]
    head = Embedded(domain, vectors[: len(texts)])
    return ood_floor(ood, tail, head, CosineMatcher(), guards, k=8)


def _evaluate_pairs(
    args: argparse.Namespace,
    files: list[str],
    embedder: Embedder,
    matcher: Matcher,
    guards: list[Guard],
    threshold: float,
) -> dict[str, Any]:
    from infercache.semantic.tuning.calibrate import curve, plot
    from infercache.semantic.tuning.pairs import read_many

    scored = score_pairs_with(read_many(files), embedder, matcher)
    if args.plot is not None:
        plot({"pairs": curve(scored, guards=guards)}, args.plot, threshold=threshold)
    from infercache.semantic.tuning.calibrate import evaluate

    return {
        **evaluate(scored, threshold, guards=guards).to_dict(),
        "kind": "pairs",
        "counted": "pairs",
        "served": None,
    }


def score_pairs_with(
    pairs: Sequence[Pair], embedder: Embedder, matcher: Matcher
) -> list[ScoredPair]:
    """Each pair with its matcher score: a pair is a lookup whose cache holds one text (so a
    fitted matcher sees one neighbour, of an unknown answer)."""
    from infercache.semantic.tuning.calibrate import ScoredPair, score_pairs

    return [
        ScoredPair(p.pair, matcher.scores([NearbyAnswer(p.similarity, "")])[0])
        for p in score_pairs(pairs, embedder)
    ]


def _replayed(
    rows: Sequence[LabelledText],
    embedder: Embedder,
    matcher: Matcher,
    guards: list[Guard],
    ood: Sequence[str],
    progress: Callable[[str, int, int], None] | None,
    target: float | None,
    threshold: float | None = None,
) -> dict[str, Any]:
    """Tune (`target`) or measure (`threshold`) by replaying the texts as served traffic."""
    from infercache.semantic.tuning.fit import embed_all
    from infercache.semantic.tuning.replay import ReplayPlan, replay_calibration

    calibration = replay_calibration(
        rows,
        lambda texts: embed_all(embedder, texts, progress),
        matcher,
        guards,
        target_false_hit=target,
        ood=ood,
        plan=ReplayPlan(),
        k=max(8, matcher.k or 0),
        threshold=threshold,
    )
    return {**calibration.to_dict(), "counted": "lookups", "scale": _scale(matcher)}


def _ood(args: argparse.Namespace) -> list[str]:
    """The out-of-domain questions every calibration also sees (`--ood`, default packaged)."""
    from infercache.semantic.tuning.ood import read_ood

    return read_ood(args.ood)


def _fit(
    args: argparse.Namespace,
    rows: list[LabelledText],
    base: Embedder,
    guards: list[Guard],
    target: float,
    bar: ProgressBar,
) -> dict[str, Any]:
    from infercache.semantic.tuning.fit import FitBase, FitOptions, fit_matcher

    out = args.out or _default_out(rows, base, args.epochs)
    options = FitOptions(
        target_false_hit=target, epochs=args.epochs, guards=tuple(guards), ood=tuple(_ood(args))
    )
    result = fit_matcher(
        rows, FitBase(base, args.embedder, out), options=options, progress=bar.update
    )
    return {
        **result.fitted.to_dict(),
        "counted": "lookups",
        "scale": SCALES["fitted"],
        "matcher": str(out.resolve()),
        "embedder_name": result.matcher.name.removeprefix("fitted:"),
        "fit": result.report,
        "plain_cosine": result.plain.to_dict() if result.plain is not None else None,
    }


def _default_out(rows: Sequence[LabelledText], base: Embedder, epochs: int) -> Path:
    from infercache.settings import default_data_dir

    digest = hashlib.sha256(base.name.encode() + str(epochs).encode())
    for row in sorted(rows, key=lambda r: r.text):
        digest.update(f"{row.label}\0{row.text}\0".encode())
    return default_data_dir(os.environ) / "matchers" / f"matcher-{digest.hexdigest()[:12]}"
