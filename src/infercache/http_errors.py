"""The HTTP error boundary every infercache server shares (the gateway and the engine server).

    InfercacheError            → its own status, headers and OpenAI error body
    Starlette HTTPException    → the same shape: an unknown route is 404 `not_found`, a wrong
                                 method 405 (with its Allow header)
    anything else              → 500 `server_error`, the traceback logged (never sent), and
                                 `Connection: close`, so a keep-alive client does not reuse a
                                 connection the server may be about to drop
    read_json(request, limit)  → the body read with a hard byte limit (413 past it, before any
                                 parsing) and parsed strictly: invalid JSON, nesting over 1,024
                                 levels, a lone surrogate or a non-finite number is a 400

A server is `Starlette(routes, exception_handlers=exception_handlers(), middleware=middleware())`:
the `CatchAll` middleware sits inside Starlette's `ServerErrorMiddleware` and takes what no handler
took, so that one never sees it (it would answer in plain text, then re-raise into the server,
which drops a keep-alive connection without warning the client).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infercache.errors import (
    ClientDisconnectedError,
    InfercacheError,
    InvalidRequestError,
    NotCachedError,
    PayloadTooLargeError,
    openai_error_body,
)

log = logging.getLogger(__name__)

ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]


def error_response(exc: InfercacheError) -> JSONResponse:
    """The error's response; logged at WARNING only when it is a fault on our side or
    upstream (a 5xx), at INFO when the client asked for it (`only-if-cached` and nothing
    cached: a 504 by HTTP's rule, yet the client's own condition); 4xx are not logged."""
    if isinstance(exc, NotCachedError):
        log.info("request not answered: %s", exc)
    elif exc.status_code >= 500:
        log.warning("request failed: %s: %s", type(exc).__name__, exc)
    return JSONResponse(exc.to_openai(), status_code=exc.status_code, headers=exc.headers())


async def _on_infercache_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, InfercacheError):
        raise TypeError(f"not an InfercacheError: {exc!r}")
    return error_response(exc)


async def _on_http_error(request: Request, exc: Exception) -> Response:
    if not isinstance(exc, HTTPException):
        raise TypeError(f"not an HTTPException: {exc!r}")
    status = exc.status_code
    if status == 404:
        message, kind, code = f"no route {request.url.path}", "invalid_request_error", "not_found"
    elif status == 405:
        message = f"method {request.method} not allowed on {request.url.path}"
        kind, code = "invalid_request_error", "method_not_allowed"
    else:
        message, kind, code = str(exc.detail), "invalid_request_error", None
    body = openai_error_body(message, error_type=kind, code=code)
    return JSONResponse(body, status_code=status, headers=exc.headers)


def exception_handlers() -> dict[Any, ErrorHandler]:
    """Starlette `exception_handlers` for our errors and Starlette's own HTTP errors."""
    return {InfercacheError: _on_infercache_error, HTTPException: _on_http_error}


INTERNAL_ERROR = "internal server error"


def internal_error_body() -> dict[str, Any]:
    """What a client is told about a failure we did not foresee (the details are logged)."""
    return openai_error_body(INTERNAL_ERROR, error_type="server_error", code=None)


class CatchAll:
    """ASGI middleware: an unexpected exception becomes a logged 500 in the OpenAI shape with
    `Connection: close`; after the response has started it can only be logged (the server then
    ends the response). Nothing is re-raised into the server."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            if started:
                return
            body = orjson.dumps(internal_error_body())
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})


def middleware() -> list[Middleware]:
    """Starlette `middleware`: the catch-all for unexpected exceptions."""
    return [Middleware(CatchAll)]


_MAX_DEPTH_NOTE = "nesting deeper than 1024 levels"


async def read_json(request: Request, max_body_bytes: int) -> Any:
    """The request body as JSON, read with a hard limit of `max_body_bytes`."""
    declared = request.headers.get("content-length")
    if (
        declared is not None
        and declared.isascii()
        and declared.isdigit()
        and int(declared) > max_body_bytes
    ):
        raise PayloadTooLargeError(f"request body over the limit of {max_body_bytes} bytes")
    # The ASGI messages read directly, as `request.stream()` reads them (its async generator
    # cost a hit ~2 µs; nothing else reads these bodies).
    receive = request.receive
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            part: bytes = message.get("body", b"")
            size += len(part)
            if size > max_body_bytes:
                raise PayloadTooLargeError(f"request body over the limit of {max_body_bytes} bytes")
            parts.append(part)
            if not message.get("more_body", False):
                break
        elif kind == "http.disconnect":
            raise ClientDisconnectedError("the client left before its request was read")
    return parse_json(parts[0] if len(parts) == 1 else b"".join(parts))


def parse_json(raw: bytes) -> Any:
    """Strict JSON: orjson refuses lone surrogates, NaN/Infinity and depth over 1024."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if not raw.strip():  # the parser would say "zero-length, empty document"
            raise InvalidRequestError("the request body is empty: send a JSON object") from None
        reason = str(exc)
        if "depth" in reason:
            reason = _MAX_DEPTH_NOTE
        raise InvalidRequestError(f"the body is not valid JSON: {reason}") from exc


def json_object(value: Any, what: str = "the request body") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{what} must be a JSON object")
    return value
