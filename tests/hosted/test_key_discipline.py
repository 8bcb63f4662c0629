"""The exact key of the two new endpoints (issue 25 acceptance 5), as a property: byte-identical
requests give one key; changing any field that can change the answer changes it; delivery
fields and Anthropic's `cache_control` breakpoints do not; a tenant is always part of it; and
the two APIs never share a key with each other or with chat. End to end, two tenants asking the
same thing through the gateway each reach the upstream."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from infercache.gateway.config import UpstreamSpec
from infercache.keys import exact_key
from infercache.request import Endpoint, parse_request
from tests.gateway.conftest import MakeGateway

text = st.text(min_size=1, max_size=30)
unit = st.floats(min_value=0, max_value=1, allow_nan=False).map(lambda x: round(x, 3))
tool = st.builds(
    lambda name, field: {"name": name, "description": "d",
                         "input_schema": {"type": "object", "properties": {field: {}}}},
    st.from_regex(r"[a-z]{1,8}", fullmatch=True), st.from_regex(r"[a-z]{1,8}", fullmatch=True),
)  # fmt: skip


@st.composite
def messages_body(draw: st.DrawFn) -> dict[str, Any]:
    turns = draw(st.lists(text, min_size=1, max_size=3))
    body: dict[str, Any] = {
        "model": draw(st.sampled_from(["claude-sonnet-4-5", "claude-haiku-4-5"])),
        "max_tokens": draw(st.integers(1, 4096)),
        "messages": [
            {"role": "user" if i % 2 == 0 else "assistant", "content": t}
            for i, t in enumerate(turns)
        ],
    }
    if draw(st.booleans()):
        body["system"] = draw(text)
    if draw(st.booleans()):
        body["temperature"] = draw(unit)
    if draw(st.booleans()):
        body["tools"] = draw(st.lists(tool, min_size=1, max_size=2))
    return body


@st.composite
def responses_body(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": draw(st.sampled_from(["gpt-4.1-mini", "gpt-5"])),
        "input": draw(
            st.one_of(
                text,
                st.lists(text, min_size=1, max_size=3).map(
                    lambda ts: [{"role": "user", "content": t} for t in ts]
                ),
            )
        ),
    }
    if draw(st.booleans()):
        body["instructions"] = draw(text)
    if draw(st.booleans()):
        body["temperature"] = draw(unit)
    if draw(st.booleans()):
        body["max_output_tokens"] = draw(st.integers(1, 4096))
    return body


def key(
    body: dict[str, Any], endpoint: Endpoint, tenant: str = "t", beta: str | None = None
) -> str:
    return exact_key(parse_request(body, tenant=tenant, endpoint=endpoint, beta=beta))


def _other(value: Any) -> Any:
    """A value of the same field that differs."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1 if value < 1 or isinstance(value, int) else value / 2
    if isinstance(value, str):
        return value + "!"
    return [*value, copy.deepcopy(value[-1])] if isinstance(value, list) else {**value, "x": 1}


# Every answer-changing field and a way to change it; the fields absent from a body are added.
MESSAGES_CHANGES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "model": lambda b: b["model"] + "-20250929",
    "max_tokens": lambda b: b["max_tokens"] + 1,
    "system": lambda b: _other(b.get("system", "Be brief.")),
    "messages": lambda b: [*b["messages"][:-1],
                           {**b["messages"][-1], "content": b["messages"][-1]["content"] + "?"}],
    "temperature": lambda b: 0.5 if b.get("temperature") != 0.5 else 0.25,
    "top_p": lambda b: 0.5,
    "top_k": lambda b: 5,
    "stop_sequences": lambda b: ["END"],
    "tools": lambda b: [*b.get("tools", []), {"name": "zz", "input_schema": {"type": "object"}}],
    "tool_choice": lambda b: {"type": "any"},
    "thinking": lambda b: {"type": "enabled", "budget_tokens": 1024},
}  # fmt: skip
RESPONSES_CHANGES: dict[str, Callable[[dict[str, Any]], Any]] = {
    "model": lambda b: b["model"] + "-mini",
    "input": lambda b: _other(b["input"]),
    "instructions": lambda b: _other(b.get("instructions", "Be brief.")),
    "temperature": lambda b: 0.5 if b.get("temperature") != 0.5 else 0.25,
    "top_p": lambda b: 0.5,
    "max_output_tokens": lambda b: b.get("max_output_tokens", 7) + 1,
    "tools": lambda b: [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    "tool_choice": lambda b: "required",
    "text": lambda b: {"format": {"type": "json_object"}},
    "reasoning": lambda b: {"effort": "high"},
}  # fmt: skip
MESSAGES_DELIVERY = {"metadata": {"user_id": "u-1"}, "stream": True, "service_tier": "auto"}
RESPONSES_DELIVERY = {"stream": True, "store": False, "metadata": {"a": "b"}, "user": "u-1",
                      "prompt_cache_key": "mine", "service_tier": "auto"}  # fmt: skip
SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(messages_body(), st.sampled_from(sorted(MESSAGES_CHANGES)))
def test_messages_key_discipline(body: dict[str, Any], field: str) -> None:
    same = orjson.loads(orjson.dumps(body))  # byte-identical, a different object
    assert key(body, Endpoint.MESSAGES) == key(same, Endpoint.MESSAGES)
    changed = {**same, field: MESSAGES_CHANGES[field](same)}
    assert key(changed, Endpoint.MESSAGES) != key(body, Endpoint.MESSAGES), field
    delivered = {**same, **MESSAGES_DELIVERY}
    assert key(delivered, Endpoint.MESSAGES) == key(body, Endpoint.MESSAGES)
    marked = copy.deepcopy(same)  # a breakpoint is delivery too: where the provider caches
    marked["messages"][-1]["content"] = [{"type": "text", "text": same["messages"][-1]["content"],
                                          "cache_control": {"type": "ephemeral"}}]  # fmt: skip
    plain = copy.deepcopy(same)
    plain["messages"][-1]["content"] = [{"type": "text", "text": same["messages"][-1]["content"]}]
    assert key(marked, Endpoint.MESSAGES) == key(plain, Endpoint.MESSAGES)
    assert key(body, Endpoint.MESSAGES, beta="b1") != key(body, Endpoint.MESSAGES)
    assert key(body, Endpoint.MESSAGES, tenant="u") != key(body, Endpoint.MESSAGES)


@SETTINGS
@given(responses_body(), st.sampled_from(sorted(RESPONSES_CHANGES)))
def test_responses_key_discipline(body: dict[str, Any], field: str) -> None:
    same = orjson.loads(orjson.dumps(body))
    assert key(body, Endpoint.RESPONSES) == key(same, Endpoint.RESPONSES)
    changed = {**same, field: RESPONSES_CHANGES[field](same)}
    assert key(changed, Endpoint.RESPONSES) != key(body, Endpoint.RESPONSES), field
    delivered = {**same, **RESPONSES_DELIVERY}
    assert key(delivered, Endpoint.RESPONSES) == key(body, Endpoint.RESPONSES)
    assert key(body, Endpoint.RESPONSES, tenant="u") != key(body, Endpoint.RESPONSES)
    # the same words as a chat request are another endpoint's entry
    chat = {"model": body["model"], "messages": [{"role": "user", "content": "x"}]}
    as_responses = {"model": body["model"], "input": [{"role": "user", "content": "x"}]}
    assert key(chat, Endpoint.CHAT) != key(as_responses, Endpoint.RESPONSES)


def test_tenants_never_share_entries_on_either_endpoint(
    make_gateway: MakeGateway, fake: tuple[Any, str]
) -> None:
    upstream, url = fake
    running = make_gateway(
        api_keys={"sk-a": "tenant-a", "sk-b": "tenant-b"},
        upstreams=(UpstreamSpec(f"{url}/v1", kind="vllm"),),
    )
    layers = []
    for key_ in ("sk-a", "sk-b", "sk-a", "sk-b"):
        with anthropic.Anthropic(base_url=running.url, api_key=key_, max_retries=0) as claude:
            raw = claude.messages.with_raw_response.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "My balance?"}],
                extra_body={"temperature": 0},
            )  # fmt: skip
            layers.append(raw.headers["x-infercache"])
        with openai.OpenAI(base_url=f"{running.url}/v1", api_key=key_, max_retries=0) as gpt:
            raw = gpt.responses.with_raw_response.create(
                model="m", input="My balance?", temperature=0
            )
            layers.append(raw.headers["x-infercache"])
    assert layers == ["miss"] * 4 + ["exact-hit"] * 4  # each tenant its own entry, on both
    assert upstream.calls == 4
