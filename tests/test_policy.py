"""What may be cached and for how long."""

from __future__ import annotations

from typing import Any

import pytest

from infercache.policy import (
    NO_STORE,
    SAMPLED,
    SIDE_EFFECTS,
    CachePolicy,
    not_cacheable_reason,
    unstorable_reason,
)
from infercache.request import parse_request
from tests.harness.vocabulary import chat

POLICY = CachePolicy(default_ttl_s=60, max_ttl_s=600)


def test_greedy_and_seeded_requests_are_cacheable() -> None:
    assert POLICY.uncacheable_reason(parse_request(chat(temperature=0))) is None
    assert POLICY.uncacheable_reason(parse_request(chat(temperature=0.9, seed=7))) is None


def test_sampled_requests_without_seed_are_not_cacheable_unless_opted_in() -> None:
    sampled = parse_request(chat(temperature=0.9))
    no_temperature = chat()
    del no_temperature["temperature"]
    assert POLICY.uncacheable_reason(sampled) is not None
    assert POLICY.uncacheable_reason(parse_request(no_temperature)) is not None  # API default 1
    opted_in = CachePolicy(default_ttl_s=60, max_ttl_s=600, cache_sampled=True)
    assert opted_in.uncacheable_reason(sampled) is None


def test_not_cacheable_names_one_fixed_phrase_side_effects_first() -> None:
    tool = {"type": "function", "function": {"name": "send", "x-side-effects": True}}
    cases = {
        SIDE_EFFECTS: chat(temperature=0.9, tools=[tool]),
        SAMPLED: chat(temperature=0.9),
        NO_STORE: chat(temperature=0, infercache={"cache_control": ["no-cache"]}),
        None: chat(temperature=0),
    }
    for phrase, body in cases.items():
        assert not_cacheable_reason(parse_request(body), POLICY) == phrase


def test_ttl_defaults_and_is_capped() -> None:
    assert POLICY.ttl_s(parse_request(chat())) == 60
    assert POLICY.ttl_s(parse_request(chat(infercache={"ttl_s": 5}))) == 5
    assert POLICY.ttl_s(parse_request(chat(infercache={"ttl_s": 10**9}))) == 600


def test_a_ttl_is_required() -> None:
    with pytest.raises(ValueError, match="default_ttl_s"):
        CachePolicy(default_ttl_s=0, max_ttl_s=10)


def ok(**choice: Any) -> dict[str, Any]:
    c = {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
    c.update(choice)
    return {"choices": [c]}


def test_only_complete_answers_are_storable() -> None:
    assert unstorable_reason(ok()) is None
    assert unstorable_reason(ok(finish_reason="length")) is None
    assert unstorable_reason(ok(finish_reason="tool_calls")) is None
    assert unstorable_reason(ok(finish_reason=None)) is not None  # partial
    assert unstorable_reason(ok(finish_reason="content_filter")) is not None
    refusal = {"role": "assistant", "content": None, "refusal": "I can't help with that."}
    assert unstorable_reason(ok(message=refusal)) is not None
    assert unstorable_reason({"choices": []}) is not None
    assert unstorable_reason({"error": {"message": "boom"}}) is not None
