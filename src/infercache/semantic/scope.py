"""The exact scope a semantic match must stay inside, and the one text compared by meaning.

A near-duplicate may only answer a request that agrees on everything but the wording of its
last user message: tenant, model *and* its current version token, system prompt, every earlier
message of the conversation (so a follow-up such as "what are its types?" never matches a
standalone question), tools, response format, every output-affecting parameter, the context
fingerprint, and the tags with their current generations. All of that is hashed into the scope
key exactly as the exact key hashes it (keys.py); only the last message's text is left out and
compared by meaning.

    scope = "sc1:" + sha256(canonical_json({tenant, context, tags+generations, model_version,
                                           request with the last message's content removed}))

An Anthropic Messages request (`Endpoint.MESSAGES`) is scoped the same way on its key body
(keys.request_body: no breakpoints, no metadata, its beta), its last user turn's text blocks
compared, and the endpoint's name in the payload, so it never matches a chat request.

Because the version token and the tag generations are part of the scope, a model swap or an
invalidation moves new requests to a new scope: old vectors are never candidates again. Pure.
"""

from __future__ import annotations

import hashlib
from typing import Any, NamedTuple

from infercache.keys import IGNORABLE_FIELDS, canonical_json, request_body
from infercache.request import ChatRequest, Endpoint
from infercache.versions import VersionView

SCOPE_PREFIX = "sc1:"


class Query(NamedTuple):
    scope: str  # the scope key
    text: str  # the last user message, compared by meaning


def last_user_text(body: dict[str, Any]) -> str | None:
    """The text of the last message if it is a user message made of text only, else None."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    content = last.get("content")
    if isinstance(content, str):
        return content if content.strip() else None
    if isinstance(content, list) and content:
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(parts) != len(content) or not all(isinstance(p, str) for p in parts):
            return None  # images, audio, files: not comparable by a text embedding
        text = "\n".join(str(p) for p in parts)
        return text if text.strip() else None
    return None


def query_of(
    request: ChatRequest, view: VersionView, ignorable: frozenset[str] = IGNORABLE_FIELDS
) -> Query | None:
    """The semantic query of `request`, or None when the layer does not apply to it."""
    body = request_body(request, ignorable)
    text = last_user_text(body)
    if text is None:
        return None
    messages = list(body["messages"])
    last = {k: v for k, v in messages[-1].items() if k != "content"}
    body["messages"] = [*messages[:-1], last]
    d = request.directives
    payload = {
        "tenant": d.tenant,
        "context": d.context_fingerprint,
        "tags": [list(t) for t in view.tags],
        "model_version": view.model_version,
        "request": body,
    }
    if request.endpoint is not Endpoint.CHAT:
        payload["endpoint"] = request.endpoint.value
    return Query(SCOPE_PREFIX + hashlib.sha256(canonical_json(payload)).hexdigest(), text)
