"""The rows of the files `tune` reads, every error naming its file and line
(`InvalidRequestError`), for pairs (pairs.py) and labelled texts (intents.py) alike:

    open_table(handle, path, tsv=..)  a CSV (TSV) file's header, lower-cased `names`, then
                                      `rows()`: each non-blank row with its `path:line`; a row
                                      shorter than the header, or what the csv module refuses,
                                      is an error; None for an empty file
    jsonl_objects(handle, path)       each non-blank line's JSON value with its `path:line`;
                                      a line that is not JSON is an error
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infercache.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class Table:
    header: list[str]
    names: list[str]  # the header, stripped and lower-cased
    path: Path
    _reader: Any

    def rows(self) -> Iterator[tuple[str, list[str]]]:
        reader = self._reader
        try:
            for row in reader:
                where = f"{self.path}:{reader.line_num}"
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if len(row) < len(self.names):
                    raise InvalidRequestError(
                        f"{where}: {len(row)} fields, the header has {len(self.names)}"
                    )
                yield where, row
        except csv.Error as exc:
            raise InvalidRequestError(f"{self.path}:{reader.line_num}: {exc}") from exc


def open_table(handle: Any, path: Path, *, tsv: bool, strict: bool = False) -> Table | None:
    reader = csv.reader(handle, delimiter="\t" if tsv else ",", strict=strict)
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise InvalidRequestError(f"{path}:{reader.line_num}: {exc}") from exc
    if header is None:
        return None
    return Table(header, [h.strip().lower() for h in header], path, reader)


def jsonl_objects(handle: Any, path: Path) -> Iterator[tuple[str, Any]]:
    for line_number, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        where = f"{path}:{line_number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(f"{where}: invalid JSON: {exc.msg}") from exc
        yield where, item
