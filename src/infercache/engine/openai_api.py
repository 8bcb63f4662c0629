"""OpenAI request bodies (chat completions, and the legacy completions API) → the engine's
requests.

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

`parse_completion_request(body)` does the same for the legacy `/v1/completions`: a raw `prompt`
instead of `messages` (a string, or token ids; one prompt: a list of several is refused like
`n` > 1), run without a chat template, `max_tokens` 16 by default as OpenAI's; `echo`, a
`suffix`, `best_of` > 1 and `logprobs` (a count there) are refused.

`prepare_chat(chat, tenant, loaded, ...)` turns a parsed body into what the engine runs for one
model: the model id checked, the chat template applied (or the raw prompt encoded with the
tokenizer's own special tokens, as vLLM does), `max_tokens` defaulted and checked against the
context window, a seed drawn for unseeded requests, the KV namespace chosen (`kv_namespace`),
and the response's id and fingerprint. It raises `ModelNotFoundError`, `ContextTooLongError` or
`InvalidRequestError` (an empty prompt, a token id outside the vocabulary) for bad input, so the
caller can refuse it before anything is queued. The response shapes are in responses.py.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infercache.client_values import missing, shown
from infercache.clock import Clock
from infercache.engine.loader import LoadedModel
from infercache.engine.responses import ResponseMeta
from infercache.engine.sampling import SamplingParams
from infercache.engine.sequence import GenerationRequest
from infercache.errors import ContextTooLongError, InvalidRequestError, ModelNotFoundError

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_MAX_STOPS = 4
LEGACY_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True, slots=True)
class ChatBody:
    """A chat-completions request body, parsed and checked (not yet tied to a model); or a
    legacy completions body, whose raw `prompt` (text or token ids) is set and `messages`
    empty."""

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
    prompt: str | tuple[int, ...] | None = None
    max_tokens_field: str = "max_tokens"  # the field `max_tokens` came from (for errors)

    @property
    def legacy(self) -> bool:
        return self.prompt is not None

    def message_dicts(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


def parse_chat_request(body: Any) -> ChatBody:
    if not isinstance(body, Mapping):
        raise InvalidRequestError("the request body must be a JSON object")
    _refuse_unsupported(body)
    _refuse_chat_only(body)
    return _parse_common(body, messages=_messages(body.get("messages")))


def parse_completion_request(body: Any) -> ChatBody:
    """A legacy `/v1/completions` body."""
    if not isinstance(body, Mapping):
        raise InvalidRequestError("the request body must be a JSON object")
    _refuse_unsupported(body)
    _refuse_legacy_only(body)
    return _parse_common(body, messages=(), prompt=_prompt(body.get("prompt")))


def _parse_common(
    body: Mapping[str, Any],
    *,
    messages: tuple[tuple[str, str], ...],
    prompt: str | tuple[int, ...] | None = None,
) -> ChatBody:
    model = body.get("model")
    if model is None:
        raise InvalidRequestError(missing("model"), param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("`model` must be a non-empty string", param="model")
    stream = _optional_bool(body, "stream") or False
    options = body.get("stream_options")
    if options is not None and not stream:
        raise InvalidRequestError(
            "`stream_options` is only allowed when `stream` is true", param="stream_options"
        )
    if options is not None and not isinstance(options, Mapping):
        raise InvalidRequestError("`stream_options` must be an object", param="stream_options")
    include_usage = _optional_bool(options or {}, "include_usage", "stream_options.")
    max_tokens_field = "max_completion_tokens"
    max_tokens = _optional_int(body, max_tokens_field, minimum=1)
    if max_tokens is None:
        max_tokens_field = "max_tokens"
        max_tokens = _optional_int(body, max_tokens_field, minimum=1)
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
        messages=messages,
        max_tokens=max_tokens,
        max_tokens_field=max_tokens_field,
        temperature=_optional_number(body, "temperature", 0.0, 2.0, default=1.0),
        top_p=_optional_number(body, "top_p", 0.0, 1.0, default=1.0),
        seed=_optional_int(body, "seed", minimum=None),
        stop=_stops(body.get("stop")),
        stream=stream,
        include_usage=bool(include_usage),
        user=user or None,
        cache_salt=salt,
        ignore_eos=bool(_optional_bool(body, "ignore_eos")),
        prompt=prompt,
    )


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    """What neither API supports here (each changes the answer, so it is refused, not ignored)."""
    n = _optional_int(body, "n", minimum=1)
    if n is not None and n > 1:
        raise InvalidRequestError("`n` > 1 is not supported by the engine", param="n")
    if body.get("logit_bias"):
        raise InvalidRequestError("`logit_bias` is not supported by the engine", param="logit_bias")
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


def _refuse_chat_only(body: Mapping[str, Any]) -> None:
    for name in ("tools", "functions"):
        if body.get(name):
            raise InvalidRequestError(f"`{name}` is not supported by the engine", param=name)


def _refuse_legacy_only(body: Mapping[str, Any]) -> None:
    if _optional_bool(body, "echo"):
        raise InvalidRequestError("`echo` is not supported by the engine", param="echo")
    if body.get("suffix"):
        raise InvalidRequestError("`suffix` is not supported by the engine", param="suffix")
    best_of = _optional_int(body, "best_of", minimum=1)
    if best_of is not None and best_of > 1:
        raise InvalidRequestError("`best_of` > 1 is not supported by the engine", param="best_of")


def _prompt(raw: Any) -> str | tuple[int, ...]:
    """One legacy prompt: a string or token ids, alone or as the only item of a list."""
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
        raw = raw[0]
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and raw and all(_is_int(t) for t in raw):
        return tuple(raw)
    if isinstance(raw, list) and len(raw) > 1 and all(isinstance(p, str | list) for p in raw):
        raise InvalidRequestError(
            "several prompts in one request are not supported by the engine", param="prompt"
        )
    raise InvalidRequestError("`prompt` must be a string or an array of token ids", param="prompt")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
                f"{param}.role must be one of {sorted(_ROLES)}, got {shown(role)}",
                param=f"{param}.role",
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
        raise InvalidRequestError(f"`{name}` must be an integer, got {shown(value)}", param=name)
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
        raise InvalidRequestError(f"`{name}` must be a number, got {shown(value)}", param=name)
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


def _context_too_long(
    chat: ChatBody, prompt_tokens: int, max_tokens: int, limit: int
) -> ContextTooLongError:
    """The error for a request over the window, naming what to shorten: the prompt when it
    alone leaves no room for one token; else the `max_tokens` (or `max_completion_tokens`)
    the caller asked for, which a shorter one would fit."""
    where = "prompt" if chat.legacy else "messages"
    if prompt_tokens >= limit or chat.max_tokens is None:
        return ContextTooLongError(
            f"This model's maximum context length is {limit} tokens. However, your {where} "
            f"{'has' if chat.legacy else 'have'} {prompt_tokens} tokens, which leaves no room "
            "for the completion. Please reduce the length of the "
            f"{where}.",
            param=where,
        )
    field = chat.max_tokens_field
    return ContextTooLongError(
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {where}, {max_tokens} "
        f"in the completion). Please reduce `{field}` to at most {limit - prompt_tokens}.",
        param=field,
    )


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
    prompt = _encode(chat, loaded)
    limit = loaded.max_context_tokens
    max_tokens = chat.max_tokens
    if max_tokens is None:
        default = LEGACY_DEFAULT_MAX_TOKENS if chat.legacy else default_max_tokens
        max_tokens = min(default, limit - len(prompt))
    if max_tokens < 1 or len(prompt) + max_tokens > limit:
        raise _context_too_long(chat, len(prompt), max_tokens, limit)
    seed = chat.seed if chat.seed is not None else rng.getrandbits(63)
    sampling = SamplingParams(
        max_tokens, chat.temperature, chat.top_p, seed, chat.stop, ignore_eos=chat.ignore_eos
    )
    meta = ResponseMeta(
        id=f"{'cmpl' if chat.legacy else 'chatcmpl'}-{rng.getrandbits(96):024x}",
        created=int(clock.now_s()),
        model=loaded.model_id,
        system_fingerprint=loaded.version,
        kind="text_completion" if chat.legacy else "chat.completion",
    )
    namespace = kv_namespace(
        tenant, cache_salt=chat.cache_salt, share_across_tenants=share_across_tenants
    )
    request = GenerationRequest(tuple(prompt), sampling, namespace)
    return PreparedChat(chat, tenant, loaded.version, meta, request)


def _encode(chat: ChatBody, loaded: LoadedModel) -> list[int]:
    """The prompt's token ids: the chat template over the messages, or the legacy raw prompt."""
    if chat.prompt is None:
        return loaded.tokenizer.encode_chat(chat.message_dicts())
    if isinstance(chat.prompt, str):
        ids = loaded.tokenizer.encode_prompt(chat.prompt)
    else:
        vocab = loaded.model.spec.vocab_size
        bad = next((t for t in chat.prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(
                f"token id {bad} in `prompt` is outside the vocabulary [0, {vocab})",
                param="prompt",
            )
        ids = list(chat.prompt)
    if not ids:
        raise InvalidRequestError("`prompt` must not be empty", param="prompt")
    return ids
