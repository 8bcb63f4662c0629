"""A hit reports the usage the `hit_usage` setting says, and the tokens it saved in
`x-infercache-saved-tokens`, through the gateway (plain, streamed, coalesced) and the wrapped
`openai` client alike; it repeats the original `id` (hit_usage.py; issue 26 item 5; the cost
trackers' view: test_cost_trackers.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from infercache import Cache, Settings, wrap
from infercache.clock import ManualClock
from infercache.errors import ConfigError
from infercache.hit_usage import HitUsage, served_hit
from tests.gateway.conftest import MakeGateway, body
from tests.gateway.test_gateway import two_on_one_flight
from tests.harness.servers import serve
from tests.integrations.openai_standin import StandIn

STORED = {
    "id": "chatcmpl-7",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris"}}],
    "usage": {
        "prompt_tokens": 30,
        "completion_tokens": 6,
        "total_tokens": 36,
        "prompt_tokens_details": {"cached_tokens": 16, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 2},
    },
}


def test_zero_reports_no_token_billed_and_keeps_everything_else() -> None:
    hit = served_hit(STORED, HitUsage.ZERO, raw=b"stored bytes")
    assert hit.response["usage"] == {
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "total_tokens": 0,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    assert {k: v for k, v in hit.response.items() if k != "usage"} == {
        k: v for k, v in STORED.items() if k != "usage"
    }
    assert hit.headers == {"x-infercache-saved-tokens": "prompt=30, completion=6"}
    assert hit.raw is None  # changed: serialised anew
    assert STORED["usage"]["prompt_tokens"] == 30  # the stored answer is not touched


def test_cached_reports_the_whole_prompt_as_a_cache_read() -> None:
    usage = served_hit(STORED, HitUsage.CACHED).response["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (30, 6)
    assert usage["prompt_tokens_details"] == {"cached_tokens": 30, "audio_tokens": 0}


def test_original_replays_the_stored_bytes() -> None:
    hit = served_hit(STORED, HitUsage.ORIGINAL, raw=b"stored bytes")
    assert (hit.response, hit.raw) == (STORED, b"stored bytes")
    assert hit.headers["x-infercache-saved-tokens"] == "prompt=30, completion=6"


def test_an_answer_without_usage_is_served_as_it_is() -> None:
    answer = {k: v for k, v in STORED.items() if k != "usage"}
    hit = served_hit(answer, HitUsage.ZERO)
    assert hit.response == answer
    assert hit.headers["x-infercache-saved-tokens"] == "prompt=0, completion=0"


def test_the_setting_is_read_from_toml_and_the_environment(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).hit_usage is HitUsage.ZERO  # the default
    config = tmp_path / "c.toml"
    config.write_text('[cache]\nhit_usage = "cached"\n')
    assert Settings.load({}, config).hit_usage is HitUsage.CACHED
    assert Settings.load({"INFERCACHE_HIT_USAGE": "original"}).hit_usage is HitUsage.ORIGINAL
    with pytest.raises(ConfigError, match="hit_usage must be one of zero, cached, original"):
        Settings.load({"INFERCACHE_HIT_USAGE": "free"})


def test_the_gateway_reports_a_hit_as_saved_and_repeats_its_id(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    with running.client() as client:
        miss = client.post("/v1/chat/completions", json=body())
        hit = client.post("/v1/chat/completions", json=body())
        streamed = client.post(
            "/v1/chat/completions",
            json=body(stream=True, stream_options={"include_usage": True}),
        )
    assert (miss.headers["x-infercache"], hit.headers["x-infercache"]) == ("miss", "exact-hit")
    assert "x-infercache-saved-tokens" not in miss.headers
    assert miss.json()["usage"]["prompt_tokens"] == 30  # a miss: what the upstream reported
    assert hit.json()["id"] == miss.json()["id"]  # what /v1/feedback names
    assert hit.json()["usage"]["prompt_tokens"] == hit.json()["usage"]["completion_tokens"] == 0
    assert hit.headers["x-infercache-saved-tokens"] == "prompt=30, completion=6"
    events = [e for e in streamed.text.split("\n\n") if e.startswith("data: {")]
    usage = json.loads(events[-1].removeprefix("data: "))["usage"]
    assert usage["prompt_tokens"] == usage["completion_tokens"] == 0
    assert streamed.headers["x-infercache-saved-tokens"] == "prompt=30, completion=6"


@pytest.mark.parametrize("stream", [False, True])
def test_a_coalesced_answer_is_reported_as_a_hit_too(
    make_gateway: MakeGateway, stream: bool
) -> None:
    """Two identical requests in flight: one upstream call; /stats counts the waiter as a hit,
    and its usage says so."""
    running = make_gateway()
    payload = body("held", stream=stream)
    if stream:
        payload["stream_options"] = {"include_usage": True}
    answers = two_on_one_flight(running, payload)
    usages = {}
    for answer in answers:
        if stream:
            events = [e for e in answer.text.split("\n\n") if e.startswith("data: {")]
            usage = json.loads(events[-1].removeprefix("data: "))["usage"]
        else:
            usage = answer.json()["usage"]
        usages[answer.headers.get("x-infercache-coalesced", "leader")] = usage["prompt_tokens"]
    assert usages == {"leader": 30, "true": 0}


@pytest.fixture
def wrapped(tmp_path: Path, clock: ManualClock) -> Iterator[openai.OpenAI]:
    standin = StandIn()
    cache = Cache(Settings(data_dir=tmp_path, store_url="memory://"), clock=clock)
    with serve(standin.app) as url:
        client = wrap(openai.OpenAI(api_key="k", base_url=f"{url}/v1", max_retries=0), cache)
        yield client
        client.close()
    cache.close()


def test_the_wrapped_client_reports_a_hit_as_saved(wrapped: openai.OpenAI) -> None:
    fields: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "Say hi"}],
        "temperature": 0,
    }
    miss = wrapped.chat.completions.with_raw_response.create(**fields)
    hit = wrapped.chat.completions.with_raw_response.create(**fields)
    stream = wrapped.chat.completions.create(
        **fields, stream=True, stream_options={"include_usage": True}
    )
    streamed_usage = [c.usage for c in stream if c.usage is not None]
    assert hit.headers["x-infercache"] == "exact-hit"
    original = miss.parse().usage
    assert original is not None
    assert original.prompt_tokens > 0
    assert hit.headers["x-infercache-saved-tokens"] == (
        f"prompt={original.prompt_tokens}, completion={original.completion_tokens}"
    )
    served = hit.parse()
    assert served.id == miss.parse().id
    assert served.usage is not None
    assert (served.usage.prompt_tokens, served.usage.completion_tokens) == (0, 0)
    assert [(u.prompt_tokens, u.completion_tokens) for u in streamed_usage] == [(0, 0)]
