"""The config `tune --write-config` writes: a `[semantic]` TOML table `serve --config` reads.

    write_config(path, report)   threshold, embedder (kind and exact name), target, guards,
                                 floor, the fitted matcher's folder or a plain config's
                                 `min_seen`, and `calibrated_on`
    calibrated_on(report)        one line saying what the threshold was calibrated on: files,
                                 how many lookups or pairs, how they were replayed, how many
                                 were wrong of how many served, the target and its bound, the
                                 floor (`serve --semantic` prints it in its ready line)

JSON string and number literals are valid TOML, so values are written with `json.dumps`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infercache.errors import ConfigError

PLAIN_MIN_SEEN = 2
"""A plain config `tune` writes from labelled texts or a log never serves an answer cached for
one question only (matcher.CosineMatcher): served 300 questions from other domains, a 5%
cosine threshold answered 8, mostly one of them with another's answer (bench/README.md)."""


def write_config(path: Path, report: dict[str, Any]) -> None:
    """A `[semantic]` TOML table. JSON string and number literals are valid TOML."""
    lines = [
        f"# written by `infercache tune` from {report['pairs']} {report['counted']}",
        "[semantic]",
        f"threshold = {report['threshold']!r}",
        f"embedder = {json.dumps(report['embedder'])}",
        f"embedder_name = {json.dumps(report['embedder_name'])}",
        f"target_false_hit = {report['target_false_hit']!r}",
        f"guards = {json.dumps(report['guards'])}",
        f"calibrated_on = {json.dumps(calibrated_on(report))}",
    ]
    if report.get("floor") is not None:
        lines.append(f"floor = {report['floor']!r}")
    if report.get("matcher") is not None:
        lines.append(f"matcher = {json.dumps(report['matcher'])}")
    elif report.get("min_seen", 1) > 1:
        lines.append(f"min_seen = {int(report['min_seen'])}")
    try:
        path.write_text("\n".join([*lines, ""]), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write config {path}: {exc.strerror or exc}") from exc


def calibrated_on(report: dict[str, Any]) -> str:
    """One line saying what the threshold was calibrated on (`serve --semantic` prints it)."""
    upper = report.get("false_hit_upper")
    bound = "n/a" if upper is None else f"{upper:.4f}"
    parts = [
        f"{', '.join(report['files'])}",
        f"{report['pairs']} {report['counted']}",
    ]
    if report.get("kind") == "lookups":
        parts.append(
            f"replayed in order from an empty cache with {report.get('held_out_labels', 0)} "
            f"labels held out and {report.get('ood_in_stream', 0)} out-of-domain questions"
        )
    parts += [
        f"{report['false_hits']} wrong of {report['served']} served"
        if report.get("kind") == "lookups"
        else f"{report['false_hits']} of {report['negatives']} negatives accepted",
        f"target {report['target_false_hit']}, 95% upper bound {bound}",
    ]
    if report.get("floor") is not None:
        parts.append(f"floor {report['floor']:.4f} from {report.get('ood_for_floor')} unrelated")
    return "; ".join(parts)
