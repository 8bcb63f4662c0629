"""What a request comes to: a `Completion` (the answer and the layer that gave it), and the one
rule for the response headers that say which layer answered.

    x-infercache: exact-hit | semantic-hit | miss | bypass | uncacheable
    age: N                           whole seconds since the answer was stored (hits only)
    x-infercache-coalesced: true     an identical request in flight fetched it
    x-infercache-similarity: 0.9312  a semantic hit's cosine similarity

Every server and client wrapper (the gateway, the wrapped `openai` client) asks `layer_headers`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NamedTuple

Response = dict[str, Any]


class Layer(StrEnum):
    EXACT = "exact"
    SEMANTIC = "semantic"
    MISS = "miss"
    BYPASS = "bypass"
    UNCACHEABLE = "uncacheable"


LAYER_HEADER = {
    Layer.EXACT: "exact-hit",
    Layer.SEMANTIC: "semantic-hit",
    Layer.MISS: "miss",
    Layer.BYPASS: "bypass",
    Layer.UNCACHEABLE: "uncacheable",
}


class Completion(NamedTuple):  # a NamedTuple, not a frozen dataclass: built on every hit
    response: Response
    layer: Layer
    age_s: float | None = None  # how old the served entry is (hits only)
    key: str | None = None
    coalesced: bool = False  # served the answer of an identical request in flight
    upstream_s: float | None = None  # how long the upstream took (answers fetched now)
    similarity: float | None = None  # cosine similarity in [-1, 1] of a semantic hit
    raw: bytes | None = None  # `response` as JSON, as the store holds it (hits): replayed as is


def layer_headers(
    layer: Layer,
    *,
    age_s: float | None = None,
    coalesced: bool = False,
    similarity: float | None = None,
) -> dict[str, str]:
    """The headers of a reply that `layer` answered (module docstring)."""
    headers = {"x-infercache": LAYER_HEADER[layer]}
    if layer is Layer.EXACT or layer is Layer.SEMANTIC:
        headers["age"] = str(int(age_s or 0))
    if coalesced:
        headers["x-infercache-coalesced"] = "true"
    if similarity is not None:
        headers["x-infercache-similarity"] = f"{similarity:.4f}"
    return headers


def completion_headers(done: Completion) -> dict[str, str]:
    """`layer_headers` of a whole answer (on every request: its fields read once)."""
    layer = done.layer
    headers = {"x-infercache": LAYER_HEADER[layer]}
    if layer is Layer.EXACT or layer is Layer.SEMANTIC:
        headers["age"] = str(int(done.age_s or 0))
    if done.coalesced:
        headers["x-infercache-coalesced"] = "true"
    if done.similarity is not None:
        headers["x-infercache-similarity"] = f"{done.similarity:.4f}"
    return headers
