"""A whole OpenAI app behind the gateway (the official client): chat and Responses are cached,
every other /v1 endpoint reaches the upstream as is — with the upstream's credentials, never a
gateway key — and model lookups work."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from infercache.gateway.config import UpstreamSpec
from tests.gateway.conftest import MakeGateway


@pytest.fixture
def running(make_gateway: MakeGateway, fake: tuple[Any, str]) -> Any:
    _, url = fake
    return make_gateway(
        api_keys={"sk-app": "app"},
        upstreams=(UpstreamSpec(f"{url}/v1", key_env="PROVIDER_KEY"),),
        environ={"PROVIDER_KEY": "sk-provider"},
    )


@pytest.fixture
def app(running: Any) -> Iterator[openai.OpenAI]:
    """The app's client, closed after the test (left to the garbage collector, its sockets
    are an unraisable ResourceWarning in whichever test the collector runs)."""
    with openai.OpenAI(base_url=f"{running.url}/v1", api_key="sk-app", max_retries=0) as app:
        yield app


def test_files_and_responses_reach_the_upstream_with_its_own_key(
    running: Any, app: openai.OpenAI
) -> None:
    files = app.files.list()
    assert [f.id for f in files.data] == ["file-1"]
    response = app.responses.create(model="test-model", input="hello")
    assert response.id == "resp-1"
    seen = running.fake.other_requests
    assert [(r["method"], r["path"]) for r in seen] == [
        ("GET", "/v1/files"),
        ("POST", "/v1/responses"),
    ]
    assert {r["headers"].get("authorization") for r in seen} == {"Bearer sk-provider"}
    assert b'"input":"hello"' in seen[1]["body"].replace(b" ", b"")
    # Responses is a cached endpoint now (sent natively to this openai-kind upstream): only
    # the files call was passed through
    assert running.built.cache.stats()["strategies"]["passthrough"]["counters"] == {"files": 1}


def test_pass_through_needs_a_gateway_key_and_keeps_status_headers_and_query(
    running: Any,
) -> None:
    with httpx.Client(base_url=running.url) as http:
        assert http.get("/v1/files").status_code == 401
        headers = {"authorization": "Bearer sk-app", "openai-beta": "a", "x-mine": "b"}
        answer = http.delete("/v1/things/42?verbose=1", headers=headers)
    assert answer.status_code == 200
    assert answer.headers["x-upstream"] == "stand-in"
    assert answer.headers["x-infercache"] == "passthrough"  # every pass-through says so
    last = running.fake.other_requests[-1]
    assert (last["method"], last["path"], last["query"]) == ("DELETE", "/v1/things/42", "verbose=1")
    assert last["headers"]["openai-beta"] == "a"
    assert "x-mine" not in last["headers"]  # an allowlist: forwarding.py


def test_models_retrieve_works_and_an_unknown_model_is_404(
    running: Any, app: openai.OpenAI
) -> None:
    assert app.models.retrieve("test-model").id == "test-model"
    with pytest.raises(openai.NotFoundError):
        app.models.retrieve("no-such-model")


def test_embeddings_are_cached_per_input(running: Any, app: openai.OpenAI) -> None:
    first = app.embeddings.create(model="embed-model", input=["alpha", "beta", "gamma"])
    second = app.embeddings.create(
        model="embed-model", input=["beta", "a new one", "alpha", "gamma"]
    )
    assert running.fake.embedded == ["alpha", "beta", "gamma", "a new one"]  # only 1 new
    by_text = dict(zip(["alpha", "beta", "gamma"], (d.embedding for d in first.data), strict=True))
    assert [d.embedding for d in second.data] == [
        by_text["beta"],
        [9, 1, 0],  # the stand-in's vector for "a new one", fetched alone
        by_text["alpha"],
        by_text["gamma"],
    ]
    assert [d.index for d in second.data] == [0, 1, 2, 3]
    raw = app.embeddings.with_raw_response.create(model="embed-model", input="alpha")
    assert raw.headers["x-infercache"] == "exact-hit"
    assert raw.parse().data[0].embedding == by_text["alpha"]
    assert second.usage.prompt_tokens >= 1


def test_legacy_completions_are_cached_and_replayed_as_streams(
    running: Any, app: openai.OpenAI
) -> None:
    first = app.completions.with_raw_response.create(
        model="test-model", prompt="Once upon a time", temperature=0, max_tokens=8
    )
    second = app.completions.with_raw_response.create(
        model="test-model", prompt="Once upon a time", temperature=0, max_tokens=8
    )
    assert (first.headers["x-infercache"], second.headers["x-infercache"]) == ("miss", "exact-hit")
    assert second.parse().choices[0].text == first.parse().choices[0].text
    streamed = app.completions.create(
        model="test-model", prompt="Once upon a time", temperature=0, max_tokens=8, stream=True
    )
    assert (
        "".join(c.choices[0].text for c in streamed if c.choices) == first.parse().choices[0].text
    )
    fresh = list(
        app.completions.create(
            model="test-model", prompt="A new story", temperature=0, max_tokens=8, stream=True
        )
    )
    again = app.completions.with_raw_response.create(
        model="test-model", prompt="A new story", temperature=0, max_tokens=8
    )
    assert again.headers["x-infercache"] == "exact-hit"  # the fresh stream was stored whole
    assert again.parse().choices[0].text == "".join(c.choices[0].text for c in fresh if c.choices)
    assert running.fake.calls == 2


def test_a_chat_and_a_completion_with_the_same_text_never_share_an_entry(
    running: Any, app: openai.OpenAI
) -> None:
    app.completions.create(model="test-model", prompt="hello", temperature=0)
    chat = app.chat.completions.with_raw_response.create(
        model="test-model", messages=[{"role": "user", "content": "hello"}], temperature=0
    )
    assert chat.headers["x-infercache"] == "miss"
