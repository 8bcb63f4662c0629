"""The engine's OpenAI-compatible HTTP server (starlette; run by uvicorn).

Routes: `POST /v1/chat/completions` (JSON, or SSE when `stream` is true, with the usage chunk
when `stream_options.include_usage`), `GET /v1/models`, `GET /metrics` (Prometheus text),
`GET /stats` (JSON). The tenant is the `x-infercache-tenant` header, else the body's `user`.
Every error is an OpenAI-shaped JSON body with the right status, never a traceback; an error
after a stream has started is sent as a final `data: {"error": ...}` event.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from infercache.chat import SSE_DONE, sse_event
from infercache.engine.engine import Engine
from infercache.errors import InfercacheError, InvalidRequestError

TENANT_HEADER = "x-infercache-tenant"


def create_app(engine: Engine) -> Starlette:
    async def chat_completions(request: Request) -> Response:
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidRequestError(f"the body is not valid JSON: {e}") from e
        tenant = request.headers.get(TENANT_HEADER) or None
        if isinstance(body, dict) and body.get("stream") is True:
            chunks = engine.achat_stream(body, tenant)
            return StreamingResponse(_sse(chunks), media_type="text/event-stream")
        return JSONResponse(await engine.achat(body, tenant))

    async def models(_request: Request) -> Response:
        return JSONResponse({"object": "list", "data": engine.models()})

    async def metrics(_request: Request) -> Response:
        return Response(engine.metrics.to_prometheus(), media_type=CONTENT_TYPE_LATEST)

    async def stats(_request: Request) -> Response:
        return JSONResponse(engine.stats())

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/stats", stats, methods=["GET"]),
        ],
        exception_handlers={
            InfercacheError: _infercache_error,
            HTTPException: _http_error,
        },
    )


async def _sse(chunks: AsyncIterator[dict[str, object]]) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield sse_event(chunk)
    except InfercacheError as e:
        yield sse_event(e.to_openai())
        return
    yield SSE_DONE


async def _infercache_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, InfercacheError)
    return JSONResponse(exc.to_openai(), status_code=exc.status_code)


async def _http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    body = {
        "error": {
            "message": exc.detail,
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found" if exc.status_code == 404 else None,
        }
    }
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)
