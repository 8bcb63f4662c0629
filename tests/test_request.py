"""Directive parsing and request validation: clear errors that name the bad value."""

from __future__ import annotations

from typing import Any

import pytest

from infercache.errors import InvalidRequestError
from infercache.request import parse_request
from tests.harness.vocabulary import chat


def test_directives_are_parsed_and_stripped_from_the_upstream_body() -> None:
    body = chat(
        infercache={
            "tenant": "acme",
            "tags": ["b", "a", "a"],
            "context": {"docs": ["d1@3"]},
            "ttl_s": 60,
            "cache_control": ["no-store"],
        }
    )
    req = parse_request(body)
    assert "infercache" not in req.body
    assert "infercache" in body  # the caller's dict is untouched
    d = req.directives
    assert (d.tenant, d.tags, d.ttl_s) == ("acme", ("a", "b"), 60.0)
    assert d.context_fingerprint is not None
    assert len(d.context_fingerprint) == 64
    assert d.cache_control.no_store
    assert not d.cache_control.no_cache


def test_an_authenticated_tenant_overrides_the_body_claim() -> None:
    req = parse_request(chat(infercache={"tenant": "victim"}), tenant="attacker")
    assert req.directives.tenant == "attacker"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": ["hi"]}, "messages[0]"),
        (chat(temperature="hot"), "temperature"),
        (chat(max_tokens=0), "max_tokens"),
        (chat(stream="yes"), "stream"),
        (chat(stop=[1, 2]), "stop"),
        (chat(infercache="x"), "infercache"),
        (chat(infercache={"ttl_s": -1}), "infercache.ttl_s"),
        (chat(infercache={"ttl_s": True}), "infercache.ttl_s"),
        (chat(infercache={"tags": "kb"}), "infercache.tags"),
        (chat(infercache={"cache_control": "no-cache,bogus"}), "infercache.cache_control"),
        (chat(infercache={"cache_control": [["no-cache"]]}), "infercache.cache_control"),
        (chat(infercache={"cache_control": [{}]}), "infercache.cache_control"),
        (chat(infercache={"tenat": "typo"}), "infercache"),
    ],
)
def test_bad_requests_raise_invalid_request_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_request(body)
    assert info.value.param == param
    assert info.value.to_openai()["error"]["param"] == param


def test_a_non_object_body_is_rejected() -> None:
    with pytest.raises(InvalidRequestError):
        parse_request(["not", "an", "object"])
