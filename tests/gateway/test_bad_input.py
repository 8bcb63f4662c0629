"""Every malformed or out-of-range input is a 400 in the OpenAI shape, never a 500, and stores
nothing; oversized headers are a 431; a 5xx closes the connection properly."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import MakeGateway, Running, body

BIG = 2**70


def raw_post(running: Running, content: bytes, **headers: str) -> httpx.Response:
    with running.client() as client:
        return client.post(
            "/v1/chat/completions",
            content=content,
            headers={"content-type": "application/json", **headers},
        )


def assert_openai_400(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error


@pytest.mark.parametrize(
    "content",
    [
        b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
    ],
    ids=["nested-100k", "lone-surrogate", "nan"],
)
def test_unparseable_bodies_are_400(make_gateway: MakeGateway, content: bytes) -> None:
    running = make_gateway()
    assert_openai_400(raw_post(running, content))
    assert running.fake.calls == 0


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"stream_options": "x"}, "stream_options"),
        ({"stream_options": [1]}, "stream_options"),
        ({"stream": True, "stream_options": "x"}, "stream_options"),
        ({"seed": BIG}, "seed"),
        ({"max_tokens": BIG}, "max_tokens"),
        ({"n": BIG}, "n"),
        ({"infercache": "not an object"}, "infercache"),
        ({"infercache": {"ttl_s": -5}}, "infercache.ttl_s"),
        ({"infercache": {"tenant": {"a": 1}}}, "infercache.tenant"),
        ({"messages": "hi"}, "messages"),
        ({"model": None}, "model"),
    ],
)
def test_out_of_range_fields_are_400(
    make_gateway: MakeGateway, fields: dict[str, Any], param: str | None
) -> None:
    running = make_gateway()
    with running.client() as client:
        response = client.post("/v1/chat/completions", json={**body(), **fields})
    error = assert_openai_400(response)
    if param is not None:
        assert error["param"] == param
    assert running.fake.calls == 0
    assert running.exact()["counters"].get("stored", 0) == 0


def test_an_unknown_huge_integer_field_is_passed_on_not_a_500(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    with running.client() as client:
        response = client.post("/v1/chat/completions", json={**body(), "x_custom": BIG})
    assert response.status_code == 200
    assert running.fake.calls == 1


@pytest.mark.parametrize(
    "value", ["max-age=²".encode(), b"max-age=-1", b"max-age=1e3", b"max-age="]
)
def test_a_malformed_max_age_is_400(make_gateway: MakeGateway, value: bytes) -> None:
    running = make_gateway()
    with running.client() as client:
        headers = {"cache-control": value}
        response = client.post("/v1/chat/completions", json=body(), headers=headers)
    assert_openai_400(response)


def test_a_huge_max_age_means_2_to_the_31_seconds_as_http_says(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    with running.client() as client:
        headers = {"cache-control": "max-age=" + "9" * 400}
        first = client.post("/v1/chat/completions", json=body(), headers=headers)
        second = client.post("/v1/chat/completions", json=body(), headers=headers)
    assert (first.status_code, second.headers["x-infercache"]) == (200, "exact-hit")


def test_headers_over_64_kb_are_431(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    with running.client() as client:
        big = client.post("/v1/chat/completions", json=body(), headers={"x-big": "a" * 70_000})
        many = client.post(
            "/v1/chat/completions",
            json=body(),
            headers={f"x-h{i}": "b" * 1000 for i in range(80)},
        )
    for response in (big, many):
        assert response.status_code == 431
        assert response.json()["error"]["code"] == "request_header_fields_too_large"
    assert running.fake.calls == 0
    with running.client() as client:  # and the gateway serves on
        assert client.post("/v1/chat/completions", json=body()).status_code == 200
        # Just under the bound, over many fields: served (the bound counts fields exactly).
        under = {f"x-h{i}": "c" * 990 for i in range(60)}
        assert client.post("/v1/chat/completions", json=body(), headers=under).status_code == 200


def test_a_500_closes_the_connection_and_the_client_goes_on(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    cache = running.built.cache
    real_begin = cache.begin

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("an unforeseen bug")

    cache.begin = broken  # type: ignore[method-assign]
    with running.client() as client:  # one client, one keep-alive connection
        failed = client.post("/v1/chat/completions", json=body())
        assert failed.status_code == 500
        assert failed.headers["connection"] == "close"
        assert "unforeseen" not in failed.text
        cache.begin = real_begin  # type: ignore[method-assign]
        assert client.post("/v1/chat/completions", json=body()).status_code == 200


def test_a_32_mb_header_is_refused_after_the_first_64_kb(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    host, port = running.url.removeprefix("http://").split(":")
    sent = 0
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: ")
        stopped: OSError | None = None
        try:
            while sent < 32 << 20:
                sock.sendall(b"a" * 65536)
                sent += 65536
        except OSError as exc:  # the server answered and closed while we were still sending
            stopped = exc
        reply = sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 431 ")
    assert stopped is not None
    assert sent < 8 << 20  # refused long before the whole header was sent


def test_a_header_control_beside_a_malformed_body_control_is_a_400(
    make_gateway: MakeGateway,
) -> None:
    """Found by the fuzz suite: merging the header's flags into `[null]` crashed."""
    running = make_gateway()
    payload = {**body(), "infercache": {"cache_control": [None]}}
    with running.client() as client:
        response = client.post(
            "/v1/chat/completions", json=payload, headers={"cache-control": "no-cache"}
        )
    assert_openai_400(response)
