"""Shared fixtures: an injected clock, a counting upstream, request factories and a real
`redis-server` on loopback (started once per session, a unique key prefix per test)."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infercache.clock import ManualClock
from tests.harness.servers import free_port
from tests.harness.upstreams import CountingUpstream

_ids = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def upstream(clock: ManualClock) -> CountingUpstream:
    return CountingUpstream(clock)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    for _ in range(1000):
        port = free_port()
        if port + 10000 <= 65535 and _bindable(port + 10000):
            return port
    pytest.fail("no free port pair for a cluster node")


class RedisServer:
    def __init__(self, port: int, process: subprocess.Popen[str]) -> None:
        self.port = port
        self.process = process

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def _server_binary(name: str) -> str:
    binary = shutil.which(name)
    if binary is None:
        pytest.fail(f"{name} is not installed: run the tests with ./run test")
    return binary


def _launch(binary: str, args: list[str]) -> subprocess.Popen[str]:
    """Start a server and wait on its own readiness line: no polling, no sleeping."""
    process = subprocess.Popen([binary, *args], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if "Ready to accept connections" in line:
            return process
    pytest.fail(f"{binary} exited with {process.wait()}")


def _stop(process: subprocess.Popen[str], drain: threading.Thread) -> None:
    process.terminate()
    process.wait(10)
    drain.join(10)
    assert process.stdout is not None
    process.stdout.close()


def _drain(process: subprocess.Popen[str]) -> threading.Thread:
    """Keep reading a server's log so a full pipe can never block it."""
    assert process.stdout is not None
    drain = threading.Thread(target=process.stdout.read, daemon=True)
    drain.start()
    return drain


def _server_args(port: int, workdir: Path) -> list[str]:
    return [
        "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir", str(workdir), "--maxmemory", "256mb", "--maxmemory-policy", "volatile-lru",
    ]  # fmt: skip


@contextlib.contextmanager
def start_redis(
    workdir: Path, *, binary_name: str = "redis-server", port: int | None = None
) -> Iterator[RedisServer]:
    """A real redis-server (or `valkey-server`) on a loopback port (a free one unless given),
    stopped on exit."""
    binary = _server_binary(binary_name)
    port = free_port() if port is None else port
    process = _launch(binary, _server_args(port, workdir))
    drain = _drain(process)
    try:
        yield RedisServer(port, process)
    finally:
        _stop(process, drain)


def _cluster_is_ok(cli: str, ports: list[int]) -> bool:
    for port in ports:
        info = subprocess.run(
            [cli, "-p", str(port), "cluster", "info"], capture_output=True, text=True, check=True
        ).stdout
        if "cluster_state:ok" not in info:
            return False
    return True


class RedisClusterServers:
    """A real Redis Cluster of masters on loopback (no replicas), each node in its own
    directory so it can be restarted with its cluster config and no data."""

    def __init__(self, workdir: Path, ports: list[int], flavour: str, timeout_s: float) -> None:
        self.ports = ports
        self._workdir = workdir
        self._binary = _server_binary(f"{flavour}-server")
        self._cli = _server_binary(f"{flavour}-cli")
        self._timeout_s = timeout_s
        self._running: dict[int, tuple[subprocess.Popen[str], threading.Thread]] = {}

    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _start_node(self, port: int) -> None:
        node_dir = self._workdir / f"node-{port}"
        node_dir.mkdir(parents=True, exist_ok=True)
        args = [
            *_server_args(port, node_dir),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "5000",
        ]  # fmt: skip
        process = _launch(self._binary, args)
        self._running[port] = (process, _drain(process))

    def _create(self) -> None:
        for port in self.ports:
            self._start_node(port)
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(
            [self._cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
            check=True,
            timeout=self._timeout_s,
        )
        self.wait_ok()

    def wait_ok(self) -> None:
        """Until every node says `cluster_state:ok` (each poll a real request, a deadline)."""
        deadline = time.monotonic() + self._timeout_s
        while not _cluster_is_ok(self._cli, self.ports):
            assert time.monotonic() < deadline, f"cluster not ok within {self._timeout_s} s"
            for process, _ in self._running.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    pytest.fail(f"a cluster node exited with {process.wait(0.02)}")

    def restart_empty(self, port: int) -> None:
        """Stop one node and start it again: same slots (its nodes.conf), no data."""
        _stop(*self._running.pop(port))
        self._start_node(port)
        self.wait_ok()

    def stop(self) -> None:
        for process, drain in self._running.values():
            _stop(process, drain)
        self._running.clear()


@contextlib.contextmanager
def start_redis_cluster(
    workdir: Path, *, masters: int = 3, flavour: str = "redis", timeout_s: float = 30.0
) -> Iterator[RedisClusterServers]:
    """`masters` servers with `--cluster-enabled yes` on free ports, joined by
    `redis-cli --cluster create ... --cluster-replicas 0`, once every node says
    `cluster_state:ok`."""
    cluster = RedisClusterServers(
        workdir, [free_cluster_port() for _ in range(masters)], flavour, timeout_s
    )
    try:
        cluster._create()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on loopback for the session. `./run test` installs it."""
    with start_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A real 3-master Redis Cluster on loopback for the session."""
    with start_redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as cluster:
        yield cluster


def _require_valkey() -> None:
    if shutil.which("valkey-server") is None:
        pytest.skip("valkey-server is not installed (Debian: bookworm-backports valkey-server)")


@pytest.fixture(scope="session")
def valkey_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real valkey-server on loopback for the session."""
    _require_valkey()
    with start_redis(tmp_path_factory.mktemp("valkey"), binary_name="valkey-server") as server:
        yield server


@pytest.fixture(scope="session")
def valkey_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A real 3-master Valkey cluster on loopback for the session."""
    _require_valkey()
    workdir = tmp_path_factory.mktemp("valkey-cluster")
    with start_redis_cluster(workdir, flavour="valkey") as cluster:
        yield cluster


@pytest.fixture
def redis_prefix() -> str:
    return f"t{next(_ids)}-{id(object())}:"


MakeChat = Callable[..., dict[str, Any]]
