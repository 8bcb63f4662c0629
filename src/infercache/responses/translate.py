"""OpenAI Responses ⇄ chat completions, for upstreams that speak only chat (the built-in
engine, vLLM, any OpenAI-compatible server). Pure: no I/O.

Request (`responses_to_chat`), on a request whose `input` is whole (a `previous_response_id`
was resolved into it before, see conversations.py):
    instructions                   → a leading `system` message
    input: a string                → one user message
    input items: messages          → chat messages (input_text/output_text parts → text,
                                     input_image → image_url); `function_call` → an assistant
                                     tool call; `function_call_output` → a `tool` message;
                                     `reasoning` items are dropped (earlier turns' reasoning)
    max_output_tokens, temperature, top_p → max_tokens, temperature, top_p
    tools [{type: function, name, parameters}] → function tools; tool_choice likewise
    text.format json_schema | json_object → response_format
    reasoning, built-in tools (web_search, file_search, ...) → refused with a 400 naming the
                                     field: a chat upstream cannot do them

Answer (`chat_to_response`): text → one `message` output item with an `output_text` part, tool
calls → `function_call` items; finish_reason length → status `incomplete`
(`max_output_tokens`), content_filter → incomplete (`content_filter`); usage in the Responses
shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infercache.errors import InvalidRequestError

_TEXT_PARTS = ("input_text", "output_text", "text")


def responses_to_chat(
    body: Mapping[str, Any], items: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The chat-completions body asking what the Responses `body` asks; `items`: its whole input
    as items (`input_items`, with any previous response resolved)."""
    if body.get("reasoning") is not None:
        raise InvalidRequestError(
            "`reasoning` needs an OpenAI Responses upstream: this one speaks chat",
            param="reasoning",
        )
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": _text(body["instructions"])})
    for item in items:
        messages.extend(_chat_messages(item))
    out: dict[str, Any] = {"model": body["model"], "messages": _merged_calls(messages)}
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("tools"):
        out["tools"] = [_chat_tool(t) for t in body["tools"]]
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _chat_tool_choice(body["tool_choice"])
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), Mapping) else None
    if isinstance(fmt, Mapping) and fmt.get("type") != "text":
        out["response_format"] = _response_format(fmt)
    return out


def input_items(value: Any) -> list[dict[str, Any]]:
    """`input` as a list of items: a string is one user message."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return [dict(item) for item in value]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(
        p.get("text", "")
        for p in content
        if isinstance(p, Mapping) and p.get("type") in _TEXT_PARTS
    )


def _chat_messages(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    kind = item.get("type", "message")
    if kind == "message":
        return [{"role": item["role"], "content": _chat_content(item.get("content", ""))}]
    if kind == "function_call":
        function = {"name": item["name"], "arguments": item.get("arguments", "")}
        call = {"id": item["call_id"], "type": "function", "function": function}
        return [{"role": "assistant", "content": None, "tool_calls": [call]}]
    if kind == "function_call_output":
        output = item.get("output", "")
        text = output if isinstance(output, str) else _text(output)
        return [{"role": "tool", "tool_call_id": item["call_id"], "content": text}]
    if kind == "reasoning":
        return []
    raise InvalidRequestError(
        f"a `{kind}` input item needs an OpenAI Responses upstream", param="input"
    )


def _chat_content(content: Any) -> Any:
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url", "")}})
        else:
            raise InvalidRequestError(
                f"an `{kind}` content part needs an OpenAI Responses upstream", param="input"
            )
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _merged_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive function calls (separate items in Responses) as one assistant message."""
    out: list[dict[str, Any]] = []
    for message in messages:
        previous = out[-1] if out else None
        if (
            previous is not None
            and message.get("tool_calls")
            and previous.get("tool_calls")
            and message["content"] is None
        ):
            previous["tool_calls"] = [*previous["tool_calls"], *message["tool_calls"]]
            continue
        out.append(message)
    return out


def _chat_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "function":
        raise InvalidRequestError(
            f"the `{tool.get('type')}` tool needs an OpenAI Responses upstream", param="tools"
        )
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise InvalidRequestError(
        "this `tool_choice` needs an OpenAI Responses upstream", param="tool_choice"
    )


def _response_format(fmt: Mapping[str, Any]) -> dict[str, Any]:
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": str(fmt.get("type"))}


def chat_to_response(
    completion: Mapping[str, Any], body: Mapping[str, Any], *, response_id: str, created_at: float
) -> dict[str, Any]:
    """The Responses `response` object for a chat `completion` of the request `body`."""
    choice = (completion.get("choices") or [{}])[0]
    chat = choice.get("message") or {}
    output: list[dict[str, Any]] = []
    if chat.get("content"):
        part = {"type": "output_text", "text": chat["content"], "annotations": []}
        output.append({"type": "message", "id": f"msg_{response_id[5:]}", "status": "completed",
                       "role": "assistant", "content": [part]})  # fmt: skip
    for i, call in enumerate(chat.get("tool_calls") or []):
        function = call.get("function") or {}
        output.append({
            "type": "function_call", "id": f"fc_{response_id[5:]}_{i}",
            "call_id": call.get("id") or f"call_{i}", "name": function.get("name", ""),
            "arguments": function.get("arguments", ""), "status": "completed",
        })  # fmt: skip
    finish = choice.get("finish_reason")
    incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(
        finish or ""
    )
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "incomplete" if incomplete else "completed",
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": completion.get("model") or body.get("model", ""),
        "output": output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "previous_response_id": body.get("previous_response_id"),
        "temperature": body.get("temperature"),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": list(body.get("tools") or []),
        "top_p": body.get("top_p"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "usage": response_usage(completion.get("usage") or {}),
    }


def response_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    prompt = int(usage.get("prompt_tokens") or 0)
    output = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def output_text(response: Mapping[str, Any]) -> str:
    """All output text of a response (what the SDK's `output_text` gives)."""
    return "".join(
        part.get("text", "")
        for item in response.get("output") or []
        if item.get("type") == "message"
        for part in item.get("content") or []
        if part.get("type") == "output_text"
    )
