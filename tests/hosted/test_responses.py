"""`/v1/responses` through the gateway, driven by the official `openai` SDK against the OpenAI
stand-in (served natively): a repeated request is an exact hit; a follow-up naming a response
this gateway served is keyed on its content (asked twice: one upstream call); one it did not
serve is passed through, uncached, and says so; a stream replays as Responses events the SDK
reads to the same response; tenants never reach each other's conversations."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import openai
import pytest

from infercache.gateway.config import UpstreamSpec
from tests.gateway.conftest import MakeGateway
from tests.hosted.conftest import Hosted, MakeHosted
from tests.hosted.providers import OpenAIStandIn

MODEL = "gpt-4.1-mini"
KEYS = {"sk-a": "tenant-a", "sk-b": "tenant-b"}


@pytest.fixture
def sdk(closing: ExitStack) -> Callable[..., openai.OpenAI]:
    """OpenAI clients for a gateway URL, each closed after the test."""

    def make(url: str, key: str = "sk-a") -> openai.OpenAI:
        return closing.enter_context(
            openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        )

    return make


@pytest.fixture
def native(
    make_hosted: MakeHosted, openai_standin: tuple[OpenAIStandIn, str]
) -> tuple[OpenAIStandIn, Hosted]:
    """The OpenAI stand-in, and a gateway in front of it (kind `openai`) with both tenants' keys."""
    standin, url = openai_standin
    return standin, make_hosted(url, "openai", api_keys=KEYS)


def ask(client: openai.OpenAI, **fields: Any) -> tuple[str, Any]:
    """(x-infercache, the response) of one responses.create."""
    raw = client.responses.with_raw_response.create(model=MODEL, temperature=0, **fields)
    return raw.headers["x-infercache"], raw.parse()


def test_responses_twice_then_a_follow_up_twice(
    sdk: Callable[..., openai.OpenAI], native: tuple[OpenAIStandIn, Hosted]
) -> None:
    standin, gateway = native
    client = sdk(gateway.url)
    first = ask(client, input="What is the capital of France?", instructions="Be brief.")
    second = ask(client, input="What is the capital of France?", instructions="Be brief.")
    assert (first[0], second[0]) == ("miss", "exact-hit")
    assert second[1].output_text == first[1].output_text
    assert second[1].id == first[1].id
    assert [path for path, _ in standin.requests] == ["/v1/responses"]

    follow = [ask(client, input="And of Spain?", previous_response_id=first[1].id)]
    follow.append(ask(client, input="And of Spain?", previous_response_id=first[1].id))
    assert [layer for layer, _ in follow] == ["miss", "exact-hit"]
    assert follow[1][1].output_text == follow[0][1].output_text
    assert len(standin.requests) == 2  # asked twice: one upstream call
    sent = standin.requests[1][1]
    assert "previous_response_id" not in sent  # sent on its content
    texts = [part["text"] for item in sent["input"] for part in _parts(item)]
    assert texts == ["What is the capital of France?", first[1].output_text, "And of Spain?"]
    # the same follow-up written out whole is the same request: the same entry
    whole = ask(client, input=sent["input"], instructions="Be brief.")
    assert whole[0] == "miss"  # the follow-up carried no instructions: another request
    assert ask(client, input=sent["input"])[0] == "exact-hit"


def _parts(item: dict[str, Any]) -> list[dict[str, Any]]:
    content = item["content"]
    return [{"text": content}] if isinstance(content, str) else list(content)


def test_a_follow_up_the_gateway_did_not_serve_is_passed_through(
    sdk: Callable[..., openai.OpenAI], native: tuple[OpenAIStandIn, Hosted]
) -> None:
    standin, gateway = native
    a, b = sdk(gateway.url, "sk-a"), sdk(gateway.url, "sk-b")
    _, served = ask(a, input="Tell me a secret of tenant a.")
    # another tenant naming tenant a's response: not resolved for it, passed through as it came
    layers = [ask(b, input="Repeat what you said.", previous_response_id=served.id)[0]]
    layers.append(ask(b, input="Repeat what you said.", previous_response_id=served.id)[0])
    assert layers == ["passthrough", "passthrough"]
    assert [body.get("previous_response_id") for _, body in standin.requests] == [
        None, served.id, served.id,
    ]  # fmt: skip
    # one the provider never heard of: its 404, passed through, in the OpenAI shape
    with pytest.raises(openai.NotFoundError) as missing:
        ask(a, input="hi", previous_response_id="resp_unknown")
    assert missing.value.response.headers["x-infercache"] == "passthrough"
    counters = gateway.stats()["strategies"]["passthrough"]["counters"]
    assert counters == {"responses": 3}


def test_a_streamed_response_replays_as_events_the_sdk_reads(
    sdk: Callable[..., openai.OpenAI], native: tuple[OpenAIStandIn, Hosted]
) -> None:
    standin, gateway = native
    client = sdk(gateway.url)
    finals = []
    for _ in range(2):
        with client.responses.stream(model=MODEL, input="Name a colour.", temperature=0) as s:
            finals.append(s.get_final_response())
    assert len(standin.requests) == 1
    fresh, replayed = (f.model_dump() for f in finals)
    fresh.pop("usage"), replayed.pop("usage")  # a hit's usage is zero (hit_usage)
    assert replayed == fresh
    assert finals[1].output_text.startswith("answer #1 to Name a colour.")
    # the streamed answer, asked whole, is the same entry
    assert ask(client, input="Name a colour.")[0] == "exact-hit"


def test_responses_are_translated_for_a_chat_upstream(
    sdk: Callable[..., openai.OpenAI], make_gateway: MakeGateway, fake: tuple[Any, str]
) -> None:
    """The built-in engine's path, on the fast stand-in: Responses → chat → a response."""
    upstream, upstream_url = fake
    running = make_gateway(upstreams=(UpstreamSpec(f"{upstream_url}/v1", kind="vllm"),))
    client = sdk(running.url)
    first = ask(client, input="Capital of Italy?")
    second = ask(client, input="Capital of Italy?")
    assert (first[0], second[0]) == ("miss", "exact-hit")
    assert second[1].output_text == "answer #1 to Capital of Italy?"
    follow = [ask(client, input="And Peru?", previous_response_id=first[1].id)[0]]
    follow.append(ask(client, input="And Peru?", previous_response_id=first[1].id)[0])
    assert follow == ["miss", "exact-hit"]
    assert upstream.calls == 2
    assert [m["role"] for m in upstream.bodies[1]["messages"]] == ["user", "assistant", "user"]
    finals = []
    for _ in range(2):
        with client.responses.stream(model=MODEL, input="Capital of Chile?", temperature=0) as s:
            finals.append(s.get_final_response())
    assert finals[0].output_text == finals[1].output_text
    assert upstream.calls == 3
