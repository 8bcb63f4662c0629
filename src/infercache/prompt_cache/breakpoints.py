"""`cache_control` breakpoints for Anthropic-kind upstreams: `inject | pass | strip`.

Anthropic caches a prompt's prefix only up to a block marked `cache_control`; writing it costs
more than plain input (1.25x for the 5-minute cache), reading it a tenth. A marker pays off only
on a prefix that comes back, so the gateway marks only prefixes it has already seen:

    pass    the request as the client sent it
    strip   every `cache_control` removed (the client's markers cost more than they save)
    inject  (default) the client's own markers win: a request with any is sent as it is.
            Otherwise the prefix is cut at its block boundaries, in the provider's order
            (tools, then system, then each message); each boundary gets a digest chained from
            the tenant, the model and everything before it. At most two markers are placed:
            at the end of tools + system, and at the longest message boundary, each only if
            its digest was seen within the provider's cache lifetime (`ttl_s`) and its prefix
            reaches the model's minimum (an estimate of 4 characters a token); never more
            than four in all, as the API allows. Every boundary's digest is then noted as seen.
            A prefix asked once is never marked: it never pays the write premium.

`SeenPrefixes` is bounded (least recently seen forgotten first), per gateway, and takes the time
from the caller. Not thread-safe: the caller holds a lock.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, NamedTuple

from infercache.anthropic.request import without_cache_control

MAX_BREAKPOINTS = 4
CHARS_PER_TOKEN = 4
# The smallest prefix each model caches (Anthropic's prompt-caching documentation).
_MINIMUM_TOKENS = (("opus-4-5", 4096), ("haiku-4-5", 4096), ("haiku", 2048))
_DEFAULT_MINIMUM_TOKENS = 1024


class BreakpointPolicy(StrEnum):
    INJECT = "inject"
    PASS = "pass"
    STRIP = "strip"


def minimum_tokens(model: str) -> int:
    for fragment, tokens in _MINIMUM_TOKENS:
        if fragment in model:
            return tokens
    return _DEFAULT_MINIMUM_TOKENS


class SeenPrefixes:
    def __init__(self, *, ttl_s: float = 300.0, max_entries: int = 100_000) -> None:
        self._ttl_s = ttl_s
        self._max = max_entries
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def fresh(self, digest: bytes, now_s: float) -> bool:
        seen_s = self._seen.get(digest)
        return seen_s is not None and now_s - seen_s <= self._ttl_s

    def note(self, digest: bytes, now_s: float) -> None:
        self._seen[digest] = now_s
        self._seen.move_to_end(digest)
        while len(self._seen) > self._max:
            self._seen.popitem(last=False)


class Boundary(NamedTuple):
    digest: bytes
    tokens: int  # estimated prefix length up to and including this boundary
    where: int  # -1: the end of tools + system; i: the end of messages[i]


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def boundaries(tenant: str, body: Mapping[str, Any]) -> list[Boundary]:
    plain = without_cache_control(body)
    digest = hashlib.sha256(_canonical([tenant, plain.get("model"), plain.get("tools")])).digest()
    head = _canonical(plain.get("tools") or []) + _canonical(plain.get("system") or "")
    digest = hashlib.sha256(digest + _canonical(plain.get("system") or "")).digest()
    chars = len(head)
    out = (
        [Boundary(digest, chars // CHARS_PER_TOKEN, -1)]
        if plain.get("system") or plain.get("tools")
        else []
    )
    for i, message in enumerate(plain.get("messages") or []):
        encoded = _canonical(message)
        digest = hashlib.sha256(digest + encoded).digest()
        chars += len(encoded)
        out.append(Boundary(digest, chars // CHARS_PER_TOKEN, i))
    return out


def has_markers(value: Any) -> bool:
    if isinstance(value, Mapping):
        return "cache_control" in value or any(has_markers(v) for v in value.values())
    if isinstance(value, list):
        return any(has_markers(v) for v in value)
    return False


def apply_policy(
    policy: BreakpointPolicy,
    tenant: str,
    body: Mapping[str, Any],
    seen: SeenPrefixes,
    now_s: float,
) -> dict[str, Any]:
    """The body to send upstream under `policy` (see the module docstring)."""
    if policy is BreakpointPolicy.PASS:
        return dict(body)
    if policy is BreakpointPolicy.STRIP:
        stripped: dict[str, Any] = without_cache_control(body)
        return stripped
    cuts = boundaries(tenant, body)
    chosen = (
        []
        if has_markers(body)
        else _chosen(cuts, minimum_tokens(str(body.get("model"))), seen, now_s)
    )
    for cut in cuts:
        seen.note(cut.digest, now_s)
    out = dict(body)
    for where in chosen[:MAX_BREAKPOINTS]:
        _mark(out, where)
    return out


def _chosen(cuts: Sequence[Boundary], minimum: int, seen: SeenPrefixes, now_s: float) -> list[int]:
    ready = [c for c in cuts if c.tokens >= minimum and seen.fresh(c.digest, now_s)]
    chosen = [c.where for c in ready if c.where == -1]
    messages = [c.where for c in ready if c.where >= 0]
    return chosen + messages[-1:]


_EPHEMERAL = {"type": "ephemeral"}


def _marked_blocks(content: Any) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = (
        [{"type": "text", "text": content}]
        if isinstance(content, str)
        else [dict(b) for b in content]
    )
    blocks[-1] = {**blocks[-1], "cache_control": dict(_EPHEMERAL)}
    return blocks


def _mark(body: dict[str, Any], where: int) -> None:
    if where >= 0:
        messages = [dict(m) for m in body["messages"]]
        messages[where]["content"] = _marked_blocks(messages[where]["content"])
        body["messages"] = messages
    elif body.get("system"):
        body["system"] = _marked_blocks(body["system"])
    else:
        tools = [dict(t) for t in body["tools"]]
        tools[-1]["cache_control"] = dict(_EPHEMERAL)
        body["tools"] = tools
