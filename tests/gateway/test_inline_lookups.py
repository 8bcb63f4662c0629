"""The gateway looks up on its event loop when the store cannot make it wait (SQLite, memory),
and retries off the loop when it would (stores.base.InlineReads): a real gateway on loopback,
a real SQLite file locked by a real second process."""

from __future__ import annotations

from pathlib import Path

from tests.gateway.conftest import MakeGateway, body
from tests.stores.test_inline_reads import exclusively_locked


def test_the_gateway_serves_through_a_lock_by_retrying_off_the_loop(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    db = tmp_path / "gateway.db"
    running = make_gateway(store_url=f"sqlite:///{db}", store_budget_s=0.2)
    gateway = running.built.gateway
    with running.client() as client:
        # Locked before the gateway's first lookup opened the file (the lock needs it alone).
        with exclusively_locked(db):
            during = client.post("/v1/chat/completions", json=body())
        assert during.status_code == 200, during.text
        assert during.headers["x-infercache"] == "miss"  # the store was skipped, not waited on
        assert gateway.lookups_retried_off_loop == 1
        assert running.exact()["misses"]["store_error"] >= 1
        stored = client.post("/v1/chat/completions", json=body())
        assert stored.headers["x-infercache"] == "miss"  # nothing was stored under the lock
        hit = client.post("/v1/chat/completions", json=body())
        assert hit.headers["x-infercache"] == "exact-hit"
    assert gateway.lookups_retried_off_loop == 1  # read on the loop once the lock was gone
