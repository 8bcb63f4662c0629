"""Labelled text pairs for threshold tuning: the file formats `infercache tune` reads.

A pair is two texts and whether one's cached answer may serve the other (`same`).

Accepted files, chosen by extension (UTF-8; a leading BOM is ignored):
- `.tsv` / `.csv`: a header row naming the columns `a`, `b`, `same` (any order, any extra
  columns ignored, names case-insensitive), then one pair a row. Standard CSV quoting (`"..."`,
  `""` for a quote) for both, so a text may hold tabs, commas or newlines.
- `.jsonl`: one JSON object a line with keys `a`, `b`, `same`; blank lines are skipped.
- `same` is one of 1, 0, true, false, yes, no (case-insensitive; JSON booleans and the numbers
  1 and 0 too).
A malformed file raises `InvalidRequestError` naming the file and line; a file with no pairs too.

The public data sets' native forms are read by the bench's own adapters
(bench/semantic_public_pairs.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infercache.errors import InvalidRequestError
from infercache.semantic.tuning.rows import jsonl_objects, open_table

_TRUE = {"1", "true", "yes"}
_FALSE = {"0", "false", "no"}
COLUMNS = ("a", "b", "same")


@dataclass(frozen=True, slots=True)
class Pair:
    a: str
    b: str
    same: bool
    """True when a cached answer to `a` is a right answer to `b` (and back)."""


def parse_same(value: object, where: str) -> bool:
    """A `same` cell as a bool, or `InvalidRequestError` naming `where` and the value."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    text = str(value).strip().lower() if isinstance(value, str) else None
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidRequestError(
        f"{where}: 'same' must be one of 1,0,true,false,yes,no; got {value!r}"
    )


def read_pairs(path: str | Path) -> list[Pair]:
    """Every pair in one file (formats in the module docstring)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".tsv", ".csv", ".jsonl"):
        raise InvalidRequestError(
            f"{path}: unknown pairs format {suffix!r}; use .tsv, .csv or .jsonl"
        )
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            rows = list(
                _jsonl_rows(handle, path)
                if suffix == ".jsonl"
                else _table_rows(handle, path, suffix)
            )
    except OSError as exc:
        raise InvalidRequestError(f"{path}: cannot read pairs: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from exc
    if not rows:
        raise InvalidRequestError(f"{path}: no pairs found")
    return rows


def read_many(paths: Sequence[str | Path]) -> list[Pair]:
    """The pairs of several files, in order."""
    return [pair for path in paths for pair in read_pairs(path)]


def _table_rows(handle: Any, path: Path, suffix: str) -> Iterator[Pair]:
    table = open_table(handle, path, tsv=suffix == ".tsv", strict=True)
    if table is None:
        return
    missing = [c for c in COLUMNS if c not in table.names]
    if missing:
        raise InvalidRequestError(
            f"{path}:1: header {table.header!r} lacks column(s) {', '.join(missing)}; "
            f"expected {', '.join(COLUMNS)}"
        )
    at = [table.names.index(c) for c in COLUMNS]
    for where, row in table.rows():
        yield Pair(row[at[0]], row[at[1]], parse_same(row[at[2]], where))


def _jsonl_rows(handle: Any, path: Path) -> Iterator[Pair]:
    for where, item in jsonl_objects(handle, path):
        if not isinstance(item, dict) or any(k not in item for k in COLUMNS):
            raise InvalidRequestError(f"{where}: expected an object with keys a, b, same")
        a, b = item["a"], item["b"]
        if not isinstance(a, str) or not isinstance(b, str):
            raise InvalidRequestError(f"{where}: 'a' and 'b' must be strings")
        yield Pair(a, b, parse_same(item["same"], where))
