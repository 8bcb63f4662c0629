"""`analyze --compare OLD NEW`: which recommendation changed between two days, and why.

Each side is a report (`--format json`, schema `infercache.analyze/...`) or a log the CLI
analyses first. For each strategy: on or off before and after, the two reasons, and every
figure either reason quotes (recommend.py `Quote`: a path into the report), old → new, the
ones that moved by at least a tenth of a point first. Beside them the census shares and the
prefix token share, old → new. `--format json` prints the comparison as a document; any other
format prints it as text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from infercache.analyze.rules import at, pct

REPORT_SCHEMA_PREFIX = "infercache.analyze/"
STRATEGIES = ("exact", "semantic", "prefix")
CENSUS_FIGURES = (
    ("census", "exact_repeat"),
    ("census", "near_duplicate"),
    ("census", "shared_prefix"),
    ("census", "unique"),
    ("prefix_token_share",),
)


def load_report(path: Path) -> dict[str, Any] | None:
    """The report in `path`, or None when it is not one (then it is a log to analyse)."""
    try:
        with path.open("rb") as f:
            if f.read(1) != b"{":
                return None
            f.seek(0)
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    schema = doc.get("schema")
    ok = isinstance(schema, str) and schema.startswith(REPORT_SCHEMA_PREFIX)
    return doc if ok else None


@dataclass(frozen=True, slots=True)
class Figure:
    path: str
    old: float | None
    new: float | None


@dataclass(frozen=True, slots=True)
class StrategyChange:
    strategy: str
    old_enable: bool
    new_enable: bool
    old_reason: str
    new_reason: str
    figures: tuple[Figure, ...]

    @property
    def changed(self) -> bool:
        return self.old_enable != self.new_enable


@dataclass(frozen=True, slots=True)
class Comparison:
    old: str
    new: str
    old_layering: str
    new_layering: str
    strategies: tuple[StrategyChange, ...]
    census: tuple[Figure, ...]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for row, change in zip(out["strategies"], self.strategies, strict=True):
            row["changed"] = change.changed
        return out


def _value(report: Mapping[str, Any], path: Sequence[str | int]) -> float | None:
    try:
        value = at(report, path)
    except (KeyError, IndexError, TypeError):
        return None
    return float(value) if isinstance(value, int | float) else None


def _reason(report: Mapping[str, Any], strategy: str) -> Mapping[str, Any]:
    for reason in report["recommendation"]["reasons"]:
        if reason["strategy"] == strategy:
            return dict(reason)
    return {"enable": False, "text": "(no reason given)", "quotes": []}


def compare(
    old: Mapping[str, Any], new: Mapping[str, Any], *, names: tuple[str, str] = ("old", "new")
) -> Comparison:
    changes = []
    for strategy in STRATEGIES:
        before, after = _reason(old, strategy), _reason(new, strategy)
        paths: dict[tuple[str | int, ...], None] = {}
        for reason in (before, after):
            for quote in reason.get("quotes", []):
                paths[tuple(quote["path"])] = None
        figures = [Figure(_dotted(p), _value(old, p), _value(new, p)) for p in paths]
        figures.sort(key=lambda f: -abs((f.new or 0.0) - (f.old or 0.0)))
        changes.append(
            StrategyChange(
                strategy,
                bool(before["enable"]),
                bool(after["enable"]),
                str(before["text"]),
                str(after["text"]),
                tuple(figures),
            )
        )
    census = tuple(Figure(_dotted(p), _value(old, p), _value(new, p)) for p in CENSUS_FIGURES)
    return Comparison(
        names[0],
        names[1],
        old["recommendation"]["layering"],
        new["recommendation"]["layering"],
        tuple(changes),
        census,
    )


def _dotted(path: Sequence[str | int]) -> str:
    return ".".join(str(p) for p in path)


def _shown(path: str, value: float | None) -> str:
    if value is None:
        return "—"
    if (
        path.endswith(("share", "rate", "exact_repeat", "near_duplicate", "unique"))
        or ".interval." in path
    ):
        return pct(value)
    return f"{value:,.4g}"


def render_comparison(comparison: Comparison, out: IO[str], *, fmt: str = "text") -> None:
    if fmt == "json":
        json.dump(comparison.to_dict(), out, indent=2, ensure_ascii=False)
        out.write("\n")
        return
    c = comparison
    out.write(f"infercache analyze --compare\n  old: {c.old}\n  new: {c.new}\n")
    same = c.old_layering == c.new_layering
    out.write(
        f"Recommendation: {c.old_layering} → {c.new_layering}"
        + (" (unchanged)\n" if same else "\n")
    )
    for change in c.strategies:
        state = {True: "on", False: "off"}
        verdict = (
            f"{state[change.old_enable]} → {state[change.new_enable]}"
            if change.changed
            else f"{state[change.new_enable]} (unchanged)"
        )
        out.write(f"\n{change.strategy}: {verdict}\n")
        if change.changed or change.old_reason != change.new_reason:
            out.write(f"  before: {change.old_reason}\n  after:  {change.new_reason}\n")
        moved = [f for f in change.figures if _moved(f)]
        for figure in moved[:6]:
            out.write(
                f"  {figure.path}: {_shown(figure.path, figure.old)} → "
                f"{_shown(figure.path, figure.new)}\n"
            )
    out.write("\nCensus:\n")
    for figure in c.census:
        out.write(
            f"  {figure.path}: {_shown(figure.path, figure.old)} → "
            f"{_shown(figure.path, figure.new)}\n"
        )


def _moved(figure: Figure) -> bool:
    if figure.old is None or figure.new is None:
        return figure.old != figure.new
    scale = max(abs(figure.old), abs(figure.new), 1e-12)
    return abs(figure.new - figure.old) >= (0.001 if scale <= 1 else 0.001 * scale)
