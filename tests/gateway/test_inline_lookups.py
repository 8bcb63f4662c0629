"""The gateway looks up and stores on its event loop when the store cannot make it wait (SQLite,
memory), and retries off the loop when it would (stores.base.InlineReads, InlineWrites): a real
gateway on loopback, a real SQLite file locked by a real second process."""

from __future__ import annotations

from pathlib import Path

import pytest

from infercache.gateway.service import Gateway
from tests.gateway.conftest import MakeGateway, Running, body
from tests.harness.processes import sqlite_lock_held
from tests.stores.test_inline_reads import exclusively_locked

SQLiteGateway = tuple[Path, Running, Gateway]


@pytest.fixture
def on_sqlite(make_gateway: MakeGateway, tmp_path: Path) -> SQLiteGateway:
    """A gateway on a SQLite file of its own (the file, the gateway running, and its service),
    whose busy timeout is its 0.2 s store budget."""
    db = tmp_path / "gateway.db"
    running = make_gateway(store_url=f"sqlite:///{db}", store_budget_s=0.2)
    return db, running, running.built.gateway


def test_the_gateway_serves_through_a_lock_by_retrying_off_the_loop(
    on_sqlite: SQLiteGateway,
) -> None:
    db, running, gateway = on_sqlite
    with running.client() as client:
        # Locked before the gateway's first lookup opened the file (the lock needs it alone).
        with exclusively_locked(db):
            during = client.post("/v1/chat/completions", json=body())
        assert during.status_code == 200, during.text
        assert during.headers["x-infercache"] == "miss"  # the store was skipped, not waited on
        assert gateway.store_io.reads_retried == 1
        assert running.exact()["misses"]["store_error"] >= 1
        stored = client.post("/v1/chat/completions", json=body())
        assert stored.headers["x-infercache"] == "miss"  # nothing was stored under the lock
        hit = client.post("/v1/chat/completions", json=body())
        assert hit.headers["x-infercache"] == "exact-hit"
    assert gateway.store_io.reads_retried == 1  # read on the loop once the lock was gone


def test_a_miss_is_stored_on_the_loop_and_off_it_while_another_process_writes(
    on_sqlite: SQLiteGateway,
) -> None:
    db, running, gateway = on_sqlite
    with running.client() as client:

        def ask(question: str) -> str:
            reply = client.post("/v1/chat/completions", json=body(question))
            assert reply.status_code == 200, reply.text
            return reply.headers["x-infercache"]

        assert ask("one") == "miss"
        assert ask("one") == "exact-hit"
        assert gateway.store_io.writes_retried == 0  # stored on the loop
        with sqlite_lock_held(db, "BEGIN IMMEDIATE"):  # a write lock; reads go on
            assert ask("two") == "miss"
            assert gateway.store_io.writes_retried == 1  # given to the pool, which waited
            assert running.exact()["counters"]["store_errors"] == 1  # its busy timeout out
            assert ask("one") == "exact-hit"  # looked up on the loop meanwhile
        assert ask("two") == "miss"  # nothing was stored under the lock
        assert ask("two") == "exact-hit"
    assert gateway.store_io.writes_retried == 1
    assert gateway.store_io.reads_retried == 0
