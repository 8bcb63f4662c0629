"""Anthropic's streaming event sequence, both ways. Pure: no I/O.

    message_start        the message with empty content, stop_reason null, the input usage
    content_block_start  per block: text "" | tool_use with input {} | thinking "" | others whole
    content_block_delta  text_delta | input_json_delta | thinking_delta, signature_delta
    content_block_stop
    message_delta        stop_reason, stop_sequence, and the output tokens
    message_stop

- `message_events(message)`: replay a stored message as that sequence (a hit, streamed).
- `MessageAssembler`: fold the events an Anthropic upstream streams into the one message
  (so a stream can be stored and served later to a non-streaming request); `complete` says
  whether `message_stop` came after a stop reason (a cut-off stream is never stored).
- `ChatToMessageEvents`: turn an OpenAI-compatible upstream's chat chunks into this
  sequence as they come (the built-in engine answering `/v1/messages`).
- `sse(event)`: the SSE framing Anthropic uses (`event: TYPE` then `data: JSON`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from typing import Any

from infercache.anthropic.translate import _STOP_REASONS, message_usage

_PIECE_CHARS = 64


def sse(event: Mapping[str, Any]) -> bytes:
    data = json.dumps(event, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def _pieces(text: str) -> list[str]:
    return [text[i : i + _PIECE_CHARS] for i in range(0, len(text), _PIECE_CHARS)]


def _start_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    return {**usage, "output_tokens": min(1, int(usage.get("output_tokens") or 0))}


def message_events(message: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The events that stream `message`."""
    usage = dict(message.get("usage") or {})
    head = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": _start_usage(usage)}  # fmt: skip
    yield {"type": "message_start", "message": head}
    for index, block in enumerate(message.get("content") or []):
        yield from _block_events(index, block)
    delta = {"stop_reason": message.get("stop_reason"),
             "stop_sequence": message.get("stop_sequence")}  # fmt: skip
    yield {"type": "message_delta", "delta": delta,
           "usage": {"output_tokens": int(usage.get("output_tokens") or 0)}}  # fmt: skip
    yield {"type": "message_stop"}


def _block_events(index: int, block: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    kind = block.get("type")
    if kind == "text":
        yield _start(index, {**block, "text": ""})
        for piece in _pieces(block.get("text", "")):
            yield _delta(index, {"type": "text_delta", "text": piece})
    elif kind == "tool_use":
        yield _start(index, {**block, "input": {}})
        arguments = json.dumps(block.get("input", {}), separators=(",", ":"))
        for piece in _pieces(arguments):
            yield _delta(index, {"type": "input_json_delta", "partial_json": piece})
    elif kind == "thinking":
        yield _start(index, {**block, "thinking": "", "signature": ""})
        for piece in _pieces(block.get("thinking", "")):
            yield _delta(index, {"type": "thinking_delta", "thinking": piece})
        yield _delta(index, {"type": "signature_delta", "signature": block.get("signature", "")})
    else:  # redacted thinking, server tool blocks: whole in their start
        yield _start(index, dict(block))
    yield {"type": "content_block_stop", "index": index}


def _start(index: int, block: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": dict(block)}


def _delta(index: int, delta: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": dict(delta)}


class MessageAssembler:
    """Folds streamed events into the message they describe."""

    def __init__(self) -> None:
        self._message: dict[str, Any] | None = None
        self._json: dict[int, str] = {}
        self._stopped = False

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message_start":
            self._message = copy.deepcopy(dict(event.get("message") or {}))
            self._message["content"] = []
            return
        message = self._message
        if message is None:
            return
        if kind == "content_block_start":
            message["content"].append(copy.deepcopy(dict(event.get("content_block") or {})))
        elif kind == "content_block_delta":
            self._apply(int(event.get("index", 0)), event.get("delta") or {})
        elif kind == "content_block_stop":
            self._finish_block(int(event.get("index", 0)))
        elif kind == "message_delta":
            message.update({k: v for k, v in (event.get("delta") or {}).items() if v is not None})
            message["usage"] = {**(message.get("usage") or {}), **(event.get("usage") or {})}
        elif kind == "message_stop":
            self._stopped = True

    def _apply(self, index: int, delta: Mapping[str, Any]) -> None:
        assert self._message is not None
        block = self._message["content"][index]
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + delta.get("text", "")
        elif kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + delta.get("partial_json", "")
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + delta.get("thinking", "")
        elif kind == "signature_delta":
            block["signature"] = delta.get("signature", "")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def _finish_block(self, index: int) -> None:
        assert self._message is not None
        if index in self._json:
            raw = self._json.pop(index)
            self._message["content"][index]["input"] = json.loads(raw) if raw else {}

    @property
    def complete(self) -> bool:
        """`message_stop` came after a stop reason: the stream was not cut off."""
        return (
            self._stopped
            and self._message is not None
            and self._message.get("stop_reason") is not None
        )

    def result(self) -> dict[str, Any]:
        if self._message is None:
            raise ValueError("no message_start was streamed")
        return self._message


class ChatToMessageEvents:
    """Chat-completion chunks in, Anthropic events out, as they come (one choice)."""

    def __init__(self, message_id: str, model: str) -> None:
        self._id = message_id
        self._model = model
        self._started = False
        self._block: str | None = None  # the open block's kind
        self._index = -1
        self._calls: dict[int, int] = {}  # chat tool-call index → block index
        self._finish: str | None = None
        self._usage: dict[str, Any] = {}

    def feed(self, chunk: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        if not self._started:
            self._started = True
            head: dict[str, Any] = {
                "id": self._id, "type": "message", "role": "assistant", "model": self._model,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            }  # fmt: skip
            yield {"type": "message_start", "message": head}
        if chunk.get("usage"):
            self._usage = message_usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                yield from self._open("text", {"type": "text", "text": ""})
                yield _delta(self._index, {"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                yield from self._tool_call(call)
            if choice.get("finish_reason"):
                self._finish = _STOP_REASONS.get(choice["finish_reason"])

    def _open(self, kind: str, block: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if self._block == kind and kind == "text":
            return
        yield from self._close()
        self._index += 1
        self._block = kind
        yield _start(self._index, block)

    def _close(self) -> Iterator[dict[str, Any]]:
        if self._block is not None:
            yield {"type": "content_block_stop", "index": self._index}
            self._block = None

    def _tool_call(self, call: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        position = int(call.get("index", 0))
        function = call.get("function") or {}
        if position not in self._calls:
            block: dict[str, Any] = {
                "type": "tool_use", "id": call.get("id") or f"toolu_{position}",
                "name": function.get("name") or "", "input": {},
            }  # fmt: skip
            yield from self._close()
            self._index += 1
            self._block = "tool_use"
            self._calls[position] = self._index
            yield _start(self._index, block)
        if function.get("arguments"):
            partial = {"type": "input_json_delta", "partial_json": function["arguments"]}
            yield _delta(self._calls[position], partial)

    def finish(self) -> Iterator[dict[str, Any]]:
        """The closing events, once the upstream's stream ended with a finish reason."""
        yield from self._close()
        delta = {"stop_reason": self._finish, "stop_sequence": None}
        usage = {**self._usage} or {"output_tokens": 0}
        yield {"type": "message_delta", "delta": delta, "usage": usage}
        yield {"type": "message_stop"}

    @property
    def finished(self) -> bool:
        return self._finish is not None
