"""Anthropic Messages ⇄ OpenAI chat completions, for upstreams that speak only chat (the
built-in engine, vLLM, any OpenAI-compatible server). Pure: no I/O.

Request (`messages_to_chat`):
    system (a string or text blocks)      → a leading `system` message
    messages[].content (string or blocks) → text joined per message; `image` blocks → image_url
                                            parts; `tool_use` → assistant `tool_calls`;
                                            `tool_result` → a `tool` message
    max_tokens, temperature, top_p, stop_sequences → max_tokens, temperature, top_p, stop
    tools[] {name, description, input_schema}      → function tools
    tool_choice auto | any | tool{name} | none      → auto | required | {function} | none
    top_k, thinking                        → refused with a 400 naming the field: an OpenAI
                                            upstream has no such control, and dropping one
                                            would change the answer behind the caller's back
    metadata, stream, service_tier, cache_control  → not sent (delivery, not the answer)

Answer (`chat_to_message`): content text → a `text` block, tool calls → `tool_use` blocks;
finish_reason stop → `end_turn`, length → `max_tokens`, tool_calls → `tool_use`,
content_filter → `refusal`; usage → `input_tokens` (the uncached part), `output_tokens`,
`cache_read_input_tokens` (OpenAI's `cached_tokens`), `cache_creation_input_tokens` 0.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from infercache.errors import InvalidRequestError

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_UNTRANSLATABLE = ("top_k", "thinking")


def messages_to_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completions body asking what the Messages `body` asks (validated already)."""
    for name in _UNTRANSLATABLE:
        if body.get(name) is not None and not _disabled_thinking(name, body.get(name)):
            raise InvalidRequestError(
                f"`{name}` needs an Anthropic upstream: this one speaks OpenAI chat", param=name
            )
    out: dict[str, Any] = {"model": body["model"], "max_tokens": body["max_tokens"]}
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _text_of(system)})
    for message in body["messages"]:
        messages.extend(_chat_messages(message))
    out["messages"] = messages
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stop_sequences"):
        out["stop"] = list(body["stop_sequences"])
    if body.get("tools"):
        out["tools"] = [_chat_tool(t) for t in body["tools"]]
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _chat_tool_choice(body["tool_choice"])
    return out


def _disabled_thinking(name: str, value: Any) -> bool:
    return name == "thinking" and isinstance(value, Mapping) and value.get("type") == "disabled"


def _text_of(content: Any) -> str:
    """A system prompt or message content as plain text (text blocks joined)."""
    if isinstance(content, str):
        return content
    return "".join(
        b.get("text", "") for b in content if isinstance(b, Mapping) and b.get("type") == "text"
    )


def _chat_messages(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    role, content = message["role"], message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": block.get("text", "")})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block)}})
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input", {}), separators=(",", ":"))
            calls.append({"id": block["id"], "type": "function",
                          "function": {"name": block["name"], "arguments": arguments}})  # fmt: skip
        elif kind == "tool_result":
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": _text_of(block.get("content", ""))})  # fmt: skip
        elif kind not in ("thinking", "redacted_thinking"):  # earlier turns' reasoning
            raise InvalidRequestError(
                f"a `{kind}` content block needs an Anthropic upstream", param="messages"
            )
    out: list[dict[str, Any]] = list(results)
    if parts or calls:
        text_only = all(p["type"] == "text" for p in parts)
        chat: dict[str, Any] = {
            "role": role,
            "content": "".join(p["text"] for p in parts) if text_only else parts,
        }
        if calls:
            chat["tool_calls"] = calls
        out.append(chat)
    return out


def _image_url(block: Mapping[str, Any]) -> str:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    return str(source.get("url", ""))


def _chat_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("input_schema", {})}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Mapping[str, Any]) -> Any:
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(str(kind), "auto")


def chat_to_message(completion: Mapping[str, Any], *, message_id: str) -> dict[str, Any]:
    """The Anthropic `message` for a chat `completion` (one choice)."""
    choice = (completion.get("choices") or [{}])[0]
    chat = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if chat.get("content"):
        content.append({"type": "text", "text": chat["content"]})
    for call in chat.get("tool_calls") or []:
        function = call.get("function") or {}
        block = {"type": "tool_use", "id": call.get("id") or "", "name": function.get("name", ""),
                 "input": _arguments(function.get("arguments"))}  # fmt: skip
        content.append(block)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": completion.get("model", ""),
        "content": content,
        "stop_reason": _STOP_REASONS.get(choice.get("finish_reason") or ""),
        "stop_sequence": None,
        "usage": message_usage(completion.get("usage") or {}),
    }


def _arguments(raw: Any) -> dict[str, Any]:
    try:
        parsed = json.loads(raw) if isinstance(raw, str) and raw else {}
    except json.JSONDecodeError:
        return {"_raw": raw}
    return parsed if isinstance(parsed, dict) else {"_value": parsed}


def message_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    """OpenAI usage → Anthropic's: `input_tokens` counts only what the cache did not serve."""
    prompt = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0
    return {
        "input_tokens": max(0, prompt - cached),
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }
