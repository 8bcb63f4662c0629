"""`OpenAIEmbedder` against a real OpenAI-compatible server on loopback (starlette + uvicorn in a
thread) whose handler embeds with the packaged static model."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from infercache.errors import ConfigError, UpstreamError, UpstreamUnavailableError
from infercache.semantic.embedder import StaticEmbedder
from infercache.semantic.openai_embedder import OpenAIEmbedder
from tests.harness.servers import free_port, serve

API_KEY = "sk-test-key"


@dataclass
class EmbeddingServer:
    base_url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    mode: str = "ok"  # ok | error | short | wrong-dim | not-json | hang
    release: asyncio.Event | None = None
    loop: asyncio.AbstractEventLoop | None = None

    def release_hung_requests(self) -> None:
        if self.loop is not None and self.release is not None:
            self.loop.call_soon_threadsafe(self.release.set)


def _app(state: EmbeddingServer, embedder: StaticEmbedder) -> Starlette:
    async def embeddings(request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {API_KEY}":
            return JSONResponse({"error": {"message": "bad key", "type": "auth"}}, 401)
        body = await request.json()
        state.requests.append(body)
        texts = body["input"]
        if state.mode == "error":
            return JSONResponse({"error": {"message": "overloaded", "type": "server"}}, 503)
        if state.mode == "not-json":
            return Response("<html>gateway</html>", 200, media_type="text/html")
        if state.mode == "hang":
            state.loop = asyncio.get_running_loop()
            state.release = asyncio.Event()
            await state.release.wait()
        vectors = embedder.embed(texts)
        if state.mode == "wrong-dim":
            vectors = vectors[:, :10]
        data = [
            {"object": "embedding", "index": i, "embedding": (v * 2.0).tolist()}  # not unit
            for i, v in enumerate(vectors)
        ]
        if state.mode == "short":
            data = data[:-1]
        data.reverse()  # the client must order by `index`, not by position
        return JSONResponse({"object": "list", "data": data, "model": body["model"]})

    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])


@pytest.fixture(scope="module")
def server(static_embedder: StaticEmbedder) -> Iterator[EmbeddingServer]:
    state = EmbeddingServer(base_url="")
    app = _app(state, static_embedder)
    with serve(app, lifespan="off", ws="none", timeout_graceful_shutdown=5) as url:
        state.base_url = f"{url}/v1"
        yield state


@pytest.fixture
def fresh(server: EmbeddingServer) -> Iterator[EmbeddingServer]:
    server.requests.clear()
    server.mode = "ok"
    yield server
    server.mode = "ok"
    server.release_hung_requests()


def _client(server: EmbeddingServer, **kw: Any) -> OpenAIEmbedder:
    options: dict[str, Any] = {"model": "static", "dim": 64, "api_key": API_KEY, **kw}
    return OpenAIEmbedder(server.base_url, **options)


def test_vectors_match_the_model_behind_the_server_in_input_order(
    fresh: EmbeddingServer, static_embedder: StaticEmbedder
) -> None:
    texts = ["reset my password", "how do I change my password", "weather in Paris"]
    with _client(fresh) as embedder:
        vectors = embedder.embed(texts)
    np.testing.assert_allclose(vectors, static_embedder.embed(texts), atol=1e-5)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert fresh.requests == [{"model": "static", "input": texts, "encoding_format": "float"}]


def test_inputs_beyond_the_batch_size_go_in_several_requests(fresh: EmbeddingServer) -> None:
    texts = [f"question number {i}" for i in range(5)]
    with _client(fresh, batch_size=2) as embedder:
        vectors = embedder.embed(texts)
    assert [len(r["input"]) for r in fresh.requests] == [2, 2, 1]
    with _client(fresh) as embedder:
        np.testing.assert_allclose(vectors, embedder.embed(texts), atol=1e-6)


def test_a_wrong_api_key_is_an_upstream_error_keeping_status_and_body(
    fresh: EmbeddingServer,
) -> None:
    with _client(fresh, api_key="sk-wrong") as embedder, pytest.raises(UpstreamError) as info:
        embedder.embed(["hello"])
    assert info.value.status_code == 401
    assert info.value.body == {"error": {"message": "bad key", "type": "auth"}}
    assert not isinstance(info.value, UpstreamUnavailableError)


@pytest.mark.parametrize(
    ("mode", "status", "message"),
    [
        ("error", 503, "HTTP 503"),
        ("short", 502, "sent 1 embeddings for 2 inputs"),
        ("wrong-dim", 502, "length 10, expected dim=64"),
        ("not-json", 502, "sent no embeddings"),
    ],
)
def test_bad_answers_become_upstream_errors(
    fresh: EmbeddingServer, mode: str, status: int, message: str
) -> None:
    fresh.mode = mode
    with _client(fresh) as embedder, pytest.raises(UpstreamError, match=message) as info:
        embedder.embed(["one text", "another text"])
    assert info.value.status_code == status


def test_a_closed_port_is_upstream_unavailable() -> None:
    embedder = OpenAIEmbedder(f"http://127.0.0.1:{free_port()}/v1", model="m", dim=4)
    with embedder, pytest.raises(UpstreamUnavailableError, match="unreachable: ConnectError"):
        embedder.embed(["hello"])


def test_a_server_slower_than_the_timeout_is_upstream_unavailable(
    fresh: EmbeddingServer,
) -> None:
    fresh.mode = "hang"
    with (
        _client(fresh, timeout_s=0.2) as embedder,
        pytest.raises(UpstreamUnavailableError, match="ReadTimeout"),
    ):
        embedder.embed(["hello"])


def test_bad_settings_are_config_errors_naming_the_value() -> None:
    with pytest.raises(ConfigError, match="'ftp://x'"):
        OpenAIEmbedder("ftp://x", model="m", dim=4)
    with pytest.raises(ConfigError, match="dim=0"):
        OpenAIEmbedder("http://127.0.0.1:1/v1", model="m", dim=0)
