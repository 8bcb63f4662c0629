"""An embeddings request as the cache sees it, and the pure steps around the upstream call.

- `parse_embedding_request`: validate the body, split off the `infercache` directives (the
  rules of request.py), list the inputs (a string, strings, a token array or token arrays) and
  key each one:
      "ie1:" + sha256(canonical_json({tenant, context, tags, input, request: every
      output-affecting field but `input`: model, dimensions, encoding_format (absent =
      "float"), unknown fields too}))
  The model version is not hashed in: as in the exact layer, the entry records it and every
  read compares (versions.py), so a swap is one O(1) write.
- `EmbeddingLookup.upstream_body`: the body with only the distinct missing inputs, in order.
- `fetched_vectors`: the upstream's answer for them, checked (an UpstreamError when malformed),
  with each input's share of the tokens and seconds the upstream reported for the whole call,
  shared by input length (characters of a string, ids of a token array: exact for token
  arrays) with largest remainders, so the shares sum to the total.
- `merge`: every input's vector in request order; usage = the sum of each input's tokens, as if
  the upstream had embedded all n.

No I/O, no clock: embedding_cache.py does the store reads and writes around these.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infercache.client_values import missing, shown
from infercache.errors import InvalidRequestError, UpstreamError
from infercache.keys import IGNORABLE_FIELDS, canonical_json, normalised_body
from infercache.request import DIRECTIVES_FIELD, Directives, parse_directives
from infercache.versions import VersionView

EMBEDDING_KEY_PREFIX = "ie1:"  # the key-schema version: bump whenever `embedding_key` changes
STRATEGY = "embeddings"  # the metrics strategy these lookups are counted under

# One input: a string, or a token array (kept as a tuple so it can be hashed and compared).
EmbeddingInput = str | tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    body: Mapping[str, Any]  # what the upstream receives: directives stripped
    directives: Directives
    inputs: tuple[EmbeddingInput, ...]  # in request order, duplicates kept
    keys: tuple[str, ...]  # one per input
    single: bool  # `input` was one string or one token array, not a list of them

    @property
    def model(self) -> str:
        model: str = self.body["model"]
        return model


@dataclass(frozen=True, slots=True)
class CachedVector:
    embedding: Any  # a list of floats or a base64 string, as the upstream returned it
    model: str  # the model the upstream named in its answer
    prompt_tokens: int
    upstream_s: float
    age_s: float


@dataclass(frozen=True, slots=True)
class EmbeddingLookup:
    request: EmbeddingRequest
    view: VersionView | None  # None: the store could not be read; nothing will be stored
    found: Mapping[str, CachedVector]  # key → its fresh entry
    missing: tuple[int, ...]  # the first position of each distinct key not found

    @property
    def hits(self) -> int:
        """Inputs served from the store."""
        return sum(1 for key in self.request.keys if key in self.found)

    @property
    def upstream_body(self) -> dict[str, Any] | None:
        """The body to send upstream: only the missing inputs (None: nothing to fetch)."""
        if not self.missing:
            return None
        items = [_wire(self.request.inputs[i]) for i in self.missing]
        sent: Any = items[0] if self.request.single else items
        return {**self.request.body, "input": sent}


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    response: dict[str, Any]  # the embeddings answer for every input, in request order
    hits: int  # inputs served from the store
    fetched: int  # distinct inputs the upstream embedded
    stored: int  # vectors written to the store


def _wire(item: EmbeddingInput) -> str | list[int]:
    return item if isinstance(item, str) else list(item)


def _is_token_array(value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def _inputs(raw: object) -> tuple[tuple[EmbeddingInput, ...], bool]:
    """(the inputs, whether `input` was a single one)."""
    if isinstance(raw, str):
        return (raw,), True
    if _is_token_array(raw):
        assert isinstance(raw, list)
        return (tuple(raw),), True
    if isinstance(raw, list) and raw and all(isinstance(s, str) for s in raw):
        return tuple(raw), False
    if isinstance(raw, list) and raw and all(_is_token_array(t) for t in raw):
        return tuple(tuple(t) for t in raw), False
    raise InvalidRequestError(
        "'input' must be a string, a non-empty list of strings, a token array or a list of "
        f"token arrays, got {shown(raw)}",
        param="input",
    )


def _validate(body: Mapping[str, Any]) -> None:
    model = body.get("model")
    if model is None:
        raise InvalidRequestError(missing("model"), param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError(
            f"'model' must be a non-empty string, got {shown(model)}", param="model"
        )
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise InvalidRequestError(
            f"'dimensions' must be an integer >= 1, got {shown(dimensions)}", param="dimensions"
        )
    fmt = body.get("encoding_format")
    if fmt is not None and fmt not in ("float", "base64"):
        raise InvalidRequestError(
            f"'encoding_format' must be 'float' or 'base64', got {shown(fmt)}",
            param="encoding_format",
        )


def embedding_key(fields: Mapping[str, Any], directives: Directives, item: EmbeddingInput) -> str:
    """The key of one input: `fields` is the normalised body without `input`."""
    payload = {
        "tenant": directives.tenant,
        "context": directives.context_fingerprint,
        "tags": list(directives.tags),
        "request": fields,
        "input": item,
    }
    return EMBEDDING_KEY_PREFIX + hashlib.sha256(canonical_json(payload)).hexdigest()


def parse_embedding_request(
    body: object,
    *,
    tenant: str | None = None,
    ignorable: frozenset[str] = IGNORABLE_FIELDS,
) -> EmbeddingRequest:
    """Validate an embeddings body and key each input. Pure. `tenant`, when given (an
    authenticated caller), overrides the tenant claimed in the body."""
    if not isinstance(body, dict):
        raise InvalidRequestError(f"the request body must be a JSON object, got {shown(body)}")
    _validate(body)
    directives = parse_directives(body.get(DIRECTIVES_FIELD), tenant)
    upstream_body = {k: v for k, v in body.items() if k != DIRECTIVES_FIELD}
    inputs, single = _inputs(upstream_body.get("input"))
    fields = normalised_body({k: v for k, v in upstream_body.items() if k != "input"}, ignorable)
    fields.setdefault("encoding_format", "float")  # the API's default when absent
    keys = tuple(embedding_key(fields, directives, item) for item in inputs)
    return EmbeddingRequest(upstream_body, directives, inputs, keys, single)


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """`total` split in proportion to `weights` (largest remainders): the parts sum to it."""
    if not weights:
        return []
    weight_sum = sum(weights)
    if weight_sum <= 0:
        weights, weight_sum = [1] * len(weights), len(weights)
    exact = [total * w / weight_sum for w in weights]
    parts = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: parts[i] - exact[i])
    for i in by_remainder[: total - sum(parts)]:
        parts[i] += 1
    return parts


def _weight(item: EmbeddingInput) -> int:
    return max(1, len(item))


def fetched_vectors(
    lookup: EmbeddingLookup, response: Mapping[str, Any], upstream_s: float
) -> dict[str, CachedVector]:
    """The upstream's answer for the missing inputs, by key; UpstreamError when malformed."""
    data = response.get("data")
    sent = len(lookup.missing)
    if not isinstance(data, list) or len(data) != sent:
        raise UpstreamError(f"the upstream answered {sent} embedding input(s) malformed")
    by_index: dict[int, Any] = {}
    for item in data:
        index = item.get("index") if isinstance(item, dict) else None
        vector = item.get("embedding") if isinstance(item, dict) else None
        if not isinstance(index, int) or not 0 <= index < sent or index in by_index:
            raise UpstreamError("the upstream's embeddings answer has bad indexes")
        if not isinstance(vector, list | str):
            raise UpstreamError("the upstream's embeddings answer has no vector")
        by_index[index] = vector
    usage = response.get("usage")
    total = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    weights = [_weight(lookup.request.inputs[i]) for i in lookup.missing]
    tokens = apportion(total if isinstance(total, int) and total > 0 else 0, weights)
    model = str(response.get("model") or lookup.request.model)
    return {
        lookup.request.keys[pos]: CachedVector(
            embedding=by_index[n],
            model=model,
            prompt_tokens=tokens[n],
            upstream_s=upstream_s * weights[n] / sum(weights),
            age_s=0.0,
        )
        for n, pos in enumerate(lookup.missing)
    }


def merge(
    lookup: EmbeddingLookup, fetched: Mapping[str, CachedVector], model: str | None = None
) -> dict[str, Any]:
    """The answer for every input, in request order, from the hits and the fetched vectors."""
    vectors = [fetched.get(key) or lookup.found[key] for key in lookup.request.keys]
    prompt_tokens = sum(v.prompt_tokens for v in vectors)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": v.embedding}
            for i, v in enumerate(vectors)
        ],
        "model": model or vectors[0].model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
