"""The HTTP server: in-process for breadth, and a real uvicorn on loopback with the official
`openai` client in front."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from starlette.testclient import TestClient

from infercache.engine.config import EngineConfig
from infercache.engine.engine import Engine
from infercache.engine.server import create_app
from tests.harness.engine_requests import engine_chat
from tests.harness.openai_streams import streamed
from tests.harness.servers import serve


def body(engine: Engine, question: str = "hello", **fields: Any) -> dict[str, Any]:
    return engine_chat(engine.model_id, question, **{"max_tokens": 5, **fields})


def assert_openai_error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    return error


def test_chat_completion_over_http(client: TestClient, engine: Engine) -> None:
    r = client.post("/v1/chat/completions", json=body(engine))
    assert r.status_code == 200
    out = r.json()
    assert out["system_fingerprint"] == engine.model_version
    assert out["usage"]["completion_tokens"] == 5


def test_streaming_over_http_is_server_sent_events_ending_with_done(
    client: TestClient, engine: Engine
) -> None:
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json=body(engine, stream=True, stream_options={"include_usage": True}),
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks[-1]["usage"]["completion_tokens"] == 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_tenant_header_isolates_prefixes(client: TestClient, engine: Engine) -> None:
    def cached(tenant: str) -> int:
        r = client.post(
            "/v1/chat/completions",
            json=body(engine, "tenant test"),
            headers={"x-infercache-tenant": tenant},
        )
        tokens: int = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        return tokens

    assert cached("t1") == 0
    assert cached("t1") > 0
    assert cached("t2") == 0


def test_malformed_json_is_a_400(client: TestClient) -> None:
    r = client.post("/v1/chat/completions", content=b"{not json")
    assert_openai_error(r, 400)


@pytest.mark.parametrize(
    ("fields", "status", "code", "param"),
    [
        ({"n": 2}, 400, None, "n"),
        ({"max_tokens": "ten"}, 400, None, "max_tokens"),
        ({"messages": [{"role": "user"}]}, 400, None, "messages[0].content"),
        ({"model": "gpt-9"}, 404, "model_not_found", "model"),
        # The prompt fits: the completion asked for is what to shorten (issue 26 item 9).
        ({"max_tokens": 250}, 400, "context_length_exceeded", "max_tokens"),
        ({"max_completion_tokens": 250}, 400, "context_length_exceeded", "max_completion_tokens"),
        (
            {"messages": [{"role": "user", "content": "hi " * 300}]},
            400,
            "context_length_exceeded",
            "messages",
        ),
        ({"stream": True, "model": "gpt-9"}, 404, "model_not_found", "model"),
    ],
)
def test_bad_requests_get_openai_shaped_errors(
    client: TestClient, engine: Engine, fields: dict[str, Any], status: int, code: str, param: str
) -> None:
    r = client.post("/v1/chat/completions", json=body(engine, **fields))
    assert assert_openai_error(r, status, code)["param"] == param


def test_a_json_array_body_is_a_400(client: TestClient) -> None:
    assert_openai_error(client.post("/v1/chat/completions", json=[1]), 400)


def test_unknown_routes_and_methods_are_openai_shaped(client: TestClient) -> None:
    assert_openai_error(client.get("/v1/nothing"), 404, "not_found")
    assert_openai_error(client.get("/v1/chat/completions"), 405, "method_not_allowed")


def test_a_body_over_the_limit_is_a_413_before_parsing(engine: Engine) -> None:
    with TestClient(create_app(engine, max_body_bytes=1024)) as small:
        fits = small.post("/v1/chat/completions", json=body(engine))
        assert fits.status_code == 200
        big = body(engine, "x" * 2000)
        error = assert_openai_error(
            small.post("/v1/chat/completions", json=big), 413, "payload_too_large"
        )
        assert "1024 bytes" in error["message"]
        # No content-length to go by: the limit holds while the body streams in.
        chunks = iter([b'{"model": "', b"y" * 1500, b'"}'])
        streamed = small.post("/v1/chat/completions", content=chunks)
        assert_openai_error(streamed, 413, "payload_too_large")


def test_an_unexpected_exception_is_an_openai_shaped_500_with_the_traceback_only_logged(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> list[dict[str, Any]]:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(engine, "models", broken)
    with TestClient(create_app(engine), raise_server_exceptions=False) as c:
        r = c.get("/v1/models")
        error = assert_openai_error(r, 500)
        assert error["type"] == "server_error"
        assert "secret" not in r.text
        assert "Traceback" not in r.text
        assert r.headers["connection"] == "close"
        after = c.post("/v1/chat/completions", json=body(engine))  # the server carries on
        assert after.status_code == 200
    logged = [rec for rec in caplog.records if rec.exc_info is not None]
    assert any("secret internal detail" in str(rec.exc_info[1]) for rec in logged if rec.exc_info)


def test_a_full_queue_is_a_429_with_retry_after_in_the_openai_shape(
    tiny_dir: Path, tmp_path: Path
) -> None:
    config = EngineConfig(
        data_dir=tmp_path, model_path=tiny_dir, max_batch=1, max_queue=0, max_step_tokens=64
    )
    with Engine(config) as small, TestClient(create_app(small)) as c:
        busy = small.chat_stream(body(small, max_tokens=200, stream=True))
        next(busy)  # holds the one place
        for extra in ({}, {"stream": True}):
            r = c.post("/v1/chat/completions", json=body(small, **extra))
            error = assert_openai_error(r, 429, "overloaded")
            assert error["type"] == "rate_limit_error"
            assert r.headers["retry-after"] == "1"
        busy.close()  # cancelled: it leaves at the next step
        assert small.wait_idle(30)
        assert c.post("/v1/chat/completions", json=body(small)).status_code == 200


def test_models_lists_the_id_and_version(client: TestClient, engine: Engine) -> None:
    data = client.get("/v1/models").json()
    assert data["object"] == "list"
    assert [(m["id"], m["version"], m["owned_by"]) for m in data["data"]] == [
        (engine.model_id, engine.model_version, "infercache")
    ]


def test_metrics_and_stats_expose_the_prefix_strategy(client: TestClient, engine: Engine) -> None:
    client.post("/v1/chat/completions", json=body(engine))
    text = client.get("/metrics").text
    assert 'infercache_lookups_total{strategy="prefix"}' in text
    assert 'infercache_prefix_cache_bytes{strategy="prefix"}' in text
    stats = client.get("/stats").json()
    assert stats["model"]["version"] == engine.model_version
    assert stats["prefix"]["lookups"] >= 1


@pytest.fixture(scope="module")
def loopback_url(engine: Engine) -> Iterator[str]:
    """A real uvicorn server on loopback."""
    with serve(create_app(engine)) as url:
        yield f"{url}/v1"


def test_openai_client_over_a_real_loopback_server(loopback_url: str, engine: Engine) -> None:
    client = openai.OpenAI(base_url=loopback_url, api_key="unused", max_retries=0)
    messages: Any = body(engine, "openai client")["messages"]
    first = client.chat.completions.create(
        model=engine.model_id, messages=messages, max_tokens=5, temperature=0
    )
    text, chunks = streamed(
        client, model=engine.model_id, messages=messages, max_tokens=5, temperature=0
    )
    assert text == first.choices[0].message.content
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens > 0
    assert first.system_fingerprint == engine.model_version
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=messages)
