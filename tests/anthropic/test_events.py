"""Anthropic's event sequence, checked against the official SDK's own types and accumulator:
a replayed message streams back to the same message; a chat stream translates into one."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent

from infercache.anthropic.events import (
    ChatToMessageEvents,
    MessageAssembler,
    message_events,
    sse,
)
from infercache.anthropic.translate import chat_to_message
from infercache.chat import CompletionAssembler, chunks_from_completion

EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)

MESSAGE: dict[str, Any] = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "content": [
        {"type": "thinking", "thinking": "Let me think " * 20, "signature": "sig=="},
        {"type": "text", "text": "The capital of France is Paris. " * 5},
        {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"city": "Paris", "n": 3}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 12,
        "output_tokens": 57,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 3000,
    },
}


def sdk_message(events: list[dict[str, Any]]) -> Message:
    """What the official SDK's stream accumulator makes of these events."""
    snapshot = None
    for event in events:
        snapshot = accumulate_event(
            event=EVENT.validate_python(event), current_snapshot=snapshot, json_bufs={}
        )
    assert snapshot is not None
    return Message.model_validate(snapshot.model_dump())


def test_a_replayed_message_streams_back_to_the_same_message_in_the_sdk() -> None:
    events = list(message_events(MESSAGE))
    assert [e["type"] for e in events[:2]] == ["message_start", "content_block_start"]
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    assert sdk_message(events) == Message.model_validate(MESSAGE)
    assembler = MessageAssembler()
    for event in events:
        assembler.add(event)
    assert assembler.complete
    assert assembler.result() == MESSAGE


def test_a_stream_cut_off_before_its_stop_is_not_complete() -> None:
    assembler = MessageAssembler()
    for event in list(message_events(MESSAGE))[:-2]:
        assembler.add(event)
    assert not assembler.complete


def test_sse_frames_name_each_event() -> None:
    frame = sse({"type": "message_stop"})
    assert frame == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


@pytest.mark.parametrize("with_tool", [False, True])
def test_a_chat_stream_translates_into_the_message_a_completion_would(with_tool: bool) -> None:
    message: dict[str, Any] = {"role": "assistant", "content": "Paris is the capital. " * 4}
    if with_tool:
        arguments = '{"city":"Paris"}'
        message["tool_calls"] = [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": arguments}}
        ]
    finish = "tool_calls" if with_tool else "stop"
    completion = {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29,
                  "prompt_tokens_details": {"cached_tokens": 16}},
    }  # fmt: skip
    translator = ChatToMessageEvents("msg_x", "m")
    events: list[dict[str, Any]] = []
    for chunk in chunks_from_completion(completion, include_usage=True, piece_chars=7):
        events.extend(translator.feed(chunk))
    assert translator.finished
    events.extend(translator.finish())
    streamed = sdk_message(events)
    whole = chat_to_message(completion, message_id="msg_x")
    assert streamed.content == Message.model_validate(whole).content
    assert streamed.stop_reason == whole["stop_reason"]
    assert streamed.usage.output_tokens == 9
    assert streamed.usage.cache_read_input_tokens == 16
    assembler = CompletionAssembler()
    for chunk in chunks_from_completion(completion, include_usage=True):
        assembler.add(chunk)
    assert chat_to_message(assembler.result(), message_id="msg_x") == whole
