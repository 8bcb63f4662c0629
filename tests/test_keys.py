"""The exact key covers everything that determines the answer, and nothing that does not."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from infercache.keys import exact_key
from infercache.request import parse_request
from tests.harness.vocabulary import chat


def key(body: dict[str, Any], tenant: str | None = None) -> str:
    return exact_key(parse_request(body, tenant=tenant))


def test_identical_requests_share_a_key() -> None:
    assert key(chat()) == key(chat())


ALLOWLIST_CHANGES: list[tuple[str, object]] = [
    ("model", "other-model"),
    ("temperature", 0.7),
    ("top_p", 0.5),
    ("max_tokens", 17),
    ("max_completion_tokens", 17),
    ("stop", ["\n"]),
    ("seed", 42),
    ("n", 2),
    ("presence_penalty", 0.5),
    ("frequency_penalty", 0.5),
    ("logit_bias", {"123": 5}),
    ("logprobs", True),
    ("top_logprobs", 3),
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("tool_choice", "required"),
    ("response_format", {"type": "json_object"}),
    ("some_future_param", "on"),  # unknown fields are part of the key
]


@pytest.mark.parametrize(("field", "value"), ALLOWLIST_CHANGES)
def test_changing_an_output_affecting_field_changes_the_key(field: str, value: object) -> None:
    assert key(chat(**{field: value})) != key(chat())


def test_system_prompt_and_history_are_part_of_the_key() -> None:
    base = chat()
    other_system = copy.deepcopy(base)
    other_system["messages"][0]["content"] = "You are verbose."
    longer_history = copy.deepcopy(base)
    longer_history["messages"][1:1] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    keys = {key(base), key(other_system), key(longer_history)}
    assert len(keys) == 3


def test_tenant_context_and_tags_are_part_of_the_key() -> None:
    base = key(chat())
    assert key(chat(), tenant="acme") != base
    assert key(chat(infercache={"tenant": "acme"})) != base
    assert key(chat(infercache={"context": ["doc-1@v3"]})) != key(
        chat(infercache={"context": ["doc-1@v4"]})
    )
    assert key(chat(infercache={"tags": ["kb"]})) != base


def test_delivery_and_bookkeeping_fields_do_not_change_the_key() -> None:
    base = key(chat())
    assert key(chat(stream=True, stream_options={"include_usage": True})) == base
    assert key(chat(user="u-123", metadata={"trace": "x"}, store=False)) == base
    assert key(chat(infercache={"ttl_s": 5, "cache_control": "no-store"})) == base


def test_defaults_and_number_forms_are_normalised() -> None:
    base = key(chat())
    assert key(chat(temperature=0.0)) == base
    assert key(chat(n=1, top_p=1.0, presence_penalty=0, logprobs=False, stop=None)) == base
    assert key(chat(stop="\n")) == key(chat(stop=["\n"]))
    # temperature is never defaulted: absent means 1 for the API, not 0
    no_temperature = chat()
    del no_temperature["temperature"]
    assert key(no_temperature) != base


def test_key_is_versioned_sha256_and_input_is_not_mutated() -> None:
    body = chat(infercache={"tenant": "t", "tags": ["b", "a"]})
    before = copy.deepcopy(body)
    k = key(body)
    assert body == before
    assert k.startswith("ic1:")
    assert len(k) == len("ic1:") + 64


def test_tag_order_does_not_matter() -> None:
    assert key(chat(infercache={"tags": ["a", "b"]})) == key(chat(infercache={"tags": ["b", "a"]}))
