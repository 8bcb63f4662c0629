"""Parsing OpenAI chat bodies, and the response shapes."""

from __future__ import annotations

from typing import Any

import pytest

from infercache.engine.openai_api import parse_chat_request
from infercache.engine.responses import ChunkStream, ResponseMeta, completion
from infercache.engine.runner import GenerationResult
from infercache.errors import InvalidRequestError
from tests.harness.engine_requests import request_stats

MESSAGES = [{"role": "user", "content": "hi"}]
META = ResponseMeta(id="chatcmpl-1", created=1, model="m", system_fingerprint="fp_x")
STATS = request_stats(10, 4, 3)


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MESSAGES, **fields}


def test_defaults_follow_openai() -> None:
    req = parse_chat_request(body())
    assert (req.temperature, req.top_p, req.max_tokens, req.stream) == (1.0, 1.0, None, False)
    assert req.stop == ()
    assert req.message_dicts() == MESSAGES


def test_fields_are_parsed() -> None:
    req = parse_chat_request(
        body(
            max_completion_tokens=5,
            temperature=0,
            top_p=0.5,
            seed=3,
            stop="END",
            stream=True,
            stream_options={"include_usage": True},
            user="alice",
            cache_salt="pepper",
            ignore_eos=True,
            n=1,
            messages=[
                {"role": "developer", "content": "be terse"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ],
        )
    )
    assert (req.max_tokens, req.temperature, req.top_p, req.seed) == (5, 0.0, 0.5, 3)
    assert (req.stop, req.stream, req.include_usage, req.user) == (("END",), True, True, "alice")
    assert req.messages == (("system", "be terse"), ("user", "ab"))
    assert (req.cache_salt, req.ignore_eos) == ("pepper", True)
    assert (parse_chat_request(body()).cache_salt, parse_chat_request(body()).ignore_eos) == (
        None,
        False,
    )


@pytest.mark.parametrize(
    ("bad", "param"),
    [
        ({"model": 3}, "model"),
        ({"cache_salt": ""}, "cache_salt"),
        ({"cache_salt": 7}, "cache_salt"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
        ),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": -0.1}, "top_p"),
        ({"n": 2}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"logprobs": True}, "logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"seed": 1.5}, "seed"),
        ({"user": 7}, "user"),
    ],
)
def test_bad_fields_raise_invalid_request_naming_the_parameter(
    bad: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_chat_request(body(**bad))
    assert info.value.param == param
    assert info.value.to_openai()["error"]["type"] == "invalid_request_error"


def test_a_body_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="JSON object"):
        parse_chat_request([1, 2])


def test_completion_reports_cached_tokens_and_the_fingerprint() -> None:
    out = completion(META, GenerationResult("Paris", (1, 2, 3), "stop", STATS))
    assert out["system_fingerprint"] == "fp_x"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "Paris"}
    assert out["choices"][0]["finish_reason"] == "stop"
    assert out["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 4},
    }


def test_chunks_end_with_the_finish_reason_then_usage_when_asked() -> None:
    stream = ChunkStream(META, include_usage=True)
    chunks = [
        *stream.start(),
        stream.content("Pa"),
        *stream.finish(GenerationResult("Pa", (1,), "length", STATS)),
    ]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["choices"][0]["delta"] == {"content": "Pa"}
    assert chunks[2]["choices"][0]["finish_reason"] == "length"
    assert chunks[3]["choices"] == []
    assert chunks[3]["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}
    assert all(c["usage"] is None for c in chunks[:3])
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
