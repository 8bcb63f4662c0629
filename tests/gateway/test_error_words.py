"""Error texts a client reads say what was wrong in the API's words, never the parser's or
Python's: an empty body, a missing `model`, a value quoted as JSON (issue 26 item 9; the
context-length error naming `max_tokens`: tests/engine/test_server.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.conftest import MakeGateway

CHAT = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}


def _error(make_gateway: MakeGateway, path: str, **request: Any) -> dict[str, Any]:
    running = make_gateway()
    with running.client() as client:
        r = client.post(path, **request)
    assert r.status_code == 400, r.text
    error: dict[str, Any] = r.json()["error"]
    assert running.fake.calls == 0
    return error


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/embeddings"])
def test_an_empty_body_is_called_empty(make_gateway: MakeGateway, path: str) -> None:
    error = _error(make_gateway, path, content=b"", headers={"content-type": "application/json"})
    assert error["message"] == "the request body is empty: send a JSON object"


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/chat/completions", CHAT), ("/v1/embeddings", {"input": "hi"})],
)
def test_a_missing_model_is_called_missing(
    make_gateway: MakeGateway, path: str, body: dict[str, Any]
) -> None:
    error = _error(make_gateway, path, json=body)
    assert (error["message"], error["param"]) == ("Missing required parameter: 'model'.", "model")


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"model": 7}, "got 7"),
        ({"model": "m", "temperature": True}, "got true"),
        ({"model": "m", "temperature": "warm"}, 'got "warm"'),
        ({"model": "m", "infercache": {"tags": [None]}}, "got [null]"),
    ],
)
def test_values_are_quoted_as_json(
    make_gateway: MakeGateway, fields: dict[str, Any], shown: str
) -> None:
    error = _error(make_gateway, "/v1/chat/completions", json={**CHAT, **fields})
    assert error["message"].endswith(shown)
    for python in ("None", "True", "'warm'"):
        assert python not in error["message"]
