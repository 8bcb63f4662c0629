"""The request log names the upstream call a line made (issue 25 item 3): only the request
whose own call went upstream carries `upstream` and its `prompt_cache` usage; a waiter on the
same flight (a coalesced hit) carries neither, so the analyzer counts each call once, as
`/stats` does."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import MakeGateway, body
from tests.gateway.test_gateway import wait_until


@pytest.mark.parametrize("stream", [False, True])
def test_only_the_request_that_called_upstream_logs_the_call(
    make_gateway: MakeGateway, tmp_path: Path, stream: bool
) -> None:
    log = tmp_path / "requests.jsonl"
    running = make_gateway(request_log=log)
    running.fake.hold()
    payload = body("held", stream=stream)
    answers: list[httpx.Response] = []

    def ask() -> None:
        with running.client() as client:
            answers.append(client.post("/v1/chat/completions", json=payload))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(running, lambda stats: stats["waiting"] == 1)  # both on the one flight
    running.fake.release()
    for t in threads:
        t.join(30)
    assert running.fake.calls == 1
    running.built.gateway.request_log.close()  # type: ignore[union-attr]
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 2
    called = [line for line in lines if "upstream" in line]
    assert len(called) == 1
    (upstream,) = running.built.gateway.upstreams
    assert called[0]["upstream"] == upstream.name
    assert called[0]["prompt_cache"] == {
        "model": payload["model"],
        "input_tokens": called[0]["prompt_tokens"],
        "read_tokens": called[0]["cached_tokens"],
        "write_tokens": 0,
    }
    assert [line for line in lines if "prompt_cache" in line] == called
