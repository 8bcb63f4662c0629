"""OpenAI chat-completions shapes shared by the engine server and the gateway, and the legacy
`text_completion` ones (`object: "text_completion"`, choices with `text`), which stream as the
same chunk objects with a `text` piece per choice instead of a `delta`.

- `chunks_from_completion`: replay a stored (non-streaming) completion as the chunk sequence the
  OpenAI API streams: a role chunk, one content chunk per piece, a finish chunk, then a usage chunk
  when `include_usage` is asked (choices empty, as OpenAI sends it).
- `CompletionAssembler`: the inverse, folding streamed chunks into one completion so a stream can
  be stored and later served to a non-streaming request. It knows whether the stream completed
  (every choice got a finish_reason).
- `sse_event` / `SSE_DONE`: the Server-Sent-Events framing (`data: {json}\\n\\n`, `data: [DONE]`).
- `include_usage` / `for_client`: a stream is fetched with usage (the stored answer needs it)
  and passed to each client as it asked (`stream_options.include_usage`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

# One `chat.completion.chunk` body, as streamed.
StreamChunk = dict[str, Any]

SSE_DONE = b"data: [DONE]\n\n"
# Finish reasons of an answer that is complete and safe to reuse. `content_filter` is a refusal by
# policy and `None` means the answer was cut off: neither is ever stored.
COMPLETE_FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "function_call"})


def include_usage(body: Mapping[str, Any]) -> bool:
    """The client asked for the usage chunk (`stream_options.include_usage`)."""
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def for_client(chunk: StreamChunk, include_usage: bool) -> StreamChunk | None:
    """A chunk fetched with usage, as a client asked for it: usage only with
    `stream_options.include_usage` (a usage-only chunk dropped, usage stripped from others)."""
    if include_usage or chunk.get("usage") is None:
        return chunk
    if not chunk.get("choices"):
        return None
    return {k: v for k, v in chunk.items() if k != "usage"}


def translated_id(prefix: str, chat_id: object) -> str:
    """The id of an answer translated from a chat completion (`msg_`, `resp_`): its chat
    completion's, unique per answer, under the other API's prefix."""
    return prefix + str(chat_id or "").removeprefix("chatcmpl-")


def sse_event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _chunk_base(response: dict[str, Any]) -> dict[str, Any]:
    base = {
        "id": response.get("id", "chatcmpl-cached"),
        "object": "chat.completion.chunk",
        "created": response.get("created", 0),
        "model": response.get("model", ""),
    }
    if response.get("system_fingerprint") is not None:
        base["system_fingerprint"] = response["system_fingerprint"]
    return base


def _pieces(text: str, piece_chars: int) -> list[str]:
    return [text[i : i + piece_chars] for i in range(0, len(text), piece_chars)] or []


def _text_chunks(
    response: dict[str, Any], include_usage: bool, piece_chars: int
) -> Iterator[dict[str, Any]]:
    base = {**_chunk_base(response), "object": "text_completion"}
    for choice in response.get("choices") or []:
        idx = choice.get("index", 0)
        for piece in _pieces(choice.get("text") or "", piece_chars):
            yield {
                **base,
                "choices": [{"index": idx, "text": piece, "logprobs": None, "finish_reason": None}],
            }
        last = {"index": idx, "text": "", "logprobs": choice.get("logprobs"),
                "finish_reason": choice.get("finish_reason")}  # fmt: skip
        yield {**base, "choices": [last]}
    if include_usage and response.get("usage") is not None:
        yield {**base, "choices": [], "usage": response["usage"]}


def chunks_from_completion(
    response: dict[str, Any], *, include_usage: bool = False, piece_chars: int = 64
) -> Iterator[dict[str, Any]]:
    """The chunk sequence that streams `response` (a `chat.completion` body, or a legacy
    `text_completion` one)."""
    if response.get("object") == "text_completion":
        yield from _text_chunks(response, include_usage, piece_chars)
        return
    base = _chunk_base(response)
    choices = response.get("choices") or []
    for choice in choices:
        idx = choice.get("index", 0)
        msg = choice.get("message") or {}
        first: dict[str, Any] = {"role": msg.get("role", "assistant"), "content": ""}
        yield {**base, "choices": [{"index": idx, "delta": first, "finish_reason": None}]}
        for piece in _pieces(msg.get("content") or "", piece_chars):
            delta = {"content": piece}
            yield {**base, "choices": [{"index": idx, "delta": delta, "finish_reason": None}]}
        if msg.get("tool_calls"):
            calls = [{"index": i, **call} for i, call in enumerate(msg["tool_calls"])]
            delta2: dict[str, Any] = {"tool_calls": calls}
            yield {**base, "choices": [{"index": idx, "delta": delta2, "finish_reason": None}]}
        finish = {"index": idx, "delta": {}, "finish_reason": choice.get("finish_reason")}
        if choice.get("logprobs") is not None:
            finish["logprobs"] = choice["logprobs"]
        yield {**base, "choices": [finish]}
    if include_usage and response.get("usage") is not None:
        yield {**base, "choices": [], "usage": response["usage"]}


class CompletionAssembler:
    """Folds `chat.completion.chunk`s into one `chat.completion` (or legacy `text_completion`
    chunks into one `text_completion`)."""

    def __init__(self) -> None:
        self._base: dict[str, Any] | None = None
        self._choices: dict[int, dict[str, Any]] = {}
        self._usage: dict[str, Any] | None = None
        self._text = False  # legacy text_completion chunks

    def add(self, chunk: dict[str, Any]) -> None:
        if chunk.get("object") == "text_completion":
            self._text = True
        if self._base is None:
            self._base = {k: chunk[k] for k in ("id", "created", "model") if k in chunk}
            if chunk.get("system_fingerprint") is not None:
                self._base["system_fingerprint"] = chunk["system_fingerprint"]
        if chunk.get("usage") is not None:
            self._usage = chunk["usage"]
        for c in chunk.get("choices") or []:
            idx = c.get("index", 0)
            state = self._choices.setdefault(
                idx,
                {"role": "assistant", "content": [], "tool_calls": {}, "finish_reason": None},
            )
            if isinstance(c.get("text"), str):
                state["content"].append(c["text"])
            delta = c.get("delta") or {}
            if delta.get("role"):
                state["role"] = delta["role"]
            if delta.get("content"):
                state["content"].append(delta["content"])
            if delta.get("refusal"):
                state["refusal"] = (state.get("refusal") or "") + delta["refusal"]
            for call in delta.get("tool_calls") or []:
                slot = state["tool_calls"].setdefault(
                    call.get("index", 0),
                    {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.get("id"):
                    slot["id"] = call["id"]
                fn = call.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
            if c.get("finish_reason") is not None:
                state["finish_reason"] = c["finish_reason"]
            if c.get("logprobs") is not None:
                state["logprobs"] = c["logprobs"]

    @property
    def complete(self) -> bool:
        """Every choice seen got a finish_reason (the stream was not cut off)."""
        return bool(self._choices) and all(
            s["finish_reason"] is not None for s in self._choices.values()
        )

    def result(self) -> dict[str, Any]:
        if self._text:
            return self._text_result()
        base = self._base or {}
        choices = []
        for idx in sorted(self._choices):
            s = self._choices[idx]
            message: dict[str, Any] = {"role": s["role"], "content": "".join(s["content"])}
            if s["tool_calls"]:
                message["tool_calls"] = [s["tool_calls"][i] for i in sorted(s["tool_calls"])]
            if s.get("refusal"):
                message["refusal"] = s["refusal"]
            choice: dict[str, Any] = {
                "index": idx,
                "message": message,
                "finish_reason": s["finish_reason"],
            }
            if "logprobs" in s:
                choice["logprobs"] = s["logprobs"]
            choices.append(choice)
        out: dict[str, Any] = {
            "id": base.get("id", "chatcmpl-stream"),
            "object": "chat.completion",
            "created": base.get("created", 0),
            "model": base.get("model", ""),
            "choices": choices,
        }
        if "system_fingerprint" in base:
            out["system_fingerprint"] = base["system_fingerprint"]
        if self._usage is not None:
            out["usage"] = self._usage
        return out

    def _text_result(self) -> dict[str, Any]:
        base = self._base or {}
        out: dict[str, Any] = {
            "id": base.get("id", "cmpl-stream"),
            "object": "text_completion",
            "created": base.get("created", 0),
            "model": base.get("model", ""),
            "choices": [
                {
                    "index": idx,
                    "text": "".join(self._choices[idx]["content"]),
                    "logprobs": self._choices[idx].get("logprobs"),
                    "finish_reason": self._choices[idx]["finish_reason"],
                }
                for idx in sorted(self._choices)
            ],
        }
        if "system_fingerprint" in base:
            out["system_fingerprint"] = base["system_fingerprint"]
        if self._usage is not None:
            out["usage"] = self._usage
        return out
