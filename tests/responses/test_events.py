"""Responses events checked against the official openai SDK's types and stream state: a
replayed response streams back to the same response; chat chunks translate into one."""

from __future__ import annotations

from typing import Any

import pydantic
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

from infercache.chat import CompletionAssembler, chunks_from_completion
from infercache.responses.events import (
    ChatToResponseEvents,
    ResponseAssembler,
    response_events,
    sse,
)
from infercache.responses.translate import chat_to_response, output_text

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
BODY = {"model": "gpt-x", "input": "Capital of France?", "temperature": 0}


def completion(with_tool: bool) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "Paris is the capital. " * 5}
    if with_tool:
        message["tool_calls"] = [{"id": "call_1", "type": "function",
                                  "function": {"name": "f", "arguments": '{"a":1}'}}]  # fmt: skip
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if with_tool else "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29},
    }  # fmt: skip


def sdk_final(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Each event as the SDK's type, through the SDK's own stream state; its final response."""
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    final = None
    for event in events:
        parsed = EVENT.validate_python(event)
        for out in state.handle_event(parsed):
            if out.type == "response.completed":
                final = out.response
    assert final is not None
    numbers = [e["sequence_number"] for e in events]
    assert numbers == list(range(len(events)))
    dumped: dict[str, Any] = Response.model_validate(_unparsed(final.model_dump())).model_dump()
    return dumped


def sdk(response: dict[str, Any]) -> dict[str, Any]:
    """`response` as the SDK's Response type reads it."""
    dumped: dict[str, Any] = Response.model_validate(response).model_dump()
    return dumped


def _unparsed(value: Any) -> Any:
    """Without the SDK's parsing additions (`parsed`, `parsed_arguments`)."""
    if isinstance(value, dict):
        skip = ("parsed", "parsed_arguments")
        return {k: _unparsed(v) for k, v in value.items() if k not in skip}
    if isinstance(value, list):
        return [_unparsed(v) for v in value]
    return value


def test_a_replayed_response_streams_back_to_the_same_response() -> None:
    response = chat_to_response(completion(True), BODY, response_id="resp_abc", created_at=1.0)
    events = list(response_events(response))
    assert sdk_final(events) == sdk(response)
    assert Response.model_validate(response).output_text == output_text(response)
    assert output_text(response) == "Paris is the capital. " * 5
    assembler = ResponseAssembler()
    for event in events:
        assembler.add(event)
    assert assembler.complete
    assert assembler.result() == response
    assert sse(events[0]).startswith(b"event: response.created\ndata: {")


def test_a_stream_without_its_final_event_is_not_complete() -> None:
    response = chat_to_response(completion(False), BODY, response_id="resp_abc", created_at=1.0)
    assembler = ResponseAssembler()
    for event in list(response_events(response))[:-1]:
        assembler.add(event)
    assert not assembler.complete


def test_chat_chunks_translate_into_the_response_a_completion_would() -> None:
    for with_tool in (False, True):
        whole = completion(with_tool)
        response = chat_to_response(whole, BODY, response_id="resp_x", created_at=2.0)
        translator = ChatToResponseEvents({**response, "output": []})
        events: list[dict[str, Any]] = []
        assembler = CompletionAssembler()
        for chunk in chunks_from_completion(whole, include_usage=True, piece_chars=9):
            assembler.add(chunk)
            events.extend(translator.feed(chunk))
        assembled = chat_to_response(assembler.result(), BODY, response_id="resp_x", created_at=2.0)
        events.extend(translator.finish(assembled))
        assert sdk_final(events) == sdk(response)
