"""Responses requests validated, made whole, keyed and translated to chat."""

from __future__ import annotations

from typing import Any

import pytest

from infercache.errors import InvalidRequestError
from infercache.responses.request import (
    conversation_after,
    is_sampled,
    key_body,
    last_user_text,
    resolved,
    unstorable_reason,
    validate,
)
from infercache.responses.translate import chat_to_response, input_items, responses_to_chat


def body(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"model": "gpt-x", "input": "Capital of France?", "temperature": 0}
    out.update(fields)
    return out


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": None}, "model"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input.0"),
        ({"temperature": 3}, "temperature"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"previous_response_id": 7}, "previous_response_id"),
    ],
)
def test_bad_requests_name_the_field(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        validate(body(**fields))
    assert refused.value.param == param


def test_a_follow_up_is_made_whole_from_the_conversation_it_continues() -> None:
    first = body(instructions="Be terse.")
    paris = {"choices": [{"message": {"content": "Paris."}, "finish_reason": "stop"}]}
    answer = chat_to_response(paris, first, response_id="resp_1", created_at=1.0)
    earlier = conversation_after(first, answer)
    follow_up = body(input="And of Spain?", previous_response_id="resp_1", store=True)
    whole = resolved(follow_up, earlier)
    assert "previous_response_id" not in whole
    assert [i.get("role") for i in whole["input"]] == ["user", "assistant", "user"]
    assert last_user_text(whole["input"]) == "And of Spain?"
    spelled_out = body(input=[*earlier, *input_items("And of Spain?")])
    assert key_body(whole) == key_body(spelled_out)  # keyed on content, not on an id
    chat = responses_to_chat(whole, whole["input"])
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "user"]
    assert chat["messages"][1]["content"] == "Paris."


def test_what_chat_cannot_do_is_refused_and_formats_translate() -> None:
    with pytest.raises(InvalidRequestError) as refused:
        responses_to_chat(body(reasoning={"effort": "low"}), input_items("x"))
    assert refused.value.param == "reasoning"
    with pytest.raises(InvalidRequestError):
        responses_to_chat(body(tools=[{"type": "web_search"}]), input_items("x"))
    fmt = {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}}
    chat = responses_to_chat(body(text=fmt, max_output_tokens=9), input_items("x"))
    assert chat["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}
    }  # fmt: skip
    assert chat["max_tokens"] == 9


def test_sampling_and_what_is_stored() -> None:
    assert not is_sampled(body())
    assert is_sampled(body(temperature=None))
    assert is_sampled(body(reasoning={"effort": "low"}))
    done = chat_to_response(
        {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]}, body(),
        response_id="resp_2", created_at=1.0,
    )  # fmt: skip
    assert unstorable_reason(done) is None
    cut = chat_to_response(
        {"choices": [{"message": {"content": "x"}, "finish_reason": "length"}]}, body(),
        response_id="resp_3", created_at=1.0,
    )  # fmt: skip
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}
    assert unstorable_reason(cut) == "status incomplete"
    refused = {**done, "output": [{"type": "message", "content": [{"type": "refusal"}]}]}
    assert unstorable_reason(refused) == "refusal"
    assert key_body(body(stream=True, store=False, metadata={"a": "b"})) == key_body(body())
