"""`tune REQUEST_LOG`: what `infercache tune` does with the gateway's request log (the path the
README leads with; labelled files stay as the second path).

- plain: the log replayed in time order, as served (tuning/replay.py: a cache that starts
  empty, its scopes kept, out-of-domain questions interleaved), with the cosine matcher; the
  threshold certified on every lookup of the log.
- `--fit`: a matcher fitted on the earlier part and calibrated on the later part, cross-fitted
  (tuning/fit_log.py).
- `eval --config`: what a written config serves, replayed on the log.
Labels come from `--judge` (exact, equality, or embedding above `--judge-similarity`:
tuning/request_log.py), the judges shadow mode has.
"""

from __future__ import annotations

import argparse
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infercache.errors import ConfigError
from infercache.semantic.embedder import Embedder
from infercache.semantic.guards import Guard
from infercache.semantic.judges import (
    EmbeddingJudge,
    ExactAnswerJudge,
    Judge,
    NormalisedEqualityJudge,
)
from infercache.semantic.matcher import CosineMatcher, Matcher
from infercache.semantic.tuning.config_file import PLAIN_MIN_SEEN
from infercache.semantic.tuning.request_log import LoggedTexts, read_log

if TYPE_CHECKING:
    from infercache.semantic.tuning.fit_log import LogFitOptions

LogProgress = Callable[[str, int, int], None]


def log_judge(args: argparse.Namespace, base: Embedder) -> Judge:
    if args.judge == "exact":
        return ExactAnswerJudge()
    if args.judge == "equality":
        return NormalisedEqualityJudge()
    if args.judge == "embedding":
        return EmbeddingJudge(base, args.judge_similarity)
    raise ConfigError(f"--judge must be exact, equality or embedding, got {args.judge!r}")


def on_log(
    args: argparse.Namespace,
    files: Sequence[str],
    embedder: Embedder,
    report: Callable[[LoggedTexts], dict[str, Any]],
) -> dict[str, Any]:
    """`report` on the request log `files` (labels from `--judge`), and what was read."""
    logged = read_log(files, log_judge(args, embedder))
    return {**report(logged), **_provenance(args, logged)}


def tune_log(
    args: argparse.Namespace,
    logged: LoggedTexts,
    base: Embedder,
    guards: list[Guard],
    target: float,
    ood: Sequence[str],
    progress: LogProgress,
) -> dict[str, Any]:
    if args.fit:
        from infercache.semantic.tuning.fit_log import LogFitOptions

        options = LogFitOptions(
            target_false_hit=target, epochs=args.epochs, guards=tuple(guards), ood=tuple(ood)
        )
        report = _fit(args, logged, base, options, progress)
    else:
        matcher = CosineMatcher(min_seen=PLAIN_MIN_SEEN)
        report = replay_log(logged, base, matcher, guards, ood, progress, target=target)
        report["min_seen"] = PLAIN_MIN_SEEN
    return report


def replay_log(
    logged: LoggedTexts,
    embedder: Embedder,
    matcher: Matcher,
    guards: list[Guard],
    ood: Sequence[str],
    progress: LogProgress,
    *,
    target: float | None = None,
    threshold: float | None = None,
) -> dict[str, Any]:
    from infercache.semantic.tuning.fit import embed_all
    from infercache.semantic.tuning.replay import ReplayPlan, replay_calibration

    calibration = replay_calibration(
        logged.rows,
        lambda texts: embed_all(embedder, texts, progress),
        matcher,
        guards,
        target_false_hit=target,
        ood=ood,
        plan=ReplayPlan(held_out_share=0.0, ood_share=0.1, shuffle=False),
        k=max(8, matcher.k or 0),
        threshold=threshold,
        scopes=logged.scopes,
    )
    scale = (
        "cosine similarity" if isinstance(matcher, CosineMatcher) else "fitted match probability"
    )
    return {**calibration.to_dict(), "counted": "lookups", "scale": scale}


def _fit(
    args: argparse.Namespace,
    logged: LoggedTexts,
    base: Embedder,
    options: LogFitOptions,
    progress: LogProgress,
) -> dict[str, Any]:
    from infercache.semantic.tuning.fit import FitBase
    from infercache.semantic.tuning.fit_log import fit_log

    out = args.out or _default_out(logged, base, args.epochs)
    fit_base = FitBase(base, args.embedder, out)
    result = fit_log(logged, fit_base, options=options, progress=progress)
    return {
        **result.report,
        "scale": "fitted match probability",
        "matcher": str(out.resolve()),
        "embedder_name": result.matcher.name.removeprefix("fitted:"),
        "fit": {"seconds": result.report["seconds"], "split": result.report["split"]},
    }


def _provenance(args: argparse.Namespace, logged: LoggedTexts) -> dict[str, Any]:
    return {
        "source": "request log",
        "judge": args.judge,
        "log_requests": len(logged.rows),
        "log_lines": logged.lines,
        "log_skipped": logged.skipped,
        "log_labels": len({r.label for r in logged.rows}),
    }


def _default_out(logged: LoggedTexts, base: Embedder, epochs: int) -> Path:
    from infercache.settings import default_data_dir

    digest = hashlib.sha256(f"log\0{base.name}\0{epochs}".encode())
    for row, scope in zip(logged.rows, logged.scopes, strict=True):
        digest.update(f"{scope}\0{row.label}\0{row.text}\0".encode())
    return default_data_dir(os.environ) / "matchers" / f"matcher-{digest.hexdigest()[:12]}"
