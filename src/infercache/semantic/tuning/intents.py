"""Intent-labelled texts: the second input `infercache tune` reads (the first is pairs, pairs.py).

A labelled text is a question and a label; two texts with the same label have the same answer
(a support bot's intents, an FAQ's entries). From such a file `tune` can fit a matcher and
simulate a cache to calibrate it (fit.py).

Accepted files, chosen by extension (UTF-8; a leading BOM is ignored):
- `.tsv` / `.csv`: a header naming a `text` column and a `label` column (`intent` or `category`
  are accepted for it; names case-insensitive, any order, extra columns ignored), then one text
  a row. Standard CSV quoting.
- `.jsonl`: one object a line with keys `text` and `label` (or `intent`, `category`).
A text listed twice keeps its first label; empty texts are skipped. A malformed file raises
`InvalidRequestError` naming the file and line.

`file_kind` tells a pairs file from a labelled-texts file by its header (or first JSON line),
so `tune` accepts either without a flag. `split_labelled` divides texts into disjoint parts by
a hash of each text (deterministic, independent of file order), stratified per label.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from infercache.errors import InvalidRequestError
from infercache.semantic.tuning.pairs import COLUMNS as PAIR_COLUMNS
from infercache.semantic.tuning.rows import jsonl_objects, open_table

TEXT = "text"
LABEL_NAMES = ("label", "intent", "category")
FileKind = Literal["pairs", "labelled"]


@dataclass(frozen=True, slots=True)
class LabelledText:
    text: str
    label: str
    """Texts with equal labels have the same answer."""


def file_kind(path: str | Path) -> FileKind:
    """`pairs` (columns a, b, same) or `labelled` (text and label), from the first line."""
    path = Path(path)
    first = _first_line(path)
    if path.suffix.lower() == ".jsonl":
        try:
            keys = set(json.loads(first)) if first.strip() else set()
        except (json.JSONDecodeError, TypeError) as exc:
            raise InvalidRequestError(f"{path}:1: invalid JSON: {exc}") from exc
    else:
        delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
        keys = {h.strip().lower() for h in next(csv.reader([first], delimiter=delimiter), [])}
    if all(c in keys for c in PAIR_COLUMNS):
        return "pairs"
    if TEXT in keys and any(name in keys for name in LABEL_NAMES):
        return "labelled"
    raise InvalidRequestError(
        f"{path}: neither a pairs file (a, b, same) nor labelled texts (text, label); "
        f"found {sorted(keys)}"
    )


def read_labelled(path: str | Path) -> list[LabelledText]:
    """Every labelled text of one file (formats in the module docstring)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".tsv", ".csv", ".jsonl"):
        raise InvalidRequestError(f"{path}: unknown format {suffix!r}; use .tsv, .csv or .jsonl")
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            rows = list(_jsonl(handle, path) if suffix == ".jsonl" else _table(handle, path))
    except OSError as exc:
        raise InvalidRequestError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    seen: dict[str, LabelledText] = {}
    for row in rows:
        if row.text.strip() and row.text not in seen:
            seen[row.text] = row
    if len({r.label for r in seen.values()}) < 2:
        raise InvalidRequestError(f"{path}: labelled texts need at least two labels")
    return list(seen.values())


def split_labelled(
    rows: Sequence[LabelledText], shares: Sequence[float], *, salt: str = ""
) -> list[list[LabelledText]]:
    """Disjoint parts holding about `shares` of each label's texts (shares sum to 1). A text's
    part depends only on sha256(salt + text): the same file always splits the same way."""
    if any(s < 0 for s in shares) or abs(sum(shares) - 1.0) > 1e-9:
        raise ValueError(f"shares must be >= 0 and sum to 1, got {list(shares)}")
    by_label: dict[str, list[LabelledText]] = defaultdict(list)
    for row in rows:
        by_label[row.label].append(row)
    parts: list[list[LabelledText]] = [[] for _ in shares]
    for label in sorted(by_label):
        members = sorted(
            by_label[label], key=lambda r: hashlib.sha256((salt + r.text).encode()).digest()
        )
        start = 0
        cumulative = 0.0
        for index, share in enumerate(shares):
            cumulative += share
            end = len(members) if index == len(shares) - 1 else round(cumulative * len(members))
            parts[index].extend(members[start:end])
            start = end
    return parts


def _first_line(path: Path) -> str:
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            for line in handle:
                if line.strip():
                    return line
    except OSError as exc:
        raise InvalidRequestError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    raise InvalidRequestError(f"{path}: the file is empty")


def _label_key(keys: Sequence[str], where: str) -> str:
    for name in LABEL_NAMES:
        if name in keys:
            return name
    raise InvalidRequestError(f"{where}: no label column; expected one of {', '.join(LABEL_NAMES)}")


def _table(handle: Any, path: Path) -> Iterator[LabelledText]:
    table = open_table(handle, path, tsv=path.suffix.lower() == ".tsv")
    if table is None:
        return
    if TEXT not in table.names:
        raise InvalidRequestError(f"{path}:1: header {table.header!r} lacks a 'text' column")
    text_at = table.names.index(TEXT)
    label_at = table.names.index(_label_key(table.names, f"{path}:1"))
    for _, row in table.rows():
        yield LabelledText(row[text_at], row[label_at].strip())


def _jsonl(handle: Any, path: Path) -> Iterator[LabelledText]:
    for where, item in jsonl_objects(handle, path):
        if not isinstance(item, dict) or not isinstance(item.get(TEXT), str):
            raise InvalidRequestError(f"{where}: expected an object with a string 'text'")
        label = item.get(_label_key(list(item), where))
        if not isinstance(label, str | int):
            raise InvalidRequestError(f"{where}: the label must be a string or an integer")
        yield LabelledText(item[TEXT], str(label).strip())
