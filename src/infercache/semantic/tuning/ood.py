"""Which out-of-domain questions a calibration sees (`tune --ood`): the packaged set by default
(semantic/ood_set.py; its sources and licences in semantic/data/README.md), a file
of the user's (a `.csv`/`.tsv` with a `text` column, or plain text, one question a line), or
none (`--ood none`: the report then says no floor was measured)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from infercache.errors import InvalidRequestError
from infercache.semantic.ood_set import ood_texts


def read_ood(spec: str | None) -> list[str]:
    if spec == "none":
        return []
    if spec is None:
        return list(dict.fromkeys(ood_texts()))
    path = Path(spec)
    try:
        return _texts(path.read_text(encoding="utf-8-sig"), path.suffix.lower())
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequestError(f"--ood {path}: cannot read: {exc}") from exc


def _texts(data: str, suffix: str) -> list[str]:
    if suffix in (".csv", ".tsv"):
        reader = csv.DictReader(io.StringIO(data), delimiter="\t" if suffix == ".tsv" else ",")
        if "text" not in (reader.fieldnames or []):
            raise InvalidRequestError(f"an out-of-domain {suffix} file needs a 'text' column")
        texts = [row["text"] for row in reader]
    else:
        texts = data.splitlines()
    return list(dict.fromkeys(t.strip() for t in texts if t.strip()))
