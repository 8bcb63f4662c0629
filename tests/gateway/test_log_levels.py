"""What a client caused is not a WARNING in the operator's log: an `only-if-cached` miss (504),
a refused request (4xx), an upstream's 4xx. A fault on our side still is (issue 26 item 8;
the model-version line is gateway/versions.py's own)."""

from __future__ import annotations

import logging

import pytest

from tests.gateway.conftest import MakeGateway, body

NOT_OURS = {"infercache.gateway.versions"}  # its first-request line: issue 29


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        f"{r.name}: {r.getMessage()}"
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name not in NOT_OURS
    ]


def test_client_conditions_are_not_warnings(
    make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    running = make_gateway()
    caplog.set_level(logging.INFO)
    with running.client() as client:
        only_cached = client.post(
            "/v1/chat/completions",
            json=body("never asked"),
            headers={"cache-control": "only-if-cached"},
        )
        bad = client.post("/v1/chat/completions", json={"model": "m"})
        running.fake.fail_status = 401
        refused = client.post("/v1/chat/completions", json=body("refused upstream"))
        running.fake.fail_status = 429
        limited = client.post("/v1/chat/completions", json=body("rate limited"))
    statuses = [r.status_code for r in (only_cached, bad, refused, limited)]
    assert statuses == [504, 400, 401, 429]
    assert _warnings(caplog) == []
    assert any("only-if-cached" in r.getMessage() for r in caplog.records)  # at INFO


def test_a_fault_of_ours_is_still_a_warning(
    make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    running = make_gateway()
    caplog.set_level(logging.INFO)
    running.fake.fail_status = 503
    with running.client() as client:
        assert client.post("/v1/chat/completions", json=body("down")).status_code == 503
    assert any("request failed" in w for w in _warnings(caplog))
