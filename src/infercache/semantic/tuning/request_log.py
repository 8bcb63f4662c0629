"""`tune REQUEST_LOG`: the deployment's own traffic as the training data.

The gateway's request log (`serve --request-log`, one JSON line per request with its `request`
body and its `response`; semantic off, or in shadow) is read in time order (`read_log`):
- kept: chat requests answered 200 with an answer text, whose last message is user text
  (`scope.query_of`); a redacted line has no text and is refused as a whole file;
- left out: semantic hits (their answer was another question's, not a label of this one) and
  every line the layer does not apply to;
- each kept request has its exact scope (tenant, model, system prompt, earlier turns,
  parameters: scope.py) and the text compared by meaning.
Labels (`label_answers`): requests in one scope whose answers a judge calls the same share a
label — the judges shadow mode has (judges.py): `exact` answer text, `equality` after
normalising, or `embedding` (answers' cosine at or above the judge's similarity, and not one
answer with a few words swapped: `EmbeddingJudge`). With the embedding judge each answer joins
the first earlier label whose first answer it matches (one pass, in time order).
The result is a `LoggedTexts`: labelled texts in time order, one scope each; an exact repeat
(same scope and text) is kept, as served traffic has it (the replay skips it as an exact hit).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infercache.errors import InfercacheError, InvalidRequestError
from infercache.request import parse_request
from infercache.semantic.judges import EmbeddingJudge, Judge, answer_text
from infercache.semantic.scope import query_of
from infercache.semantic.tuning.intents import LabelledText
from infercache.versions import UNVERSIONED, VersionView

ANY_VERSION = VersionView(UNVERSIONED, ())
NOT_LABELS = frozenset({"semantic-hit"})


@dataclass(frozen=True, slots=True)
class Logged:
    timestamp_s: float
    scope: str
    text: str
    answer: dict[str, Any]  # the response body


@dataclass(frozen=True, slots=True)
class LoggedTexts:
    rows: list[LabelledText]  # in time order
    scopes: list[str]  # one per row
    timestamps_s: list[float]
    lines: int  # lines read
    skipped: int  # lines not usable (errors, other endpoints, semantic hits, no text)


def is_request_log(path: str | Path) -> bool:
    """Whether the first line of a `.jsonl` file is a request-log line."""
    path = Path(path)
    if path.suffix.lower() not in (".jsonl", ".gz") and not path.name.endswith(".jsonl.gz"):
        return False
    for line in _lines(path):
        try:
            first = json.loads(line)
        except json.JSONDecodeError:
            return False
        return isinstance(first, dict) and "timestamp" in first and "layer" in first
    return False


def read_log(paths: Sequence[str | Path], judge: Judge) -> LoggedTexts:
    """Every usable request of the logs in time order, labelled by `judge` (module docstring)."""
    logged: list[Logged] = []
    lines = 0
    for path in paths:
        for number, line in enumerate(_lines(Path(path)), start=1):
            lines += 1
            entry = _logged(line, f"{path}:{number}")
            if entry is not None:
                logged.append(entry)
    if not logged:
        raise InvalidRequestError(
            f"{', '.join(map(str, paths))}: no usable request in {lines} lines (a request log "
            f"of chat requests answered 200, with request and response text, is needed)"
        )
    logged.sort(key=lambda e: e.timestamp_s)  # stable: equal stamps keep file order
    labels = label_answers(logged, judge)
    return LoggedTexts(
        rows=[LabelledText(e.text, label) for e, label in zip(logged, labels, strict=True)],
        scopes=[e.scope for e in logged],
        timestamps_s=[e.timestamp_s for e in logged],
        lines=lines,
        skipped=lines - len(logged),
    )


def label_answers(logged: Sequence[Logged], judge: Judge) -> list[str]:
    """One label per request: requests of one scope whose answers `judge` calls the same share
    one (each answer compared with the first answer of every earlier label of its scope)."""
    if isinstance(judge, EmbeddingJudge):  # one batched pass instead of two texts per call
        judge.remember([answer_text(e.answer) for e in logged])
    firsts: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    by_text: dict[tuple[str, str], str] = {}
    labels = []
    for entry in logged:
        text = answer_text(entry.answer).strip()
        known = by_text.get((entry.scope, text))
        if known is None:
            known = _match(entry, firsts.setdefault(entry.scope, []), judge)
            by_text[(entry.scope, text)] = known
        labels.append(known)
    return labels


def _match(entry: Logged, firsts: list[tuple[str, dict[str, Any]]], judge: Judge) -> str:
    request = {"messages": [{"role": "user", "content": entry.text}]}
    for label, answer in firsts:
        if judge.same(request, answer, entry.answer):
            return label
    label = f"{entry.scope[-12:]}#{len(firsts)}"
    firsts.append((label, entry.answer))
    return label


def _logged(line: str, where: str) -> Logged | None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"{where}: not JSON: {exc.msg}") from exc
    if not isinstance(record, dict):
        raise InvalidRequestError(f"{where}: not a request-log line")
    if "redaction" in record or "key_digest" in record:
        raise InvalidRequestError(
            f"{where}: a redacted log holds no text to learn from; log without --redact"
        )
    body, response = record.get("request"), record.get("response")
    if record.get("status") != 200 or record.get("layer") in NOT_LABELS:
        return None
    if not isinstance(body, dict) or not isinstance(response, dict):
        return None
    if not answer_text(response).strip():
        return None
    try:
        request = parse_request(body, tenant=record.get("tenant") or None)
    except InfercacheError:
        return None
    query = query_of(request, ANY_VERSION)
    if query is None:
        return None
    return Logged(float(record.get("timestamp") or 0.0), query.scope, query.text, response)


def _lines(path: Path) -> Iterator[str]:
    import gzip

    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    yield line
    except OSError as exc:
        raise InvalidRequestError(f"{path}: cannot read: {exc.strerror or exc}") from exc
