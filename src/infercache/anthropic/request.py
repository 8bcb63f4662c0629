"""An Anthropic Messages request as the cache sees it. Pure: no I/O.

- `validate(body)`: the shape the Messages API requires (model, max_tokens, a non-empty
  messages list of user/assistant turns, each field's type and range), an
  `InvalidRequestError` naming the field otherwise.
- `key_body(body, beta)`: the part of the body that can change the answer, for the exact key:
  every field but delivery and bookkeeping (`stream`, `metadata`, `service_tier`), with every
  `cache_control` breakpoint removed (where the provider caches a prefix never changes what
  the model says) and the `anthropic-beta` header folded in (a beta can change the answer).
- `is_sampled(body)`: the API's default temperature is 1 and it takes no seed, so only
  `temperature: 0` is deterministic enough to cache by default (thinking needs temperature 1).
- `unstorable_reason(message)`: never store an error, an empty answer, a refusal or a cut-off
  (`max_tokens`, `pause_turn`, `model_context_window_exceeded`, or no stop reason at all).
- `last_user_text(body)`: the last user turn's text, which the semantic layer compares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infercache.body_fields import check_model, check_number
from infercache.errors import InvalidRequestError

IGNORABLE_FIELDS = frozenset({"stream", "metadata", "service_tier"})
STORABLE_STOP_REASONS = frozenset({"end_turn", "stop_sequence", "tool_use"})
_ROLES = ("user", "assistant")


def validate(body: Mapping[str, Any]) -> None:
    check_model(body)
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidRequestError(
            "`max_tokens` is required: a whole number of at least 1", param="max_tokens"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("`messages` must be a non-empty list", param="messages")
    for i, message in enumerate(messages):
        _message(message, f"messages.{i}")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        _blocks(system, "system")
    check_number(body, "temperature", 0, 1)
    check_number(body, "top_p", 0, 1)
    top_k = body.get("top_k")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise InvalidRequestError("`top_k` must be a whole number >= 0", param="top_k")
    stops = body.get("stop_sequences")
    if stops is not None and not (
        isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)
    ):
        raise InvalidRequestError(
            "`stop_sequences` must be a list of non-empty strings", param="stop_sequences"
        )
    if body.get("stream") is not None and not isinstance(body.get("stream"), bool):
        raise InvalidRequestError("`stream` must be true or false", param="stream")
    _tools(body)


def _message(message: Any, where: str) -> None:
    if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
        raise InvalidRequestError(
            f"`{where}` must be an object with a role of user or assistant", param=where
        )
    content = message.get("content")
    if isinstance(content, str):
        return
    _blocks(content, f"{where}.content")


def _blocks(blocks: Any, where: str) -> None:
    if not isinstance(blocks, list) or not blocks:
        raise InvalidRequestError(
            f"`{where}` must be a string or a non-empty list of content blocks", param=where
        )
    for j, block in enumerate(blocks):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise InvalidRequestError(
                f"`{where}.{j}` must be a content block with a type", param=f"{where}.{j}"
            )
        if block["type"] == "text" and not isinstance(block.get("text"), str):
            raise InvalidRequestError(f"`{where}.{j}.text` must be a string", param=where)


def _tools(body: Mapping[str, Any]) -> None:
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, Mapping) and t.get("name") for t in tools)
    ):
        raise InvalidRequestError("`tools` must be a list of tools with names", param="tools")
    choice = body.get("tool_choice")
    if choice is not None and not (
        isinstance(choice, Mapping) and choice.get("type") in ("auto", "any", "tool", "none")
    ):
        raise InvalidRequestError(
            "`tool_choice.type` must be auto, any, tool or none", param="tool_choice"
        )


def without_cache_control(value: Any) -> Any:
    """`value` with every `cache_control` key removed, at any depth (a new object)."""
    if isinstance(value, Mapping):
        return {k: without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [without_cache_control(v) for v in value]
    return value


def key_body(body: Mapping[str, Any], beta: str | None) -> dict[str, Any]:
    out: dict[str, Any] = without_cache_control(
        {k: v for k, v in body.items() if k not in IGNORABLE_FIELDS}
    )
    if beta:
        out["anthropic-beta"] = ",".join(sorted(p.strip() for p in beta.split(",") if p.strip()))
    return out


def is_sampled(body: Mapping[str, Any]) -> bool:
    temperature = body.get("temperature")
    return temperature is None or temperature > 0


def unstorable_reason(message: Mapping[str, Any]) -> str | None:
    if message.get("type") != "message":
        return "not a message"
    if not message.get("content"):
        return "empty content"
    stop = message.get("stop_reason")
    if stop not in STORABLE_STOP_REASONS:
        return f"stop_reason {stop}"
    return None


def last_user_text(body: Mapping[str, Any]) -> str | None:
    """The last turn's text when it is a user turn of text only; else None (not comparable)."""
    last = body["messages"][-1]
    if last.get("role") != "user":
        return None
    content = last.get("content")
    if isinstance(content, str):
        return content
    if all(b.get("type") == "text" for b in content):
        return "".join(b.get("text", "") for b in content)
    return None
