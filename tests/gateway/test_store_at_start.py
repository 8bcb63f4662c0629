"""A store that cannot be reached at start stops `serve` at once with one line naming the URL
(masked) and the cause; `--store-optional` starts degraded on purpose, says so in its ready
line and `/healthz`, and caches again once the store answers (stores/start_check.py,
gateway/health.py). Issue 26 item 2."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from infercache.clock import SystemClock
from infercache.errors import ConfigError, StoreError
from infercache.stores import open_store
from infercache.stores.base import Backend
from infercache.stores.start_check import StoreUnreachableError, check_at_start
from tests.conftest import free_port, start_redis
from tests.gateway.conftest import MakeGateway, body
from tests.harness.processes import infercache_exe, start, stop
from tests.harness.servers import serve
from tests.harness.upstreams import FakeUpstream


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "INFERCACHE_DATA_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1"}


def test_serve_refuses_a_store_nobody_listens_on_within_5_s(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    store = f"redis://:hunter2@127.0.0.1:{port}/0"
    started = time.monotonic()
    done = subprocess.run(
        [infercache_exe(), "serve", "--store", store, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(tmp_path),
    )
    took_s = time.monotonic() - started
    assert done.returncode == 2
    assert took_s < 5.0  # no --upstream: the engine would have loaded next; it never did
    (reason,) = [line for line in done.stderr.splitlines() if line.startswith("infercache serve:")]
    assert f"cannot reach the cache store redis://:***@127.0.0.1:{port}/0" in reason
    assert "Connection refused" in reason
    assert "--store-optional" in reason
    assert "hunter2" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    assert "ready" not in done.stdout


def test_serve_refuses_a_sqlite_path_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    done = subprocess.run(
        [infercache_exe(), "serve", "--store", f"sqlite:///{blocker}/cache.db"],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(tmp_path),
    )
    assert done.returncode == 2
    assert f"cannot reach the cache store sqlite:///{blocker}/cache.db" in done.stderr
    assert "File exists" in done.stderr  # mkdir of its folder failed: a file is there


def test_store_optional_starts_degraded_says_so_and_recovers(tmp_path: Path) -> None:
    """The README's reading of `/healthz`: degraded while the store does not answer, ok once it
    does, and entries stored again from then on; requests are served throughout."""
    fake = FakeUpstream()
    store_port, port = free_port(), free_port()
    args = ["serve", "--store", f"redis://127.0.0.1:{store_port}/0", "--store-optional"]
    args += ["--port", str(port)]
    with serve(fake.app) as upstream_url:
        process, ready = start(
            [*args, "--upstream", f"{upstream_url}/v1"],
            "gateway ready",
            on_stderr=False,
            env={"INFERCACHE_DATA_DIR": str(tmp_path)},
        )
        try:
            assert "unreachable: degraded, caching nothing until it answers" in ready
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                health = client.get("/healthz").json()
                assert health["status"] == "degraded"
                assert health["store"] == "unreachable"
                assert client.get("/health").json()["status"] == "degraded"
                for _ in range(2):  # served, not cached
                    r = client.post("/v1/chat/completions", json=body("while down"))
                    assert (r.status_code, r.headers["x-infercache"]) == (200, "miss")
                with start_redis(tmp_path, port=store_port):
                    assert _wait_for_ok(client)  # the breaker's probe: at most ~2 s
                    layers = [
                        client.post("/v1/chat/completions", json=body("after")).headers[
                            "x-infercache"
                        ]
                        for _ in range(2)
                    ]
                    assert layers == ["miss", "exact-hit"]
        finally:
            _, err = stop(process)
    assert "unreachable at start" in err
    assert "--store-optional" in err
    assert "Traceback" not in err


def _wait_for_ok(client: httpx.Client, deadline_s: float = 10.0) -> bool:
    """Health asked again until it says ok: each ask is one store probe, no sleeping."""
    started = time.monotonic()
    while time.monotonic() - started < deadline_s:
        if client.get("/healthz").json()["status"] == "ok":
            return True
    return False


def test_a_healthy_store_says_ok(make_gateway: MakeGateway) -> None:
    running = make_gateway()
    assert running.built.store is not None
    assert running.built.store.reachable
    with running.client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/health").json() == {"status": "ok"}


class _Flaky:
    """A store that fails its first `failures` reads, then answers."""

    def __init__(self, inner: Backend, failures: int) -> None:
        self.inner = inner
        self.url = inner.url
        self.failures = failures

    def read_meta(self, names: list[str]) -> dict[str, str]:
        if self.failures > 0:
            self.failures -= 1
            raise StoreError("connection refused")
        return self.inner.read_meta(names)


def _memory() -> Backend:
    return open_store("memory://", clock=SystemClock(), max_bytes=1 << 20)


def test_a_store_that_is_only_starting_gets_its_attempts() -> None:
    flaky = _Flaky(_memory(), failures=2)
    assert check_at_start(flaky, attempts=3).reachable  # type: ignore[arg-type]
    flaky = _Flaky(_memory(), failures=3)
    with pytest.raises(StoreUnreachableError, match="connection refused"):
        check_at_start(flaky, attempts=3)  # type: ignore[arg-type]
    flaky = _Flaky(_memory(), failures=3)
    found = check_at_start(flaky, attempts=3, optional=True)  # type: ignore[arg-type]
    assert (found.reachable, found.reason) == (False, "connection refused")


def test_a_refusing_check_is_never_optional() -> None:
    """A check for one kind of store (a Redis URL naming a cluster node, say) refuses with a
    ConfigError: not retried, and `optional` does not turn it into a degraded start."""
    calls = []

    def refuse(backend: Backend) -> None:
        calls.append(backend.url)
        raise ConfigError("that is a cluster node: use redis+cluster://")

    with pytest.raises(ConfigError, match="redis\\+cluster"):
        check_at_start(_memory(), optional=True, checks=[refuse])
    assert calls == ["memory://"]
