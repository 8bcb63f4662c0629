"""`infercache serve` stopping: the cache is closed once the server has drained, so what the
store holds only in memory (SQLite's recency of hits, written in batches) reaches the file."""

from __future__ import annotations

import json
import signal
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import body
from tests.harness.processes import start, stop, wait_for_line
from tests.harness.servers import free_port
from tests.harness.upstreams import FakeUpstream


def test_serve_writes_the_recency_of_its_hits_when_it_stops(
    fake: tuple[Any, str], tmp_path: Path
) -> None:
    _, upstream_url = fake
    store = tmp_path / "cache.db"
    port = free_port()
    process, _ = start(
        ["serve", "--port", str(port), "--store", f"sqlite:///{store}",
         "--upstream", f"{upstream_url}/v1"],
        "gateway ready",
        on_stderr=False,
        env={"INFERCACHE_DATA_DIR": str(tmp_path)},
    )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            assert (
                client.post("/v1/chat/completions", json=body()).headers["x-infercache"] == "miss"
            )
            with closing(sqlite3.connect(store, isolation_level=None)) as db:
                db.execute("UPDATE entries SET last_access = created_at - 3600")  # used long ago
            hit = client.post("/v1/chat/completions", json=body())
            assert hit.headers["x-infercache"] == "exact-hit"  # its recency is held in memory
    finally:
        _, err = stop(process)  # SIGTERM: uvicorn drains, then the gateway closes the cache
    assert "Traceback" not in err
    assert process.returncode == 0  # an ordinary exit
    with closing(sqlite3.connect(store)) as db:
        last_access, created_at = db.execute(
            "SELECT last_access, created_at FROM entries"
        ).fetchone()
    assert last_access >= created_at  # the hit's recency, written on the way out


def test_a_second_ctrl_c_cuts_what_is_in_flight_and_still_closes_cleanly(
    fake: tuple[FakeUpstream, str], tmp_path: Path
) -> None:
    """The first SIGINT drains and says so; the second cuts the stream still running: no
    traceback, the cut is said in one line, nothing of it is cached, and the application's
    shutdown still runs (the request log holds the cut request)."""
    upstream, upstream_url = fake
    upstream.hold()  # the stream stops after its first chunk
    store = tmp_path / "cache.db"
    request_log = tmp_path / "requests.jsonl"
    port = free_port()
    process, _ = start(
        ["serve", "--port", str(port), "--store", f"sqlite:///{store}",
         "--request-log", str(request_log), "--upstream", f"{upstream_url}/v1"],
        "gateway ready",
        on_stderr=False,
        env={"INFERCACHE_DATA_DIR": str(tmp_path)},
    )  # fmt: skip
    assert process.stderr is not None
    try:
        with (
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client,
            client.stream("POST", "/v1/chat/completions", json=body(stream=True)) as streamed,
        ):
            lines = streamed.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # in flight
            process.send_signal(signal.SIGINT)
            waiting = wait_for_line(process.stderr, "Ctrl-C again", process)
            assert "1 request(s) in flight" in waiting
            process.send_signal(signal.SIGINT)
            with pytest.raises(httpx.RemoteProtocolError):  # the cut stream ends unfinished
                list(lines)
        assert process.wait(30) == 0
    finally:
        _, err = stop(process)
    assert "Traceback" not in err, err
    assert "CancelledError" not in err, err
    assert "1 request(s) cut short" in err
    with closing(sqlite3.connect(store)) as db:
        assert db.execute("SELECT count(*) FROM entries").fetchone() == (0,)
    logged = [json.loads(line) for line in request_log.read_text().splitlines()]
    assert [entry["status"] for entry in logged] == [499]
