"""`infercache.wrap` puts the official `openai` client (sync and async) behind the cache.

The provider is a stand-in (a paid API cannot run here): an httpx transport that answers like
the chat-completions endpoint and counts calls. The end-to-end tests against a real server on
loopback live with the engine and the gateway."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.openai_client import wrap
from infercache.settings import Settings
from tests.conftest import CountingUpstream


class FakeProvider:
    def __init__(self, clock: ManualClock) -> None:
        self.answer = CountingUpstream(clock)
        self.bodies: list[dict[str, Any]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        if request.url.path != "/v1/chat/completions":
            return httpx.Response(404, json={"error": {"message": "no such route"}})
        return httpx.Response(200, json=self.answer(body))

    async def ahandle(self, request: httpx.Request) -> httpx.Response:
        return self.handle(request)


def provider_client(handler: Any) -> openai.OpenAI:
    """The official client, talking to the stand-in provider through `handler`."""
    return openai.OpenAI(
        api_key="sk-test",
        base_url="http://provider.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )


def make_cache(tmp_path: Path, clock: ManualClock) -> Cache:
    return Cache(Settings(data_dir=tmp_path, store_url="memory://"), clock=clock)


MESSAGES = [{"role": "user", "content": "Say hi"}]


def test_sync_client_repeats_are_served_from_the_cache(tmp_path: Path, clock: ManualClock) -> None:
    provider = FakeProvider(clock)
    client = provider_client(provider.handle)
    cached = wrap(client, make_cache(tmp_path, clock))
    first = cached.chat.completions.create(model="m", messages=MESSAGES, temperature=0)
    second = cached.chat.completions.create(model="m", messages=MESSAGES, temperature=0)
    assert isinstance(second, openai.types.chat.ChatCompletion)
    assert second.choices[0].message.content == first.choices[0].message.content
    assert (first.infercache["layer"], second.infercache["layer"]) == ("miss", "exact")
    assert len(provider.bodies) == 1
    client.close()


def test_directives_are_stripped_and_unknown_fields_still_reach_the_provider(
    tmp_path: Path, clock: ManualClock
) -> None:
    provider = FakeProvider(clock)
    client = provider_client(provider.handle)
    cached = wrap(client, make_cache(tmp_path, clock))
    cached.chat.completions.create(
        model="m",
        messages=MESSAGES,
        temperature=0,
        infercache={"tenant": "acme", "tags": ["kb"]},
        extra_body={"top_k": 5},
    )
    sent = provider.bodies[0]
    assert "infercache" not in sent
    assert sent["top_k"] == 5
    assert sent["temperature"] == 0
    other_tenant = cached.chat.completions.create(
        model="m", messages=MESSAGES, temperature=0, extra_body={"top_k": 5}
    )
    assert other_tenant.infercache["layer"] == "miss"
    client.close()


def test_streaming_goes_straight_to_the_client_and_counts_as_bypassed(
    tmp_path: Path, clock: ManualClock
) -> None:
    def sse(request: httpx.Request) -> httpx.Response:
        chunk = {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
        }
        text = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    client = provider_client(sse)
    cache = make_cache(tmp_path, clock)
    stream = wrap(client, cache).chat.completions.create(
        model="m", messages=MESSAGES, temperature=0, stream=True
    )
    assert [c.choices[0].delta.content for c in stream] == ["hi"]
    assert cache.stats()["strategies"]["exact"]["misses"] == {"bypassed": 1}
    client.close()


@pytest.mark.anyio
async def test_async_client_repeats_are_served_from_the_cache(
    tmp_path: Path, clock: ManualClock
) -> None:
    provider = FakeProvider(clock)
    client = openai.AsyncOpenAI(
        api_key="sk-test",
        base_url="http://provider.test/v1",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(provider.ahandle)),
    )
    cached = wrap(client, make_cache(tmp_path, clock))
    first = await cached.chat.completions.create(model="m", messages=MESSAGES, temperature=0)
    second = await cached.chat.completions.create(model="m", messages=MESSAGES, temperature=0)
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.infercache["layer"] == "exact"
    assert len(provider.bodies) == 1
    assert cached.models is client.models  # everything else is the client's own
    await client.close()
