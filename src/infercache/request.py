"""A request as the cache sees it: the body for the upstream plus directives. The body is one
of four APIs' (`Endpoint`): OpenAI chat and legacy completions, validated here; Anthropic
Messages and OpenAI Responses, validated by anthropic/request.py and responses/request.py.

Cache metadata travels in an optional `infercache` object inside the request body; it is
validated here and stripped before anything is sent upstream:

    "infercache": {
      "tenant": "acme",                 # scopes every layer; default "" (single-tenant use)
      "tags": ["kb:pricing", "user:7"], # data the answer depends on, for invalidate(tags=...)
      "context": ...,                   # ids/versions or text of retrieved documents; any JSON;
                                        # only its sha256 fingerprint enters the key
      "ttl_s": 600,                     # per-request TTL, capped by settings.max_ttl_s
      "max_age_s": 60,                  # accept only entries at most this old (HTTP max-age);
                                        # also the TTL of a new entry when ttl_s is absent
      "cache_control": "no-store"       # or a list: no-cache | no-store | only-if-cached
    }

The caller's dict is never mutated. Invalid directives raise `InvalidRequestError` naming the
field and the bad value.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from infercache.anthropic import request as anthropic_request
from infercache.client_values import missing, shown
from infercache.errors import InvalidRequestError
from infercache.responses import request as responses_request

DIRECTIVES_FIELD = "infercache"
_CACHE_CONTROLS = frozenset({"no-cache", "no-store", "only-if-cached"})


@dataclass(frozen=True, slots=True)
class CacheControl:
    no_cache: bool = False  # skip the lookup, call upstream, refresh the entry
    no_store: bool = False  # never store this answer
    only_if_cached: bool = False  # answer from the cache or fail with NotCachedError

    @classmethod
    def parse(cls, value: object) -> CacheControl:
        items: list[object]
        if value is None:
            return NO_CACHE_CONTROL
        if isinstance(value, str):
            items = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            items = list(value)
        else:
            raise InvalidRequestError(
                "infercache.cache_control must be a string or a list of strings, got "
                f"{shown(value)}",
                param="infercache.cache_control",
            )
        unknown = [v for v in items if v not in _CACHE_CONTROLS]
        if unknown:
            raise InvalidRequestError(
                f"unknown infercache.cache_control value(s) {unknown!r}; "
                f"allowed: {sorted(_CACHE_CONTROLS)}",
                param="infercache.cache_control",
            )
        return cls(
            no_cache="no-cache" in items,
            no_store="no-store" in items,
            only_if_cached="only-if-cached" in items,
        )


NO_CACHE_CONTROL = CacheControl()  # immutable: the one instance for requests that set none


class Directives(NamedTuple):  # a NamedTuple, not a frozen dataclass: built on every request
    tenant: str = ""
    tags: tuple[str, ...] = ()
    context_fingerprint: str | None = None
    ttl_s: float | None = None
    max_age_s: float | None = None
    cache_control: CacheControl = NO_CACHE_CONTROL


class Endpoint(StrEnum):
    """Which API a request is for: it decides the body's shape and its answer's."""

    CHAT = "chat.completions"  # messages → chat.completion
    COMPLETIONS = "completions"  # prompt → text_completion (the legacy API)
    MESSAGES = "messages"  # Anthropic Messages: messages → message (anthropic/)
    RESPONSES = "responses"  # OpenAI Responses: input → response (responses/)


class ChatRequest(NamedTuple):  # a NamedTuple, not a frozen dataclass: built on every request
    """`body` is what the upstream receives (directives stripped); never mutate it."""

    body: Mapping[str, Any]
    directives: Directives
    endpoint: Endpoint = Endpoint.CHAT
    # The client's `anthropic-beta` header (Messages): a beta can change the answer, so it is
    # keyed (anthropic/request.py key_body), and it goes upstream with the request.
    beta: str | None = None

    @property
    def model(self) -> str:
        model: str = self.body["model"]
        return model

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


def context_fingerprint(context: object) -> str:
    """sha256 over the canonical JSON of whatever identifies the retrieved context."""
    canonical = json.dumps(context, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _bad(field: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=field)


def _positive(raw: dict[str, Any], name: str, *, allow_zero: bool = False) -> float | None:
    value = raw.get(name)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value < 0
        or (value == 0 and not allow_zero)
    ):
        raise _bad(
            f"infercache.{name}", f"infercache.{name} must be a number > 0, got {shown(value)}"
        )
    return float(value)


def parse_directives(raw: object, tenant_override: str | None) -> Directives:
    """The `infercache` object of a request body, validated (tenant_override wins)."""
    if raw is None:
        return Directives(tenant=tenant_override or "")
    if not isinstance(raw, dict):
        raise _bad(DIRECTIVES_FIELD, f"'infercache' must be an object, got {shown(raw)}")
    unknown = set(raw) - {"tenant", "tags", "context", "ttl_s", "max_age_s", "cache_control"}
    if unknown:
        raise _bad(DIRECTIVES_FIELD, f"unknown field(s) in 'infercache': {sorted(unknown)}")
    tenant = raw.get("tenant", "")
    if not isinstance(tenant, str):
        raise _bad("infercache.tenant", f"infercache.tenant must be a string, got {shown(tenant)}")
    tags = raw.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise _bad(
            "infercache.tags", f"infercache.tags must be non-empty strings, got {shown(tags)}"
        )
    ttl_s = _positive(raw, "ttl_s")
    max_age_s = _positive(raw, "max_age_s", allow_zero=True)
    context = raw.get("context")
    return Directives(
        # A tenant established by authentication always wins over one claimed in the body.
        tenant=tenant_override if tenant_override is not None else tenant,
        tags=tuple(sorted(set(tags))),
        context_fingerprint=None if context is None else context_fingerprint(context),
        ttl_s=ttl_s if ttl_s is not None else (max_age_s or None),
        max_age_s=max_age_s,
        cache_control=CacheControl.parse(raw.get("cache_control")),
    )


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_stop(v: object) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))


# Types of the known parameters; a wrong type is a 400, as the OpenAI API answers it.
_FIELD_CHECKS: dict[str, tuple[str, Any]] = {
    "temperature": ("a number between 0 and 2", lambda v: _is_number(v) and 0 <= v <= 2),
    "top_p": ("a number between 0 and 1", lambda v: _is_number(v) and 0 <= v <= 1),
    "max_tokens": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
    "max_completion_tokens": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
    "n": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
    "seed": ("an integer", _is_int),
    "stream": ("a boolean", lambda v: isinstance(v, bool)),
    "stop": ("a string or a list of strings", _is_stop),
    "presence_penalty": ("a number between -2 and 2", lambda v: _is_number(v) and -2 <= v <= 2),
    "frequency_penalty": ("a number between -2 and 2", lambda v: _is_number(v) and -2 <= v <= 2),
    "logprobs": ("a boolean", lambda v: isinstance(v, bool)),
    "top_logprobs": ("an integer between 0 and 20", lambda v: _is_int(v) and 0 <= v <= 20),
    "logit_bias": ("an object", lambda v: isinstance(v, dict)),
    "tools": ("a list", lambda v: isinstance(v, list)),
    "response_format": ("an object", lambda v: isinstance(v, dict)),
    "stream_options": ("an object", lambda v: isinstance(v, dict)),
    "user": ("a string", lambda v: isinstance(v, str)),
}


def _is_prompt(v: object) -> bool:
    """A legacy prompt: a string, a list of strings, a token array or a list of them."""
    if isinstance(v, str):
        return True
    if not isinstance(v, list) or not v:
        return False
    return (
        all(isinstance(p, str) for p in v)
        or all(_is_int(t) for t in v)
        or all(isinstance(p, list) and p and all(_is_int(t) for t in p) for p in v)
    )


# The legacy completions API: `logprobs` is a count there, and there are no messages.
_COMPLETION_CHECKS: dict[str, tuple[str, Any]] = {
    **{k: v for k, v in _FIELD_CHECKS.items() if k not in ("logprobs", "tools", "top_logprobs")},
    "logprobs": ("an integer between 0 and 5", lambda v: _is_int(v) and 0 <= v <= 5),
    "best_of": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
    "echo": ("a boolean", lambda v: isinstance(v, bool)),
    "suffix": ("a string", lambda v: isinstance(v, str)),
}


def _validate_body(body: Mapping[str, Any], endpoint: Endpoint) -> None:
    if endpoint is Endpoint.MESSAGES:
        anthropic_request.validate(body)
        return
    if endpoint is Endpoint.RESPONSES:
        responses_request.validate(body)
        return
    checks = _FIELD_CHECKS if endpoint is Endpoint.CHAT else _COMPLETION_CHECKS
    for name in body.keys() & checks.keys():
        value = body[name]
        expected, check = checks[name]
        if value is not None and not check(value):
            raise _bad(name, f"'{name}' must be {expected}, got {shown(value)}")
    model = body.get("model")
    if model is None:
        raise _bad("model", missing("model"))
    if not isinstance(model, str) or not model:
        raise _bad("model", f"'model' must be a non-empty string, got {shown(model)}")
    if endpoint is Endpoint.COMPLETIONS:
        if not _is_prompt(body.get("prompt")):
            raise _bad(
                "prompt",
                "'prompt' must be a string, a list of strings, or token arrays",
            )
        return
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad(f"messages[{i}]", f"messages[{i}] must be an object with a 'role' string")


def parse_request(
    body: object,
    *,
    tenant: str | None = None,
    endpoint: Endpoint = Endpoint.CHAT,
    beta: str | None = None,
) -> ChatRequest:
    """Validate a body of `endpoint`'s API (chat, legacy completions, Anthropic Messages,
    OpenAI Responses) and split off its `infercache` directives.

    `tenant`, when given (the gateway's authenticated tenant), overrides the body's claim.
    `beta`: the client's `anthropic-beta` header, for Messages.
    """
    if not isinstance(body, dict):
        raise InvalidRequestError(f"the request body must be a JSON object, got {_json_kind(body)}")
    _validate_body(body, endpoint)
    directives = parse_directives(body.get(DIRECTIVES_FIELD), tenant)
    upstream_body = {k: v for k, v in body.items() if k != DIRECTIVES_FIELD}
    return ChatRequest(upstream_body, directives, endpoint, beta or None)


def _json_kind(value: object) -> str:
    """What a JSON body that is not an object is: an array, a string, a number..."""
    kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")
