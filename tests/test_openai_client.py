"""`wrap(client, cache)`: the official `openai` client (sync and async, httpx2 and legacy httpx)
in front of a real HTTP stand-in provider on loopback, its chat completions and embeddings
cached, everything else passed through untouched."""

from __future__ import annotations

import base64
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from infercache import Cache, Settings, wrap
from infercache.clock import ManualClock
from tests.harness.flight_watch import FlightWatch
from tests.harness.servers import serve
from tests.integrations.openai_standin import StandIn, vector

MESSAGES = [{"role": "user", "content": "Say hi"}]
CHAT = "/v1/chat/completions"
EMBED = "/v1/embeddings"


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[StandIn, str]]:
    standin = StandIn()
    with serve(standin.app) as url:
        yield standin, url


@pytest.fixture
def standin(served: tuple[StandIn, str]) -> StandIn:
    served[0].reset()
    return served[0]


@pytest.fixture
def base_url(served: tuple[StandIn, str]) -> str:
    return f"{served[1]}/v1"


@pytest.fixture
def cache(tmp_path: Path, clock: ManualClock) -> Iterator[Cache]:
    cache = Cache(Settings(data_dir=tmp_path, store_url="memory://"), clock=clock)
    yield cache
    cache.close()


@pytest.fixture
def client(base_url: str, cache: Cache) -> Iterator[openai.OpenAI]:
    wrapped = wrap(openai.OpenAI(api_key="sk-test", base_url=base_url, max_retries=0), cache)
    yield wrapped
    wrapped.close()


def create(client: openai.OpenAI, **fields: Any) -> Any:
    fields = {"model": "m", "messages": MESSAGES, "temperature": 0, **fields}
    return client.chat.completions.with_raw_response.create(**fields)


# -- chat completions --


def test_the_wrapped_client_is_the_sdks_own_client(client: openai.OpenAI) -> None:
    assert isinstance(client, openai.OpenAI)
    assert client.api_key == "sk-test"


def test_a_repeat_is_served_from_the_cache_and_the_headers_say_which_layer(
    client: openai.OpenAI, standin: StandIn
) -> None:
    first, second = create(client), create(client)
    assert (first.headers["x-infercache"], second.headers["x-infercache"]) == ("miss", "exact-hit")
    assert first.headers["x-request-id"] == "req-1"  # a miss is the upstream's own response
    assert second.headers["age"] == "0"
    assert isinstance(second.parse(), ChatCompletion)
    assert second.parse().choices[0].message.content == "answer #1 to Say hi"
    plain = client.chat.completions.create(model="m", messages=MESSAGES, temperature=0)
    assert plain.choices[0].message.content == "answer #1 to Say hi"
    assert len(standin.bodies(CHAT)) == 1


def test_directives_are_stripped_scope_the_key_and_unknown_fields_reach_the_provider(
    client: openai.OpenAI, standin: StandIn
) -> None:
    scoped = {"infercache": {"tenant": "acme", "tags": ["kb"]}, "top_k": 5}
    assert create(client, extra_body=scoped).headers["x-infercache"] == "miss"
    sent = standin.bodies(CHAT)[0]
    assert "infercache" not in sent
    assert sent["top_k"] == 5
    other_tenant = create(client, extra_body={"top_k": 5})
    assert other_tenant.headers["x-infercache"] == "miss"
    assert create(client, extra_body=scoped).headers["x-infercache"] == "exact-hit"


def test_header_controls_work_and_never_reach_the_provider(
    client: openai.OpenAI, standin: StandIn
) -> None:
    create(client)
    refreshed = create(client, extra_headers={"Cache-Control": "no-cache"})
    assert refreshed.headers["x-infercache"] == "bypass"
    create(client, extra_headers={"x-infercache-tags": "kb:pricing"})
    assert all(not k.startswith("x-infercache") for r in standin.received for k in r.headers)


def test_invalidating_a_tag_string_refetches_only_its_entries(
    client: openai.OpenAI, cache: Cache, standin: StandIn
) -> None:
    tagged = {"infercache": {"tags": ["kb:pricing"]}}
    create(client, extra_body=tagged)
    create(client)
    cache.invalidate(["kb:pricing"])
    assert create(client, extra_body=tagged).headers["x-infercache"] == "miss"
    assert create(client).headers["x-infercache"] == "exact-hit"


def test_an_upstream_error_raises_the_sdks_error_and_nothing_is_stored(
    client: openai.OpenAI, standin: StandIn
) -> None:
    standin.fail_status = 400
    with pytest.raises(openai.BadRequestError, match="stand-in refuses"):
        create(client)
    standin.fail_status = None
    assert create(client).headers["x-infercache"] == "miss"


def test_a_bad_directive_is_a_400_that_never_reaches_the_provider(
    client: openai.OpenAI, standin: StandIn
) -> None:
    with pytest.raises(openai.BadRequestError, match=r"infercache\.ttl_s"):
        create(client, extra_body={"infercache": {"ttl_s": -1}})
    assert standin.received == []


def test_only_if_cached_without_an_entry_is_a_504_not_retried(
    base_url: str, cache: Cache, standin: StandIn
) -> None:
    client = wrap(openai.OpenAI(api_key="k", base_url=base_url, max_retries=2), cache)
    with pytest.raises(openai.APIStatusError) as raised:
        create(client, extra_headers={"Cache-Control": "only-if-cached"})
    assert raised.value.status_code == 504
    assert standin.received == []
    client.close()


# -- streams --


def stream_text(stream: Any) -> str:
    chunks = list(stream)
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def test_a_fresh_stream_is_passed_through_stored_and_then_replayed_as_chunks(
    client: openai.OpenAI, standin: StandIn
) -> None:
    raw = create(client, stream=True)
    assert raw.headers["x-infercache"] == "miss"
    assert stream_text(raw.parse()) == "answer #1 to Say hi"
    plain = create(client)
    assert plain.headers["x-infercache"] == "exact-hit"
    assert plain.parse().choices[0].message.content == "answer #1 to Say hi"
    replay = client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(replay)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "answer #1 to Say hi"
    )
    assert standin.chat_calls == 1


def test_a_cut_off_stream_reaches_the_caller_but_is_never_stored(
    client: openai.OpenAI, standin: StandIn
) -> None:
    standin.cut_streams = True
    stream = client.chat.completions.create(
        model="m", messages=MESSAGES, temperature=0, stream=True
    )
    assert stream_text(stream) == "answer #1 to Say hi"
    standin.cut_streams = False
    assert create(client).headers["x-infercache"] == "miss"
    assert standin.chat_calls == 2


def test_a_stream_every_reader_leaves_early_stores_nothing(
    client: openai.OpenAI, standin: StandIn, cache: Cache
) -> None:
    standin.hold = threading.Event()
    stream = client.chat.completions.create(
        model="m", messages=MESSAGES, temperature=0, stream=True
    )
    next(iter(stream))
    stream.close()  # the only reader left: the fetch ends at its next chunk
    standin.hold.set()
    assert FlightWatch(cache.flights).empty()
    assert create(client).headers["x-infercache"] == "miss"
    assert cache.stats()["strategies"]["exact"]["counters"].get("stored") == 1


def test_identical_streams_in_flight_make_one_upstream_call(
    client: openai.OpenAI, standin: StandIn, cache: Cache
) -> None:
    standin.hold = threading.Event()
    texts: list[str] = []
    headers: list[str] = []

    def read() -> None:
        raw = create(client, stream=True)
        headers.append(raw.headers.get("x-infercache-coalesced", "false"))
        texts.append(stream_text(raw.parse()))

    threads = [threading.Thread(target=read) for _ in range(4)]
    for t in threads:
        t.start()
    assert FlightWatch(cache.flights).flights(1, waiting=3)
    standin.hold.set()
    for t in threads:
        t.join(30)
    assert texts == ["answer #1 to Say hi"] * 4
    assert sorted(headers) == ["false", "true", "true", "true"]
    assert standin.chat_calls == 1
    assert standin.bodies(CHAT)[0]["stream_options"] == {"include_usage": True}
    exact = cache.stats()["strategies"]["exact"]
    assert (exact["counters"]["coalesced"], exact["counters"]["stored"]) == (3, 1)


# -- embeddings --


def test_a_batch_with_one_new_input_sends_only_that_one_upstream(
    client: openai.OpenAI, standin: StandIn
) -> None:
    first = client.embeddings.create(model="e", input=["a b", "c", "d e f"])
    raw = client.embeddings.with_raw_response.create(
        model="e", input=["c", "new one", "a b", "d e f"]
    )
    second = raw.parse()
    assert [b["input"] for b in standin.bodies(EMBED)] == [["a b", "c", "d e f"], ["new one"]]
    assert raw.headers["x-infercache"] == "miss"
    assert raw.headers["x-infercache-cached-inputs"] == "3"
    assert [d.index for d in second.data] == [0, 1, 2, 3]
    by_text = {t: d.embedding for t, d in zip(["a b", "c", "d e f"], first.data, strict=True)}
    assert second.data[0].embedding == by_text["c"]
    assert second.data[2].embedding == by_text["a b"]
    assert second.data[3].embedding == by_text["d e f"]
    assert second.data[1].embedding == vector("new one", 4)
    assert second.usage.prompt_tokens == 1 + 2 + 2 + 3  # every input's tokens, in order


def test_an_all_cached_batch_never_reaches_the_provider(
    client: openai.OpenAI, standin: StandIn
) -> None:
    client.embeddings.create(model="e", input="hello there", encoding_format="float")
    raw = client.embeddings.with_raw_response.create(
        model="e", input="hello there", encoding_format="float"
    )
    assert raw.headers["x-infercache"] == "exact-hit"
    assert raw.parse().data[0].embedding == vector("hello there", 4)
    assert raw.parse().usage.prompt_tokens == 2
    assert len(standin.bodies(EMBED)) == 1


def test_the_embedding_key_covers_dimensions_encoding_format_and_the_model_version(
    client: openai.OpenAI, cache: Cache, standin: StandIn
) -> None:
    client.embeddings.create(model="e", input="x", encoding_format="float")
    client.embeddings.create(model="e", input="x", encoding_format="base64")
    client.embeddings.create(model="e", input="x", encoding_format="float", dimensions=8)
    client.embeddings.create(model="e2", input="x", encoding_format="float")
    client.embeddings.create(model="e", input="x", encoding_format="float")  # a hit
    assert len(standin.bodies(EMBED)) == 4
    cache.set_model_version("e", "v2")
    client.embeddings.create(model="e", input="x", encoding_format="float")
    assert len(standin.bodies(EMBED)) == 5


def test_base64_vectors_are_cached_as_sent_and_decoded_by_the_sdk(
    client: openai.OpenAI, standin: StandIn
) -> None:
    first = client.embeddings.create(model="e", input=["p", "q"])  # the SDK asks base64
    again = client.embeddings.create(model="e", input=["q", "p"])
    assert standin.bodies(EMBED)[0]["encoding_format"] == "base64"
    assert len(standin.bodies(EMBED)) == 1
    assert again.data[0].embedding == first.data[1].embedding == vector("q", 4)
    raw = client.embeddings.create(model="e", input="p", encoding_format="base64")
    packed = base64.b64decode(str(raw.data[0].embedding))
    assert list(struct.unpack("<4f", packed)) == vector("p", 4)


def test_an_embedding_error_is_the_sdks_error_and_nothing_is_stored(
    client: openai.OpenAI, standin: StandIn
) -> None:
    standin.fail_status = 400
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="e", input="x")
    standin.fail_status = None
    client.embeddings.create(model="e", input="x")
    assert len(standin.bodies(EMBED)) == 2


# -- everything else passes through --


def test_every_other_call_reaches_the_provider_untouched(
    client: openai.OpenAI, standin: StandIn
) -> None:
    assert [m.id for m in client.models.list()] == ["m"]
    assert client.models.retrieve("m-7").id == "m-7"
    raw = client.responses.with_raw_response.create(model="m", input="hi")
    assert raw.headers["x-standin"] == "1"
    assert "x-infercache" not in raw.headers
    assert [(r.method, r.path) for r in standin.received] == [
        ("GET", "/v1/models"),
        ("GET", "/v1/models/m-7"),
        ("POST", "/v1/responses"),
    ]
    assert standin.received[2].body == {"model": "m", "input": "hi"}


def test_a_legacy_httpx_client_is_wrapped_too(
    base_url: str, cache: Cache, standin: StandIn
) -> None:
    legacy = openai.OpenAI(api_key="k", base_url=base_url, http_client=httpx.Client())
    client = wrap(legacy, cache)
    assert [create(client).headers["x-infercache"] for _ in range(2)] == ["miss", "exact-hit"]
    assert stream_text(create(client, stream=True).parse()) == "answer #1 to Say hi"
    client.close()
    assert legacy.is_closed()  # the copy shares the wrapped client's pool


def test_a_sqlite_store_serves_the_wrapped_client(
    tmp_path: Path, base_url: str, standin: StandIn
) -> None:
    settings = Settings(data_dir=tmp_path, store_url=f"sqlite:///{tmp_path / 'c.db'}")
    cache = Cache(settings)
    client = wrap(openai.OpenAI(api_key="k", base_url=base_url), cache)
    create(client)
    reopened = wrap(openai.OpenAI(api_key="k", base_url=base_url), Cache(settings))
    assert create(reopened).headers["x-infercache"] == "exact-hit"
    client.close()
    reopened.close()


# -- asyncio --


@pytest.mark.anyio
async def test_the_async_client_caches_chat_streams_and_embeddings(
    base_url: str, cache: Cache, standin: StandIn
) -> None:
    client = wrap(openai.AsyncOpenAI(api_key="k", base_url=base_url, max_retries=0), cache)
    assert isinstance(client, openai.AsyncOpenAI)
    kwargs: dict[str, Any] = {"model": "m", "messages": MESSAGES, "temperature": 0}
    first = await client.chat.completions.with_raw_response.create(**kwargs)
    second = await client.chat.completions.with_raw_response.create(**kwargs)
    assert (first.headers["x-infercache"], second.headers["x-infercache"]) == ("miss", "exact-hit")
    assert second.parse().choices[0].message.content == "answer #1 to Say hi"

    fresh = await client.chat.completions.create(**kwargs, seed=1, stream=True)
    assert "".join([c.choices[0].delta.content or "" async for c in fresh]) == (
        "answer #2 to Say hi"
    )
    replay = await client.chat.completions.create(**kwargs, seed=1, stream=True)
    assert "".join([c.choices[0].delta.content or "" async for c in replay]) == (
        "answer #2 to Say hi"
    )
    assert standin.chat_calls == 2

    await client.embeddings.create(model="e", input=["a", "b"])
    both = await client.embeddings.create(model="e", input=["b", "c", "a"])
    assert [b["input"] for b in standin.bodies(EMBED)] == [["a", "b"], ["c"]]
    assert [d.embedding for d in both.data] == [vector(t, 4) for t in ("b", "c", "a")]
    assert [m.id for m in (await client.models.list()).data] == ["m"]
    await client.close()
