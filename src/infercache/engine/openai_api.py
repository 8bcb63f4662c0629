"""OpenAI chat-completions bodies ↔ the engine's requests and results.

`parse_chat_request(body)` checks shapes and types and raises `InvalidRequestError` naming the
bad parameter. Supported: `model`, `messages` (roles system/developer/user/assistant; content a
string or a list of text parts), `max_tokens` / `max_completion_tokens`, `temperature` (0–2,
default 1 as OpenAI), `top_p` (0–1), `seed`, `stop` (a string or up to 4), `n` = 1, `stream`,
`stream_options.include_usage`, `user`, and two of vLLM's extensions: `cache_salt` (a
non-empty string mixed into the prefix-cache namespace: equal prompts with different salts never
share KV, equal salts do) and `ignore_eos` (keep generating past the end-of-sequence token, up
to `max_tokens`: what benchmarks use). Refused with a 400 (rather than silently ignored, since
they change the answer): `n` > 1, tools/functions, logprobs, non-zero penalties, `logit_bias`,
a non-text `response_format`, non-text content parts. Other fields are ignored.

`prepare_chat(chat, tenant, loaded, ...)` turns a parsed body into what the engine runs for one
model: the model id checked, the chat template applied, `max_tokens` defaulted and checked
against the context window, a seed drawn for unseeded requests, the KV namespace chosen
(`kv_namespace`), and the response's id and fingerprint. It raises `ModelNotFoundError` or
`ContextTooLongError` for bad input, so the caller can refuse it before anything is queued.

`completion(meta, result)` and `ChunkStream` build the response shapes: `system_fingerprint` is
the model version, `usage.prompt_tokens_details.cached_tokens` the reused prompt tokens.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infercache.clock import Clock
from infercache.engine.accounting import RequestStats
from infercache.engine.loader import LoadedModel
from infercache.engine.sampling import SamplingParams
from infercache.engine.sequence import GenerationRequest, GenerationResult
from infercache.errors import ContextTooLongError, InvalidRequestError, ModelNotFoundError

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_MAX_STOPS = 4


@dataclass(frozen=True, slots=True)
class ChatBody:
    """A chat-completions request body, parsed and checked (not yet tied to a model)."""

    model: str
    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    user: str | None
    cache_salt: str | None = None
    ignore_eos: bool = False

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    id: str
    created: int
    model: str
    system_fingerprint: str


def parse_chat_request(body: Any) -> ChatBody:
    if not isinstance(body, Mapping):
        raise InvalidRequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("`model` must be a non-empty string", param="model")
    _refuse_unsupported(body)
    stream = _optional_bool(body, "stream") or False
    options = body.get("stream_options")
    if options is not None and not stream:
        raise InvalidRequestError(
            "`stream_options` is only allowed when `stream` is true", param="stream_options"
        )
    if options is not None and not isinstance(options, Mapping):
        raise InvalidRequestError("`stream_options` must be an object", param="stream_options")
    include_usage = _optional_bool(options or {}, "include_usage", "stream_options.")
    max_tokens = _optional_int(body, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = _optional_int(body, "max_tokens", minimum=1)
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequestError("`user` must be a string", param="user")
    salt = body.get("cache_salt")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise InvalidRequestError(
            "`cache_salt` must be a non-empty string if provided", param="cache_salt"
        )
    return ChatBody(
        model=model,
        messages=_messages(body.get("messages")),
        max_tokens=max_tokens,
        temperature=_optional_number(body, "temperature", 0.0, 2.0, default=1.0),
        top_p=_optional_number(body, "top_p", 0.0, 1.0, default=1.0),
        seed=_optional_int(body, "seed", minimum=None),
        stop=_stops(body.get("stop")),
        stream=stream,
        include_usage=bool(include_usage),
        user=user or None,
        cache_salt=salt,
        ignore_eos=bool(_optional_bool(body, "ignore_eos")),
    )


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    n = _optional_int(body, "n", minimum=1)
    if n is not None and n > 1:
        raise InvalidRequestError("`n` > 1 is not supported by the engine", param="n")
    for name in ("tools", "functions", "logit_bias"):
        if body.get(name):
            raise InvalidRequestError(f"`{name}` is not supported by the engine", param=name)
    if body.get("logprobs") or body.get("top_logprobs"):
        raise InvalidRequestError("logprobs are not supported by the engine", param="logprobs")
    for name in ("presence_penalty", "frequency_penalty"):
        if _optional_number(body, name, -2.0, 2.0, default=0.0) != 0:
            raise InvalidRequestError(f"`{name}` is not supported by the engine", param=name)
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, Mapping) or fmt.get("type") != "text"):
        raise InvalidRequestError(
            "only a `text` response_format is supported by the engine", param="response_format"
        )


def _messages(raw: Any) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise InvalidRequestError("`messages` must be a non-empty array", param="messages")
    out = []
    for i, message in enumerate(raw):
        param = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"{param} must be an object", param=param)
        role = message.get("role")
        if role not in _ROLES:
            raise InvalidRequestError(
                f"{param}.role must be one of {sorted(_ROLES)}, got {role!r}", param=f"{param}.role"
            )
        out.append((_ROLES[role], _content(message.get("content"), f"{param}.content")))
    return tuple(out)


def _content(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise InvalidRequestError(f"{param}: only text parts are supported", param=param)
            text = part.get("text")
            if not isinstance(text, str):
                raise InvalidRequestError(f"{param}: a text part needs a string", param=param)
            texts.append(text)
        return "".join(texts)
    raise InvalidRequestError(f"{param} must be a string or an array of text parts", param=param)


def _stops(raw: Any) -> tuple[str, ...]:
    stops = [raw] if isinstance(raw, str) else raw
    if stops is None:
        return ()
    if (
        not isinstance(stops, list)
        or len(stops) > _MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise InvalidRequestError(
            f"`stop` must be a non-empty string or up to {_MAX_STOPS} of them", param="stop"
        )
    return tuple(stops)


def _optional_bool(body: Mapping[str, Any], name: str, prefix: str = "") -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise InvalidRequestError(f"`{prefix}{name}` must be a boolean", param=prefix + name)
    return value


def _optional_int(body: Mapping[str, Any], name: str, *, minimum: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidRequestError(f"`{name}` must be an integer, got {value!r}", param=name)
    if minimum is not None and value < minimum:
        raise InvalidRequestError(f"`{name}` must be >= {minimum}, got {value}", param=name)
    return value


def _optional_number(
    body: Mapping[str, Any], name: str, low: float, high: float, *, default: float
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidRequestError(f"`{name}` must be a number, got {value!r}", param=name)
    if not low <= value <= high:
        raise InvalidRequestError(f"`{name}` must be in [{low}, {high}], got {value}", param=name)
    return float(value)


@dataclass(frozen=True, slots=True)
class PreparedChat:
    """A parsed body made ready for one loaded model (`version`); prepared again when the
    model is swapped before it runs."""

    chat: ChatBody
    tenant: str | None
    version: str
    meta: ResponseMeta
    request: GenerationRequest


def kv_namespace(
    tenant: str | None, *, cache_salt: str | None = None, share_across_tenants: bool = False
) -> str:
    """The prefix-cache namespace: one per tenant, one for requests without a tenant, or one
    for everybody when sharing across tenants is configured; each split again by `cache_salt`.
    JSON, so no tenant name or salt can be chosen to spell another's namespace."""
    scope = None if share_across_tenants else (tenant or "")
    return json.dumps(["shared" if share_across_tenants else "tenant", scope, cache_salt])


def prepare_chat(
    chat: ChatBody,
    tenant: str | None,
    loaded: LoadedModel,
    *,
    default_max_tokens: int,
    share_across_tenants: bool,
    rng: random.Random,
    clock: Clock,
) -> PreparedChat:
    if chat.model != loaded.model_id:
        raise ModelNotFoundError(
            f"The model `{chat.model}` does not exist; this engine serves `{loaded.model_id}`",
            param="model",
        )
    prompt = loaded.tokenizer.encode_chat(chat.message_dicts())
    limit = loaded.max_context_tokens
    max_tokens = chat.max_tokens
    if max_tokens is None:
        max_tokens = min(default_max_tokens, limit - len(prompt))
    if max_tokens < 1 or len(prompt) + max_tokens > limit:
        raise ContextTooLongError(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
            f"{max_tokens} in the completion).",
            param="messages",
        )
    seed = chat.seed if chat.seed is not None else rng.getrandbits(63)
    sampling = SamplingParams(
        max_tokens, chat.temperature, chat.top_p, seed, chat.stop, ignore_eos=chat.ignore_eos
    )
    meta = ResponseMeta(
        id=f"chatcmpl-{rng.getrandbits(96):024x}",
        created=int(clock.now_s()),
        model=loaded.model_id,
        system_fingerprint=loaded.version,
    )
    namespace = kv_namespace(
        tenant, cache_salt=chat.cache_salt, share_across_tenants=share_across_tenants
    )
    request = GenerationRequest(tuple(prompt), sampling, namespace)
    return PreparedChat(chat, tenant, loaded.version, meta, request)


def usage(stats: RequestStats) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def _finish_reason(result: GenerationResult) -> str | None:
    # A cancelled generation is cut off: no finish reason, as for an interrupted stream.
    return None if result.finish_reason == "cancelled" else result.finish_reason


def _base(meta: ResponseMeta, obj: str) -> dict[str, Any]:
    return {
        "id": meta.id,
        "object": obj,
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": meta.system_fingerprint,
    }


def completion(meta: ResponseMeta, result: GenerationResult) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": result.text},
        "logprobs": None,
        "finish_reason": _finish_reason(result),
    }
    return {**_base(meta, "chat.completion"), "choices": [choice], "usage": usage(result.stats)}


class ChunkStream:
    """The `chat.completion.chunk`s of one streamed answer."""

    def __init__(self, meta: ResponseMeta, *, include_usage: bool) -> None:
        self._base = _base(meta, "chat.completion.chunk")
        self._include_usage = include_usage

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        chunk = {**self._base, "choices": [choice]}
        if self._include_usage:
            chunk["usage"] = None  # as OpenAI: null on every chunk but the last
        return chunk

    def role(self) -> dict[str, Any]:
        return self._chunk({"role": "assistant", "content": ""}, None)

    def content(self, text: str) -> dict[str, Any]:
        return self._chunk({"content": text}, None)

    def finish(self, result: GenerationResult) -> list[dict[str, Any]]:
        chunks = [self._chunk({}, _finish_reason(result))]
        if self._include_usage:
            chunks.append({**self._base, "choices": [], "usage": usage(result.stats)})
        return chunks
