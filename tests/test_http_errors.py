"""The shared HTTP error boundary: every failure leaves in the OpenAI shape."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from infercache.errors import ClientDisconnectedError, OverloadedError, PayloadTooLargeError
from infercache.http_errors import exception_handlers, middleware, read_json


def _app(max_body_bytes: int = 1024) -> Starlette:
    async def echo(request: Request) -> Response:
        return JSONResponse({"got": await read_json(request, max_body_bytes)})

    async def boom(request: Request) -> Response:
        raise RuntimeError("secret internal detail")

    async def busy(request: Request) -> Response:
        raise OverloadedError("queue full", retry_after_s=3)

    return Starlette(
        routes=[
            Route("/echo", echo, methods=["POST"]),
            Route("/boom", boom, methods=["GET"]),
            Route("/busy", busy, methods=["GET"]),
        ],
        exception_handlers=exception_handlers(),
        middleware=middleware(),
    )


def _assert_openai_error(response: Response | object, status: int) -> dict[str, object]:
    assert response.status_code == status  # type: ignore[attr-defined]
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


def test_unknown_route_is_an_openai_404() -> None:
    error = _assert_openai_error(TestClient(_app()).get("/nope"), 404)
    assert error["code"] == "not_found"


def test_wrong_method_is_an_openai_405_with_allow() -> None:
    response = TestClient(_app()).get("/echo")
    error = _assert_openai_error(response, 405)
    assert error["code"] == "method_not_allowed"
    assert "POST" in response.headers["allow"]


def test_unexpected_exception_is_a_logged_500_that_closes_the_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    response = TestClient(_app()).get("/boom")
    error = _assert_openai_error(response, 500)
    assert "secret internal detail" not in response.text
    assert error["type"] == "server_error"
    assert response.headers["connection"] == "close"
    assert any("secret internal detail" in (r.exc_text or "") for r in caplog.records)


def test_overloaded_carries_retry_after() -> None:
    response = TestClient(_app()).get("/busy")
    _assert_openai_error(response, 429)
    assert response.headers["retry-after"] == "3"


def test_body_over_the_limit_is_413_before_parsing() -> None:
    client = TestClient(_app(max_body_bytes=1024))
    _assert_openai_error(client.post("/echo", content=b"[" + b"1," * 600 + b"1]"), 413)


@pytest.mark.parametrize(
    "raw",
    [
        b"{",
        b"[" * 5000 + b"]" * 5000,
        b'"\\ud800"',
        b'{"a": NaN}',
        b'{"a": 1e400}',
        b"\xff\xfe",
    ],
    ids=["truncated", "deep", "lone-surrogate", "nan", "infinite", "not-utf8"],
)
def test_malformed_json_is_a_400(raw: bytes) -> None:
    client = TestClient(_app(max_body_bytes=1 << 20))
    error = _assert_openai_error(client.post("/echo", content=raw), 400)
    assert str(error["message"]).startswith("the body is not valid JSON")


def test_valid_json_passes_through() -> None:
    body = {"a": [1, 2.5, "é", None, {"b": True}]}
    response = TestClient(_app()).post("/echo", content=json.dumps(body))
    assert response.status_code == 200
    assert response.json() == {"got": body}


def _read(messages: list[dict[str, object]], max_body_bytes: int = 1024) -> object:
    """read_json over these ASGI messages, as a server delivers a body in parts."""
    queue = list(messages)

    async def receive() -> dict[str, object]:
        return queue.pop(0)

    request = Request({"type": "http", "method": "POST", "headers": []}, receive)
    return asyncio.run(read_json(request, max_body_bytes))


def _part(body: bytes, more: bool) -> dict[str, object]:
    return {"type": "http.request", "body": body, "more_body": more}


def test_a_body_in_parts_is_read_whole() -> None:
    assert _read([_part(b'{"a": [1,', True), _part(b"", True), _part(b" 2]}", False)]) == {
        "a": [1, 2]
    }


def test_a_body_in_parts_without_a_length_is_cut_off_at_the_limit() -> None:
    with pytest.raises(PayloadTooLargeError):
        _read([_part(b"[" + b"1," * 300, True), _part(b"1," * 300 + b"1]", False)], 1024)


def test_a_client_that_leaves_mid_body_is_a_499_not_a_hang() -> None:
    with pytest.raises(ClientDisconnectedError):
        _read([_part(b'{"a":', True), {"type": "http.disconnect"}])
