"""A `prompt_cache_key` for OpenAI-kind upstreams, derived when the client sent none.

OpenAI routes a request to a machine by a hash of its first tokens combined with the
`prompt_cache_key`; requests that share both land where their prefix is cached. The gateway
derives one per tenant and system prompt: `HMAC(deployment secret, "pck", tenant, sha256(system
prompt)[, version])`, 32 hex characters. Salted, so the key reveals neither the tenant nor the
prompt, per tenant, so no two tenants share a cache partition through it, and per model version
when one is given, so a retired version's cached prefixes are not reused. A client's own key is
kept.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from typing import Any

_SYSTEM_ROLES = ("system", "developer")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))
    return ""


def system_prompt(body: Mapping[str, Any]) -> str:
    """The leading instructions of a chat or Responses body ("" when there are none)."""
    if isinstance(body.get("instructions"), str):
        return str(body["instructions"])
    turns = body.get("messages", body.get("input"))
    if isinstance(turns, Sequence) and not isinstance(turns, str):
        for turn in turns:
            if isinstance(turn, Mapping) and turn.get("role") in _SYSTEM_ROLES:
                return _text(turn.get("content"))
            break
    return ""


def derived_key(
    secret: bytes, tenant: str, body: Mapping[str, Any], version: str | None = None
) -> str:
    """`version`: the model version the request goes to (gateway/versions.py), so a provider's
    cached prefix is not reused across versions (None: unversioned, the key as before)."""
    prompt = hashlib.sha256(system_prompt(body).encode()).digest()
    message = b"pck\x00" + tenant.encode() + b"\x00" + prompt
    if version is not None:
        message += b"\x00version\x00" + version.encode()
    return hmac.digest(secret, message, "sha256").hex()[:32]


def with_prompt_cache_key(
    secret: bytes, tenant: str, body: Mapping[str, Any], version: str | None = None
) -> dict[str, Any]:
    """`body` with a derived `prompt_cache_key` unless the client set its own."""
    out = dict(body)
    if not out.get("prompt_cache_key"):
        out["prompt_cache_key"] = derived_key(secret, tenant, body, version)
    return out
