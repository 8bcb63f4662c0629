"""The Responses API's streaming events, both ways. Pure: no I/O.

    response.created, response.in_progress       the response, status in_progress, no output
    per output item:
      response.output_item.added                 the item, empty
      message: response.content_part.added, response.output_text.delta ...,
               response.output_text.done, response.content_part.done
      function_call: response.function_call_arguments.delta ..., .done
      response.output_item.done                  the item, whole
    response.completed (or .incomplete)          the whole response
Every event carries a `sequence_number` from 0.

- `response_events(response)`: replay a stored response (a hit, streamed).
- `ResponseAssembler`: what an upstream streamed, as the response its final event carries;
  `complete` only after `response.completed` (a cut-off or failed stream is never stored).
- `ChatToResponseEvents`: an OpenAI-compatible upstream's chat chunks as these events, as
  they come (the built-in engine answering `/v1/responses`).
- `sse(event)`: `event: TYPE` then `data: JSON`, as OpenAI frames them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

_PIECE_CHARS = 64
_FINAL = {"completed": "response.completed", "incomplete": "response.incomplete"}


def sse(event: Mapping[str, Any]) -> bytes:
    data = json.dumps(event, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def _pieces(text: str) -> list[str]:
    return [text[i : i + _PIECE_CHARS] for i in range(0, len(text), _PIECE_CHARS)]


class _Numbered:
    def __init__(self) -> None:
        self.next = 0

    def __call__(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.next, **fields}
        self.next += 1
        return event


def _opening(response: Mapping[str, Any], numbered: _Numbered) -> Iterator[dict[str, Any]]:
    head = {**response, "status": "in_progress", "output": [], "usage": None}
    yield numbered("response.created", response=head)
    yield numbered("response.in_progress", response=head)


def response_events(response: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The events that stream `response`."""
    numbered = _Numbered()
    yield from _opening(response, numbered)
    for index, item in enumerate(response.get("output") or []):
        yield from _item_events(index, item, numbered)
    final = _FINAL.get(str(response.get("status")), "response.completed")
    yield numbered(final, response=dict(response))


def _item_events(
    index: int, item: Mapping[str, Any], numbered: _Numbered
) -> Iterator[dict[str, Any]]:
    kind = item.get("type")
    if kind == "message":
        yield numbered("response.output_item.added", output_index=index,
                       item={**item, "status": "in_progress", "content": []})  # fmt: skip
        for part_index, part in enumerate(item.get("content") or []):
            yield from _part_events(index, part_index, str(item.get("id")), part, numbered)
    elif kind == "function_call":
        yield numbered("response.output_item.added", output_index=index,
                       item={**item, "status": "in_progress", "arguments": ""})  # fmt: skip
        where = {"item_id": item.get("id"), "output_index": index}
        arguments = str(item.get("arguments", ""))
        for piece in _pieces(arguments):
            yield numbered("response.function_call_arguments.delta", delta=piece, **where)
        yield numbered("response.function_call_arguments.done", arguments=arguments, **where)
    else:  # reasoning and built-in tool calls: whole
        yield numbered("response.output_item.added", output_index=index, item=dict(item))
    yield numbered("response.output_item.done", output_index=index, item=dict(item))


def _part_events(
    index: int, part_index: int, item_id: str, part: Mapping[str, Any], numbered: _Numbered
) -> Iterator[dict[str, Any]]:
    where = {"item_id": item_id, "output_index": index, "content_index": part_index}
    if part.get("type") != "output_text":
        yield numbered("response.content_part.added", part=dict(part), **where)
        yield numbered("response.content_part.done", part=dict(part), **where)
        return
    yield numbered("response.content_part.added", part={**part, "text": ""}, **where)
    text = str(part.get("text", ""))
    for piece in _pieces(text):
        yield numbered("response.output_text.delta", delta=piece, logprobs=[], **where)
    yield numbered("response.output_text.done", text=text, logprobs=[], **where)
    yield numbered("response.content_part.done", part=dict(part), **where)


class ResponseAssembler:
    """The response an upstream's stream ends with (its final event carries it whole)."""

    def __init__(self) -> None:
        self._final: dict[str, Any] | None = None

    def add(self, event: Mapping[str, Any]) -> None:
        if event.get("type") in _FINAL.values() or event.get("type") == "response.failed":
            self._final = dict(event.get("response") or {})

    @property
    def complete(self) -> bool:
        return self._final is not None and self._final.get("status") == "completed"

    def result(self) -> dict[str, Any]:
        if self._final is None:
            raise ValueError("the stream ended before its final event")
        return self._final


class ChatToResponseEvents:
    """Chat-completion chunks in, Responses events out (one choice): text as it comes; tool
    calls, and the closing events, from `finish(response)` with the response the chunks
    assembled into (chat_to_response of the CompletionAssembler's result)."""

    def __init__(self, head: Mapping[str, Any]) -> None:
        self._head = head
        self._numbered = _Numbered()
        self._started = False
        self._message_open = False

    def feed(self, chunk: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        if not self._started:
            self._started = True
            yield from _opening(self._head, self._numbered)
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):  # tool calls stream whole at the end, from `finish`
                yield from self._text_delta(delta["content"])

    def _text_delta(self, text: str) -> Iterator[dict[str, Any]]:
        item_id = f"msg_{str(self._head.get('id', 'resp_'))[5:]}"
        where = {"item_id": item_id, "output_index": 0, "content_index": 0}
        if not self._message_open:
            self._message_open = True
            item = {"type": "message", "id": item_id, "status": "in_progress",
                    "role": "assistant", "content": []}  # fmt: skip
            yield self._numbered("response.output_item.added", output_index=0, item=item)
            part = {"type": "output_text", "text": "", "annotations": []}
            yield self._numbered("response.content_part.added", part=part, **where)
        yield self._numbered("response.output_text.delta", delta=text, logprobs=[], **where)

    def finish(self, response: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """The closing events for `response` (the translation of the assembled answer)."""
        for index, item in enumerate(response.get("output") or []):
            if item.get("type") == "message" and index == 0 and self._message_open:
                part = item["content"][0]
                where = {"item_id": item.get("id"), "output_index": 0, "content_index": 0}
                yield self._numbered("response.output_text.done", text=part.get("text", ""),
                                     logprobs=[], **where)  # fmt: skip
                yield self._numbered("response.content_part.done", part=dict(part), **where)
                yield self._numbered("response.output_item.done", output_index=0, item=dict(item))
            else:
                yield from _item_events(index, item, self._numbered)
        final = _FINAL.get(str(response.get("status")), "response.completed")
        yield self._numbered(final, response=dict(response))
