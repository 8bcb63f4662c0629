"""Request → canonical exact-cache key. Pure: no I/O, no clock, never mutates its input.

    key = "ic1:" + sha256(canonical_json({
        "tenant": ..., "context": <context fingerprint or null>, "tags": [sorted tags],
        "request": <output-affecting fields of the body, normalised>
    }))

Canonical JSON: sorted keys, compact separators, UTF-8, by orjson (about ten times faster than
the standard library on a chat request; bench/exact.py prints both). Never Python's `hash()`
(salted per process); the `ic1:` prefix is the key-schema version, bumped whenever this
function changes.

Which body fields enter the key:
- Every field that can change the answer: model, messages (system prompt and whole history),
  tools, tool_choice, response_format, temperature, top_p, max_tokens, max_completion_tokens,
  stop, seed, n, presence_penalty, frequency_penalty, logit_bias, logprobs, top_logprobs,
  parallel_tool_calls, reasoning_effort, ...
- **Unknown fields are included** (safer: a new provider parameter that changes the output can
  only cost hits, never serve a wrong answer), except the explicitly ignorable ones below, which
  change delivery or bookkeeping but not the answer.
- A few parameters are normalised so equivalent requests share a key: fields set to `null`, or
  to the value the OpenAI API uses when the field is absent (`n: 1`, `top_p: 1`, penalties `0`,
  `logprobs: false`, empty `stop`/`logit_bias`), are dropped, and integral floats become ints
  (`temperature: 0.0` == `temperature: 0`). `temperature` itself is never defaulted here.

Anthropic Messages and OpenAI Responses bodies (`Endpoint.MESSAGES`, `.RESPONSES`) enter as
their own modules decide (`key_body` in anthropic/request.py: no `metadata`, no `cache_control`
breakpoint, the `anthropic-beta` header folded in; responses/request.py: no `store`,
`prompt_cache_key`, ...), then normalised as above; `request_body` is that one answer for
every endpoint. Every endpoint but chat adds its name to the payload, so two APIs whose bodies
happen to be byte-identical never share an entry (their answers differ in shape).

The model *version* is deliberately not hashed in: the entry records the version (and its
generation) current when the request was looked up, and every read compares it with the current
one (see versions.py). A model swap is therefore one O(1) write, stale reads are counted as
`stale_model_version`, and the new version's answer overwrites the stale entry in place.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import orjson

from infercache.anthropic.request import key_body as messages_key_body
from infercache.request import ChatRequest, Endpoint
from infercache.responses.request import key_body as responses_key_body

KEY_PREFIX = "ic1:"

# Fields that never change the answer: how it is delivered, or provider bookkeeping.
IGNORABLE_FIELDS = frozenset(
    {
        "stream",
        "stream_options",
        "user",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "timeout",
        "extra_headers",
        "cache_salt",  # which KV-cache namespace serves it (vLLM); never what it says
    }
)

# Values equal to the API's default when the field is absent.
_DEFAULTS: dict[str, object] = {
    "n": 1,
    "top_p": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logprobs": False,
    "stop": [],
    "logit_bias": {},
    "parallel_tool_calls": True,
}


def _normalise_scalar(value: object) -> object:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def normalised_body(
    body: Mapping[str, Any], ignorable: frozenset[str] = IGNORABLE_FIELDS
) -> dict[str, Any]:
    """The output-affecting part of `body`, normalised (a new dict)."""
    out: dict[str, Any] = {}
    for name, value in body.items():
        if name in ignorable or value is None:
            continue
        value = _normalise_scalar(value)
        if name in _DEFAULTS and value == _DEFAULTS[name] and type(value) is type(_DEFAULTS[name]):
            continue
        if name == "stop" and isinstance(value, str):
            value = [value]
        out[name] = value
    return out


_ORJSON_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS
# For what orjson refuses (integers beyond 64 bits, custom types): the standard library.
_FALLBACK = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False
)


def canonical_json(obj: object) -> bytes:
    """Deterministic JSON bytes of `obj`: equal inputs give equal bytes, in every process."""
    try:
        return orjson.dumps(obj, option=_ORJSON_OPTIONS)
    except (TypeError, orjson.JSONEncodeError):
        return _FALLBACK.encode(obj).encode()


def request_body(
    request: ChatRequest, ignorable: frozenset[str] = IGNORABLE_FIELDS
) -> dict[str, Any]:
    """The part of `request`'s body that can change the answer, normalised: what the exact key
    hashes and the semantic scope starts from (module docstring)."""
    endpoint = request.endpoint
    if endpoint is Endpoint.MESSAGES:
        return normalised_body(messages_key_body(request.body, request.beta), ignorable)
    if endpoint is Endpoint.RESPONSES:
        return normalised_body(responses_key_body(request.body), ignorable)
    return normalised_body(request.body, ignorable)


def exact_key(request: ChatRequest, ignorable: frozenset[str] = IGNORABLE_FIELDS) -> str:
    """The exact-cache key of `request` (tenant, tags and context included)."""
    d = request.directives
    payload = {
        "tenant": d.tenant,
        "context": d.context_fingerprint,
        "tags": list(d.tags),
        "request": request_body(request, ignorable),
    }
    if request.endpoint is not Endpoint.CHAT:  # chat keys stay what they were
        payload["endpoint"] = request.endpoint.value
    return KEY_PREFIX + hashlib.sha256(canonical_json(payload)).hexdigest()
