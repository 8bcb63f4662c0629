"""The legacy completions API on the engine (`POST /v1/completions`, a raw prompt, no chat
template): parsing, the `text_completion` shapes, the HTTP route in process and with the
official `openai` client on a real loopback server, and the gateway's in-process adapter."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from starlette.testclient import TestClient

from infercache.engine.engine import Engine
from infercache.engine.openai_api import parse_completion_request
from infercache.engine.responses import ChunkStream, ResponseMeta, completion
from infercache.engine.sequence import GenerationResult
from infercache.engine.server import create_app
from infercache.errors import InvalidRequestError, OverloadedError
from infercache.gateway.engine_upstream import EngineUpstream
from infercache.gateway.upstream_protocols import TextCompletions
from tests.harness.engine_requests import request_stats
from tests.harness.servers import serve

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "The capital of France is"},
]
PROMPT = "The capital of France is Paris. The capital of Italy is"
STATS = request_stats(7, 2, 3)


def body(engine: Engine, prompt: Any = PROMPT, **fields: Any) -> dict[str, Any]:
    return {"model": engine.model_id, "prompt": prompt, "temperature": 0, "max_tokens": 6, **fields}


# -- parsing and shapes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("hi", "hi"), (["hi"], "hi"), ([5, 6, 7], (5, 6, 7)), ([[5, 6]], (5, 6))],
)
def test_one_prompt_is_a_string_or_token_ids_alone_or_in_a_list(prompt: Any, expected: Any) -> None:
    parsed = parse_completion_request({"model": "m", "prompt": prompt})
    assert (parsed.prompt, parsed.messages, parsed.legacy) == (expected, (), True)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": None}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": [[1], [2]]}, "prompt"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": {"text": "a"}}, "prompt"),
        ({"echo": True}, "echo"),
        ({"suffix": "the end"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"logprobs": 2}, "logprobs"),
        ({"n": 2}, "n"),
        ({"model": ""}, "model"),
    ],
)
def test_what_the_engine_cannot_honour_is_refused_naming_the_parameter(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        parse_completion_request({"model": "m", "prompt": "hi", **fields})
    assert refused.value.param == param


def test_a_text_completion_and_its_chunks_have_the_legacy_shapes() -> None:
    meta = ResponseMeta("cmpl-1", 1, "m", "fp_x", kind="text_completion")
    result = GenerationResult("Paris", (1, 2, 3), "stop", STATS)
    out = completion(meta, result)
    assert out["object"] == "text_completion"
    assert out["choices"] == [
        {"index": 0, "text": "Paris", "logprobs": None, "finish_reason": "stop"}
    ]
    assert out["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}
    stream = ChunkStream(meta, include_usage=True)
    chunks = [*stream.start(), stream.content("Par"), stream.content("is"), *stream.finish(result)]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert [c["choices"][0]["text"] for c in chunks[:3]] == ["Par", "is", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:3]] == [None, None, "stop"]
    assert (chunks[3]["choices"], chunks[3]["usage"]["completion_tokens"]) == ([], 3)
    assert all(c["usage"] is None for c in chunks[:3])


# -- the engine -----------------------------------------------------------------------------


def test_a_raw_prompt_runs_without_a_chat_template(engine: Engine) -> None:
    """The chat request's templated ids, sent as a legacy prompt, give the chat's answer; the
    same words as text are encoded as they are, with no template around them."""
    chat = engine.chat(
        {"model": engine.model_id, "messages": MESSAGES, "temperature": 0, "max_tokens": 8}
    )
    ids = engine.tokenizer.encode_chat(MESSAGES)
    legacy = engine.text_completion(
        body(engine, ids, max_tokens=chat["usage"]["completion_tokens"])
    )
    assert legacy["object"] == "text_completion"
    assert legacy["id"].startswith("cmpl-")
    assert legacy["choices"][0]["text"] == chat["choices"][0]["message"]["content"]
    assert legacy["usage"]["prompt_tokens"] == len(ids) == chat["usage"]["prompt_tokens"]
    raw = engine.text_completion(body(engine))
    assert raw["usage"]["prompt_tokens"] == len(engine.tokenizer.encode_prompt(PROMPT))
    assert raw["choices"][0]["finish_reason"] == "length"


def test_max_tokens_defaults_to_16_as_openai(engine: Engine) -> None:
    out = engine.text_completion(
        {"model": engine.model_id, "prompt": "hello world", "ignore_eos": True}
    )
    assert out["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize(
    ("fields", "status", "code", "param"),
    [
        ({"prompt": ""}, 400, None, "prompt"),
        ({"prompt": [0, 10**6]}, 400, None, "prompt"),
        ({"max_tokens": 250}, 400, "context_length_exceeded", "max_tokens"),
        ({"prompt": "hi " * 300}, 400, "context_length_exceeded", "prompt"),
        ({"model": "gpt-9"}, 404, "model_not_found", "model"),
        ({"echo": True, "stream": True}, 400, None, "echo"),
    ],
)
def test_bad_prompts_are_openai_shaped_errors_before_anything_runs(
    client: TestClient,
    engine: Engine,
    fields: dict[str, Any],
    status: int,
    code: str | None,
    param: str,
) -> None:
    r = client.post("/v1/completions", json=body(engine, **fields))
    assert r.status_code == status
    error = r.json()["error"]
    assert (error["code"], error["param"]) == (code, param)


def test_the_route_answers_json_and_server_sent_events_with_the_same_text(
    client: TestClient, engine: Engine
) -> None:
    plain = client.post("/v1/completions", json=body(engine))
    assert plain.status_code == 200
    answer = plain.json()
    assert answer["system_fingerprint"] == engine.model_version
    fields = {"stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=body(engine, **fields)) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert (
        "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        == (answer["choices"][0]["text"])
    )
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # KV reused


@pytest.fixture(scope="module")
def loopback_url(engine: Engine) -> Iterator[str]:
    with serve(create_app(engine)) as url:
        yield f"{url}/v1"


def test_the_openai_client_completes_streamed_and_not(loopback_url: str, engine: Engine) -> None:
    with openai.OpenAI(base_url=loopback_url, api_key="unused", max_retries=0) as app:
        first = app.completions.create(
            model=engine.model_id, prompt="hello world", max_tokens=5, temperature=0
        )
        stream = app.completions.create(
            model=engine.model_id,
            prompt="hello world",
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        with pytest.raises(openai.BadRequestError):
            app.completions.create(model=engine.model_id, prompt=["one", "two"])
    assert first.choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks if c.choices) == first.choices[0].text
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 5


# -- the gateway's in-process adapter -------------------------------------------------------


def test_the_adapter_serves_text_completions_and_raises_overloaded_when_full(
    make_engine: Callable[..., Engine], tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir, max_batch=1, max_queue=0, max_step_tokens=64)
    upstream = EngineUpstream(engine)
    assert isinstance(upstream, TextCompletions)

    async def run() -> None:
        answer = await upstream.complete_text(body(engine), tenant="t", api_key=None)
        assert answer["object"] == "text_completion"
        busy = upstream.stream_text(body(engine, max_tokens=400), tenant="t", api_key=None)
        first = await anext(busy)
        assert first["object"] == "text_completion"
        with pytest.raises(OverloadedError) as refused:
            upstream.stream_text(body(engine), tenant="u", api_key=None)
        assert refused.value.headers() == {"retry-after": "1"}
        with pytest.raises(OverloadedError):
            await upstream.complete_text(body(engine), tenant="u", api_key=None)
        await busy.aclose()

    asyncio.run(run())
    assert engine.wait_idle(30)
    assert engine.stats()["running_sequences"] == 0
