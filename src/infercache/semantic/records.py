"""The semantic record: what the layer persists beside an exact entry so that a restart can
rebuild every scope's index without embedding anything again.

Stored under `sem:{exact key}` in the same backend as the exact entry, as an `Entry` whose
response body is compact JSON:

    {"scope", "text", "key", "answer", "embedder", "vector": base64 of the float32 vector's bytes}

`answer` is `answer_digest` of the answer indexed: candidates whose answers are equal agree
(matcher.py), and statistics are kept per answer (answer_stats.py). The record copies the
exact entry's model, version, tags and expiry, so it expires (and is evicted by TTL) with the
answer it indexes. `embedder` is the embedder's `name`: vectors of
another model are not comparable and are skipped on rebuild. Pure.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import orjson

from infercache.semantic.judges import answer_text
from infercache.stores.base import Entry

RECORD_PREFIX = "sem:"


class SemanticRecord(NamedTuple):
    scope: str
    text: str
    key: str  # the exact key whose answer this record indexes
    embedder: str
    vector: npt.NDArray[np.float32]
    answer: str = ""  # answer_digest of the indexed answer ("" in records written before it)


def answer_digest(response: bytes) -> str:
    """A short digest naming an answer: of its text when it has one (judges.answer_text: so two
    responses saying the same thing under different ids agree), else of the whole body."""
    try:
        body = json.loads(response)
        content = answer_text(body) if isinstance(body, dict) else ""
    except (ValueError, AttributeError, TypeError):
        content = ""
    data = content.strip().encode() if content else response
    return hashlib.sha256(data).hexdigest()[:16]


def record_key(key: str) -> str:
    return RECORD_PREFIX + key


def encode_record(record: SemanticRecord, answer: Entry) -> Entry:
    """The record as an `Entry` living and expiring with `answer`, the exact entry it indexes."""
    body = {
        "scope": record.scope,
        "text": record.text,
        "key": record.key,
        "answer": record.answer,
        "embedder": record.embedder,
        "vector": base64.b64encode(record.vector.astype(np.float32).tobytes()).decode(),
    }
    return Entry(
        response=json.dumps(body, separators=(",", ":")).encode(),
        model=answer.model,
        model_version=answer.model_version,
        tags=answer.tags,
        created_at_s=answer.created_at_s,
        expires_at_s=answer.expires_at_s,
        upstream_s=0.0,
        prompt_tokens=0,
        completion_tokens=0,
    )


def decode_record(entry: Entry) -> SemanticRecord:
    """The record an `encode_record` entry holds; `ValueError` if it is not one."""
    try:  # orjson + binascii: 1.4x faster than json + b64decode (a bootstrap decodes all)
        body = orjson.loads(entry.response)
        vector = np.frombuffer(binascii.a2b_base64(body["vector"]), dtype=np.float32)
        return SemanticRecord(
            body["scope"], body["text"], body["key"], body["embedder"], vector,
            body.get("answer", ""),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a semantic record: {exc!r}") from exc
