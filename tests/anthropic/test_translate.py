"""Messages requests validated, keyed and translated to chat; chat answers back to messages."""

from __future__ import annotations

from typing import Any

import pytest

from infercache.anthropic.request import (
    is_sampled,
    key_body,
    last_user_text,
    unstorable_reason,
    validate,
)
from infercache.anthropic.translate import chat_to_message, messages_to_chat
from infercache.errors import InvalidRequestError


def request(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "system": [
            {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "temperature": 0,
    }
    body.update(fields)
    return body


def test_a_conversation_with_tools_translates_to_chat() -> None:
    body = request(
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather",
                 "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "And tomorrow?"},
            ]},
        ],
        tools=[{"name": "weather", "description": "d", "input_schema": {"type": "object"}}],
        tool_choice={"type": "any"},
        stop_sequences=["END"],
        metadata={"user_id": "u1"},
    )  # fmt: skip
    validate(body)
    chat = messages_to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ]  # fmt: skip
    assert chat["tool_choice"] == "required"
    assert chat["stop"] == ["END"]
    assert chat["tools"][0]["function"]["parameters"] == {"type": "object"}
    assert "metadata" not in chat


@pytest.mark.parametrize(
    ("field", "value"), [("top_k", 5), ("thinking", {"type": "enabled", "budget_tokens": 2048})]
)
def test_what_chat_cannot_express_is_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        messages_to_chat(request(**{field: value}))
    assert refused.value.param == field
    messages_to_chat(request(thinking={"type": "disabled"}))  # asks for nothing


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": ""}, "model"),
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages.0"),
        ({"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
        ({"temperature": 1.5}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"stop_sequences": [""]}, "stop_sequences"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ],
)
def test_bad_requests_name_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        validate(request(**fields))
    assert refused.value.param == param


def test_the_key_body_drops_delivery_and_breakpoints_and_folds_in_the_beta() -> None:
    marked = request(stream=True, metadata={"user_id": "a"})
    plain = request(system=[{"type": "text", "text": "You are terse."}])
    assert key_body(marked, None) == key_body(plain, None)
    assert key_body(plain, "b2, b1") == key_body(plain, "b1,b2") != key_body(plain, None)
    assert key_body(request(temperature=0.5), None) != key_body(plain, None)


def test_sampling_storing_and_the_compared_text() -> None:
    assert not is_sampled(request())
    assert is_sampled(request(temperature=None))
    assert is_sampled(request(temperature=0.7))
    ok = {"type": "message", "content": [{"type": "text", "text": "x"}], "stop_reason": "end_turn"}
    assert unstorable_reason(ok) is None
    for stop in ("max_tokens", "refusal", "pause_turn", None):
        assert unstorable_reason({**ok, "stop_reason": stop}) == f"stop_reason {stop}"
    assert unstorable_reason({**ok, "content": []}) == "empty content"
    assert unstorable_reason({"type": "error"}) == "not a message"
    assert last_user_text(request()) == "Capital of France?"
    image = {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}
    assert last_user_text(request(messages=[{"role": "user", "content": [image]}])) is None


def test_a_chat_answer_becomes_a_message_with_anthropic_usage() -> None:
    completion = {
        "model": "m",
        "choices": [{"message": {"content": "Paris."}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1100, "completion_tokens": 2,
                  "prompt_tokens_details": {"cached_tokens": 1024}},
    }  # fmt: skip
    message = chat_to_message(completion, message_id="msg_1")
    assert message["content"] == [{"type": "text", "text": "Paris."}]
    assert message["stop_reason"] == "max_tokens"
    assert message["usage"] == {
        "input_tokens": 76, "output_tokens": 2,
        "cache_creation_input_tokens": 0, "cache_read_input_tokens": 1024,
    }  # fmt: skip
