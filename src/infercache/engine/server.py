"""The engine's OpenAI-compatible HTTP server (starlette; run by uvicorn).

Routes: `POST /v1/chat/completions` (JSON, or SSE when `stream` is true, with the usage chunk
when `stream_options.include_usage`), `POST /v1/completions` (the legacy API: a raw prompt, no
chat template; the same, with `text_completion` shapes), `GET /v1/models`, `GET /metrics`
(Prometheus text), `GET /stats` (JSON). The tenant is the `x-infercache-tenant` header, else
the body's `user`. Errors go through the boundary every infercache server shares
(http_errors.py): an OpenAI-shaped JSON body with the right status, never a traceback, and a
body limit of `max_body_bytes`; an error after a stream has started is sent as a final
`data: {"error": ...}` event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from infercache.chat import SSE_DONE, sse_event
from infercache.engine.engine import Engine
from infercache.errors import InfercacheError
from infercache.http_errors import exception_handlers, json_object, middleware, read_json

TENANT_HEADER = "x-infercache-tenant"


def create_app(engine: Engine, *, max_body_bytes: int = 4 << 20) -> Starlette:
    chat_completions = _completion_route(engine.achat, engine.achat_stream, max_body_bytes)
    completions = _completion_route(
        engine.atext_completion, engine.atext_completion_stream, max_body_bytes
    )

    async def models(_request: Request) -> Response:
        return JSONResponse({"object": "list", "data": engine.models()})

    async def metrics(_request: Request) -> Response:
        return Response(engine.metrics.to_prometheus(), media_type=CONTENT_TYPE_LATEST)

    async def stats(_request: Request) -> Response:
        return JSONResponse(engine.stats())

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/stats", stats, methods=["GET"]),
        ],
        exception_handlers=exception_handlers(),
        middleware=middleware(),
    )


_Body = Mapping[str, Any]


def _completion_route(
    answer: Callable[[_Body, str | None], Awaitable[dict[str, Any]]],
    stream: Callable[[_Body, str | None], AsyncIterator[dict[str, Any]]],
    max_body_bytes: int,
) -> Callable[[Request], Awaitable[Response]]:
    """A completion endpoint: JSON, or SSE when the body asks for `stream`."""

    async def route(request: Request) -> Response:
        body = json_object(await read_json(request, max_body_bytes))
        tenant = request.headers.get(TENANT_HEADER) or None
        if body.get("stream") is True:
            return StreamingResponse(_sse(stream(body, tenant)), media_type="text/event-stream")
        return JSONResponse(await answer(body, tenant))

    return route


async def _sse(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield sse_event(chunk)
    except InfercacheError as e:
        yield sse_event(e.to_openai())
        return
    yield SSE_DONE
