"""An OpenAI Responses request as the cache sees it. Pure: no I/O.

- `validate(body)`: model, `input` (a string or a list of items) and each field's type and
  range; an `InvalidRequestError` naming the field otherwise.
- `resolved(body, earlier)`: a follow-up (`previous_response_id`) made whole: the earlier
  conversation's items (its input and output, which conversations.py kept when this gateway
  served it) followed by the new input, and no `previous_response_id`. Keyed and sent on its
  content, a follow-up asked twice is one upstream call.
- `key_body(body)`: every field that can change the answer; not delivery or bookkeeping
  (`stream`, `store`, `metadata`, `user`, `prompt_cache_key`, `service_tier`, ...).
- `is_sampled(body)`: the API's default temperature is 1 and it takes no seed: only
  `temperature: 0` is cached by default; a reasoning request is sampled (no temperature).
- `unstorable_reason(response)`: only a `completed` response with output and no refusal.
- `last_user_text(items)`: the last user message's text, which the semantic layer compares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infercache.body_fields import check_model, check_number
from infercache.errors import InvalidRequestError
from infercache.responses.translate import input_items

IGNORABLE_FIELDS = frozenset(
    {"stream", "stream_options", "store", "metadata", "user", "safety_identifier",
     "prompt_cache_key", "prompt_cache_retention", "service_tier", "background"}
)  # fmt: skip


def validate(body: Mapping[str, Any]) -> None:
    check_model(body)
    value = body.get("input")
    if not (isinstance(value, str) and value) and not (
        isinstance(value, list) and value and all(isinstance(i, Mapping) for i in value)
    ):
        raise InvalidRequestError(
            "`input` is required: a non-empty string or a list of input items", param="input"
        )
    for i, item in enumerate(value if isinstance(value, list) else []):
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") not in (
            "user",
            "assistant",
            "system",
            "developer",
        ):
            raise InvalidRequestError(
                f"`input.{i}.role` must be user, assistant, system or developer", param=f"input.{i}"
            )
    check_number(body, "temperature", 0, 2)
    check_number(body, "top_p", 0, 1)
    limit = body.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidRequestError(
            "`max_output_tokens` must be a whole number of at least 1", param="max_output_tokens"
        )
    previous = body.get("previous_response_id")
    if previous is not None and not (isinstance(previous, str) and previous):
        raise InvalidRequestError(
            "`previous_response_id` must be a response's id", param="previous_response_id"
        )
    if body.get("stream") is not None and not isinstance(body.get("stream"), bool):
        raise InvalidRequestError("`stream` must be true or false", param="stream")


def resolved(body: Mapping[str, Any], earlier: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    out = {k: v for k, v in body.items() if k != "previous_response_id"}
    out["input"] = [*(dict(i) for i in earlier), *input_items(body["input"])]
    return out


def conversation_after(
    body: Mapping[str, Any], response: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The items a follow-up to `response` continues from: the (resolved) request's input and
    the response's output."""
    return [*input_items(body["input"]), *(dict(i) for i in response.get("output") or [])]


def key_body(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in IGNORABLE_FIELDS}


def is_sampled(body: Mapping[str, Any]) -> bool:
    temperature = body.get("temperature")
    return body.get("reasoning") is not None or temperature is None or temperature > 0


def unstorable_reason(response: Mapping[str, Any]) -> str | None:
    if response.get("object") != "response":
        return "not a response"
    if response.get("status") != "completed":
        return f"status {response.get('status')}"
    output = response.get("output") or []
    if not output:
        return "empty output"
    for item in output:
        for part in item.get("content") or []:
            if isinstance(part, Mapping) and part.get("type") == "refusal":
                return "refusal"
    return None


def last_user_text(items: Sequence[Mapping[str, Any]]) -> str | None:
    """The last item's text when it is a user message of text only; else None."""
    last = items[-1]
    if last.get("type", "message") != "message" or last.get("role") != "user":
        return None
    content = last.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "input_text" for p in content
    ):
        return "".join(p.get("text", "") for p in content)
    return None
