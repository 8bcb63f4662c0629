"""Caching never silently stops: after the store restarts empty, after a version set from the
CLI in another process, and after an admin repair, answers are stored and served again."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from tests.conftest import start_redis
from tests.gateway.conftest import MakeGateway, Running, body
from tests.harness.processes import infercache_exe


def layer(running: Running, question: str) -> str:
    with running.client() as client:
        response = client.post("/v1/chat/completions", json=body(question))
    assert response.status_code == 200
    return response.headers["x-infercache"]


def seconds_until_a_hit(running: Running, question: str, deadline_s: float) -> float:
    """Ask the same question until it is an exact hit; how long that took."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        if layer(running, question) == "exact-hit":
            return time.monotonic() - started
    raise AssertionError(f"no exact hit within {deadline_s} s")


def test_hits_resume_within_5_s_after_redis_restarts_empty(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    with start_redis(tmp_path / "first") as first:
        port = first.port
        running = make_gateway(store_url=first.url())
        assert layer(running, "q1") == "miss"
        assert layer(running, "q1") == "exact-hit"
        first.process.kill()
        first.process.wait(10)
        assert layer(running, "q1") == "miss"  # down: answered, not cached
    with start_redis(tmp_path / "second", port=port):  # back, and empty
        recovered_s = seconds_until_a_hit(running, "q2", deadline_s=5.0)
        assert layer(running, "q1") == "miss"  # what the empty store lost is fetched again
        assert layer(running, "q1") == "exact-hit"
    assert recovered_s < 5.0
    stored = running.exact()["counters"]["stored"]
    assert stored >= 3  # q1 before, q2 and q1 after the restart


def test_a_version_set_from_the_cli_takes_effect_and_caching_goes_on(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'shared.db'}"
    running = make_gateway(store_url=store)
    assert layer(running, "q") == "miss"
    assert layer(running, "q") == "exact-hit"
    subprocess.run(
        [infercache_exe(), "set-model-version", "--store", store, "test-model", "v-from-cli"],
        check=True,
        capture_output=True,
    )
    assert layer(running, "q") == "miss"  # the old entry is retired at once
    assert layer(running, "q") == "exact-hit"  # and the new answer was stored
    assert layer(running, "other") == "miss"
    assert layer(running, "other") == "exact-hit"


def test_an_admin_version_always_reaches_the_store(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'shared.db'}"
    running = make_gateway(store_url=store, admin_token="adm")
    with httpx.Client(base_url=running.url, headers={"authorization": "Bearer adm"}) as admin:
        first = admin.post("/admin/model-version", json={"model": "m", "version": "v1"}).json()
        subprocess.run(
            [infercache_exe(), "set-model-version", "--store", store, "m", "v2"],
            check=True,
            capture_output=True,
        )
        again = admin.post("/admin/model-version", json={"model": "m", "version": "v1"}).json()
    assert first["changed"] is True
    assert again["changed"] is True  # the store said v2: v1 is written again, not assumed
