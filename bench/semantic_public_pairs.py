"""Adapters from public data sets' native files to labelled `Pair`s. Used by bench/semantic.py
(and tested on small generated files); `infercache tune` reads only the `pairs` formats.

- STS-B (`stsb.tsv`: split, genre, filename, year, id, score 0–5, sentence1, sentence2[, extra]),
  read with quoting off: score ≥ `same_min` (4) → same, ≤ `different_max` (2) → different,
  in between ignored (the graded middle is neither a safe hit nor a clear miss).
- MRPC (`mrpc.tsv`: split, Quality, #1 ID, #2 ID, #1 String, #2 String), quoting off: Quality 1
  → same. (Research-use terms: read it in place, never copy it into the repository.)
- Intent sets: banking77 (`text,category` CSV) and hwu64 (`split,text,intent` TSV, quoting off)
  give `(text, intent)` rows; `intent_pairs` draws pairs from them with an injected RNG: a
  positive is two distinct texts of one intent, a negative two texts of different intents.
- GPTCache mock pairs (JSON list of `{origin, similar}`): positives only.
Every adapter may filter by `splits`; a malformed line raises `ValueError` naming the
file and line.
"""

from __future__ import annotations

import csv
import json
import random
from collections import defaultdict
from collections.abc import Collection, Sequence
from pathlib import Path

from infercache.semantic.tuning.pairs import Pair

IntentRow = tuple[str, str]


def _tsv_rows(path: Path, min_fields: int) -> list[tuple[int, list[str]]]:
    """(line number, fields) of each data row, header skipped, quoting off."""
    rows: list[tuple[int, list[str]]] = []
    with path.open(encoding="utf-8-sig", newline="") as handle:
        for line_number, fields in enumerate(
            csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE), 1
        ):
            if line_number == 1 or not fields:
                continue
            if len(fields) < min_fields:
                raise ValueError(
                    f"{path}:{line_number}: {len(fields)} fields, expected at least {min_fields}"
                )
            rows.append((line_number, fields))
    return rows


def read_stsb(
    path: str | Path,
    *,
    splits: Collection[str] | None = None,
    same_min: float = 4.0,
    different_max: float = 2.0,
) -> list[Pair]:
    path = Path(path)
    pairs: list[Pair] = []
    for line_number, fields in _tsv_rows(path, 8):
        if splits is not None and fields[0] not in splits:
            continue
        try:
            score = float(fields[5])
        except ValueError as exc:
            raise ValueError(f"{path}:{line_number}: score {fields[5]!r} is not a number") from exc
        if score >= same_min:
            pairs.append(Pair(fields[6], fields[7], True))
        elif score <= different_max:
            pairs.append(Pair(fields[6], fields[7], False))
    return pairs


def read_mrpc(path: str | Path, *, splits: Collection[str] | None = None) -> list[Pair]:
    path = Path(path)
    pairs: list[Pair] = []
    for line_number, fields in _tsv_rows(path, 6):
        if splits is not None and fields[0] not in splits:
            continue
        if fields[1] not in ("0", "1"):
            raise ValueError(f"{path}:{line_number}: Quality {fields[1]!r} is not 0 or 1")
        pairs.append(Pair(fields[4], fields[5], fields[1] == "1"))
    return pairs


def read_banking77(path: str | Path) -> list[IntentRow]:
    path = Path(path)
    rows: list[IntentRow] = []
    with path.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle)
        for fields in reader:
            if reader.line_num == 1 or not fields:
                continue
            if len(fields) != 2:
                raise ValueError(f"{path}:{reader.line_num}: expected text,category")
            rows.append((fields[0], fields[1]))
    return rows


def read_hwu64(path: str | Path, *, splits: Collection[str] | None = None) -> list[IntentRow]:
    path = Path(path)
    return [
        (fields[1], fields[2])
        for _, fields in _tsv_rows(path, 3)
        if splits is None or fields[0] in splits
    ]


def read_gptcache_pairs(path: str | Path) -> list[Pair]:
    path = Path(path)
    try:
        items = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg}") from exc
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a JSON list of {{origin, similar}}")
    pairs: list[Pair] = []
    for position, item in enumerate(items):
        if (
            not isinstance(item, dict)
            or not isinstance(item.get("origin"), str)
            or not isinstance(item.get("similar"), str)
        ):
            raise ValueError(f"{path}: item {position} lacks string origin/similar")
        pairs.append(Pair(item["origin"], item["similar"], True))
    return pairs


def intent_pairs(
    rows: Sequence[IntentRow], rng: random.Random, *, count: int, positive_share: float = 0.5
) -> list[Pair]:
    """`count` distinct pairs: `positive_share` of them same-intent, the rest different-intent.
    Intents are drawn in proportion to their number of texts, as traffic would be."""
    if not 0.0 <= positive_share <= 1.0:
        raise ValueError(f"positive_share must be in [0, 1], got {positive_share}")
    by_intent: dict[str, list[str]] = defaultdict(list)
    for text, intent in rows:
        by_intent[intent].append(text)
    multi = {i for i, texts in by_intent.items() if len(set(texts)) > 1}
    if len(by_intent) < 2 or not multi:
        raise ValueError("intent pairs need 2+ intents and one with 2+ distinct texts")
    texts = [text for text, _ in rows]
    intents = [intent for _, intent in rows]
    positives = round(count * positive_share)
    seen: set[tuple[str, str]] = set()
    pairs: list[Pair] = []
    attempts = 0
    while len(pairs) < count and attempts < 50 * count:
        attempts += 1
        want_positive = len(pairs) < positives
        first = rng.randrange(len(rows))
        if want_positive:
            if intents[first] not in multi:
                continue
            a, b = texts[first], rng.choice(by_intent[intents[first]])
        else:
            second = rng.randrange(len(rows))
            if intents[first] == intents[second]:
                continue
            a, b = texts[first], texts[second]
        key = (min(a, b), max(a, b))
        if a == b or key in seen:
            continue
        seen.add(key)
        pairs.append(Pair(a, b, want_positive))
    return pairs
