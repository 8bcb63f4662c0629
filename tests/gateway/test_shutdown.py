"""`infercache serve` stopping: the cache is closed once the server has drained, so what the
store holds only in memory (SQLite's recency of hits, written in batches) reaches the file."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx

from tests.gateway.conftest import body
from tests.harness.processes import start, stop
from tests.harness.servers import free_port


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
    with closing(sqlite3.connect(store)) as db:
        last_access, created_at = db.execute(
            "SELECT last_access, created_at FROM entries"
        ).fetchone()
    assert last_access >= created_at  # the hit's recency, written on the way out
