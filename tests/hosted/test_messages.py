"""`/v1/messages` through the gateway, driven by the official `anthropic` SDK: in front of the
Anthropic stand-in (kind `anthropic`, natively) and of an OpenAI-compatible upstream (translated
to chat). A repeated request is an exact hit, a stream replays as Anthropic's events and parses
in the SDK to the same message, and every error is in Anthropic's shape."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import anthropic
import httpx
import pytest

from infercache.gateway.config import UpstreamSpec
from tests.gateway.conftest import MakeGateway
from tests.hosted.conftest import PROVIDER_KEY, Hosted, MakeHosted
from tests.hosted.providers import AnthropicStandIn

MODEL = "claude-sonnet-4-5"
ASK: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": 64,
    # anthropic 2.17's create() has no `temperature`; the API takes it, and only 0 is cached
    # by default (a sampled answer is not replayed)
    "extra_body": {"temperature": 0},
    "system": "You answer support questions in one sentence.",
    "messages": [{"role": "user", "content": "How do I reset my password?"}],
}


@pytest.fixture
def sdk(closing: ExitStack) -> Callable[..., anthropic.Anthropic]:
    """Anthropic clients for a gateway URL, each closed after the test."""

    def make(url: str, key: str = "sk-app") -> anthropic.Anthropic:
        return closing.enter_context(anthropic.Anthropic(base_url=url, api_key=key, max_retries=0))

    return make


@pytest.fixture
def native(
    make_hosted: MakeHosted, anthropic_standin: tuple[AnthropicStandIn, str]
) -> tuple[AnthropicStandIn, Hosted]:
    """The Anthropic stand-in, and a gateway in front of it (kind `anthropic`), the app's key."""
    standin, url = anthropic_standin
    return standin, make_hosted(url, "anthropic", api_keys={"sk-app": "app"})


def without_usage(message: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = message.model_dump()
    dumped.pop("usage")
    return dumped


def layer(raw: Any) -> str:
    value: str = raw.headers["x-infercache"]
    return value


def test_messages_twice_is_a_miss_then_an_exact_hit_and_streams_replay(
    sdk: Callable[..., anthropic.Anthropic], native: tuple[AnthropicStandIn, Hosted]
) -> None:
    standin, gateway = native
    client = sdk(gateway.url)
    first = client.messages.with_raw_response.create(**ASK)
    second = client.messages.with_raw_response.create(**ASK)
    assert (layer(first), layer(second)) == ("miss", "exact-hit")
    assert second.parse().content == first.parse().content
    assert second.parse().id == first.parse().id
    assert len(standin.requests) == 1
    # the provider's key as x-api-key with a version; the gateway key never sent on
    sent = standin.headers[0]
    assert sent["x-api-key"] == PROVIDER_KEY
    assert sent["anthropic-version"]
    assert "sk-app" not in str(standin.headers)

    ask = {**ASK, "messages": [{"role": "user", "content": "Where is my order?"}]}
    finals = []
    for _ in range(2):
        with client.messages.stream(**ask) as stream:
            finals.append((stream.response.headers["x-infercache"], stream.get_final_message()))
    (miss, fresh), (hit, replayed) = finals
    assert (miss, hit) == ("miss", "exact-hit")
    # the SDK's accumulator reads the same message; a hit's usage is zero (hit_usage's default)
    assert without_usage(replayed) == without_usage(fresh)
    assert fresh.usage.output_tokens == 5
    assert replayed.usage.input_tokens == replayed.usage.output_tokens == 0
    assert replayed.content[0].text.startswith("answer #2 to Where is my order?")  # type: ignore[union-attr]
    assert len(standin.requests) == 2
    # the non-streamed answer, asked as a stream, replays to the message first returned
    with client.messages.stream(**ASK) as stream:
        assert stream.response.headers["x-infercache"] == "exact-hit"
        assert without_usage(stream.get_final_message()) == without_usage(first.parse())
    assert len(standin.requests) == 2


def test_the_client_beta_header_is_forwarded_and_keyed(
    sdk: Callable[..., anthropic.Anthropic], native: tuple[AnthropicStandIn, Hosted]
) -> None:
    standin, gateway = native
    client = sdk(gateway.url)
    beta = {"anthropic-beta": "prompt-caching-2024-07-31"}
    plain = client.messages.with_raw_response.create(**ASK)
    flagged = client.messages.with_raw_response.create(**ASK, extra_headers=beta)
    assert (layer(plain), layer(flagged)) == ("miss", "miss")  # a beta can change the answer
    assert standin.headers[1]["anthropic-beta"] == beta["anthropic-beta"]
    assert "anthropic-beta" not in standin.headers[0]


def test_errors_are_in_anthropic_shape(
    sdk: Callable[..., anthropic.Anthropic], native: tuple[AnthropicStandIn, Hosted]
) -> None:
    standin, gateway = native
    with pytest.raises(anthropic.BadRequestError) as bad:
        sdk(gateway.url).messages.create(model=MODEL, max_tokens=10, messages=[])
    assert bad.value.body["type"] == "error"  # type: ignore[index]
    assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(anthropic.AuthenticationError) as denied:
        sdk(gateway.url, key="sk-wrong").messages.create(**ASK)
    assert denied.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with httpx.Client(base_url=gateway.url) as http:
        broken = http.post("/v1/messages", content=b"{not json", headers={"x-api-key": "sk-app"})
    assert broken.status_code == 400
    assert broken.json()["type"] == "error"
    assert "Traceback" not in broken.text
    assert standin.requests == []


def test_a_cut_off_answer_is_not_stored(
    sdk: Callable[..., anthropic.Anthropic], native: tuple[AnthropicStandIn, Hosted]
) -> None:
    """`max_tokens` reached (stop_reason max_tokens) is a cut-off: served, never stored."""
    standin, gateway = native
    client = sdk(gateway.url)
    standin.stop_reason = "max_tokens"
    layers = [layer(client.messages.with_raw_response.create(**ASK)) for _ in range(2)]
    assert layers == ["miss", "miss"]
    assert len(standin.requests) == 2


def test_messages_are_translated_for_an_openai_compatible_upstream(
    sdk: Callable[..., anthropic.Anthropic], make_gateway: MakeGateway, fake: tuple[Any, str]
) -> None:
    """The built-in engine's path, on the fast stand-in: Messages → chat → a message."""
    upstream, upstream_url = fake
    running = make_gateway(upstreams=(UpstreamSpec(f"{upstream_url}/v1", kind="vllm"),))
    client = sdk(running.url)
    first = client.messages.with_raw_response.create(**ASK)
    second = client.messages.with_raw_response.create(**ASK)
    assert (layer(first), layer(second)) == ("miss", "exact-hit")
    message = second.parse()
    assert message.content[0].text == "answer #1 to How do I reset my password?"  # type: ignore[union-attr]
    assert first.parse().usage.input_tokens > 0  # the miss's usage, in Anthropic's shape
    sent = upstream.bodies[0]
    assert sent["messages"][0] == {"role": "system", "content": ASK["system"]}
    ask = {**ASK, "messages": [{"role": "user", "content": "And my invoice?"}]}
    finals = []
    for _ in range(2):
        with client.messages.stream(**ask) as stream:
            finals.append((stream.response.headers["x-infercache"], stream.get_final_message()))
    assert [f[0] for f in finals] == ["miss", "exact-hit"]
    assert without_usage(finals[0][1]) == without_usage(finals[1][1])
    assert upstream.calls == 2
    # chat's entries are not Messages' (a distinct endpoint): the chat form of it is a miss
    with running.client() as http:
        chat = http.post("/v1/chat/completions", json={**sent, "temperature": 0})
    assert chat.headers["x-infercache"] == "miss"
