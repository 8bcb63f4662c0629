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
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class ClusterOptions:
    """How a test cluster runs (see RedisClusterServers)."""

    replicas: int = 0
    full_coverage: bool = True
    node_timeout_ms: int = 5000
    persist: bool = False
    reads_when_down: bool = False
    fsync: str = "everysec"


class RedisClusterServers:
    """A real Redis Cluster on loopback: masters, and `replicas` replicas per master, each node
    in its own directory so it can be killed and restarted with its cluster config and no
    data (`persist`: with its append-only file). `full_coverage=False` is
    `cluster-require-full-coverage no` (what production should run: a dead master then fails
    only its own slots)."""

    def __init__(
        self,
        workdir: Path,
        ports: list[int],
        flavour: str,
        timeout_s: float,
        options: ClusterOptions,
    ) -> None:
        self.ports = ports
        self._workdir = workdir
        self._binary = _server_binary(f"{flavour}-server")
        self._cli = _server_binary(f"{flavour}-cli")
        self._timeout_s = timeout_s
        self._replicas = options.replicas
        self._options = [
            "--cluster-node-timeout", str(options.node_timeout_ms),
            "--cluster-require-full-coverage", "yes" if options.full_coverage else "no",
            "--repl-diskless-sync-delay", "0",  # a replica syncs at once (default: waits 5 s)
            # a killed node restarts with data (`fsync`: everysec, Redis' default, may lose the
            # last second or two of writes to a kill; always loses none)
            *(["--appendonly", "yes", "--appendfsync", options.fsync] if options.persist else []),
            # a node whose cluster state is not ok still serves reads on its slots
            *(["--cluster-allow-reads-when-down", "yes"] if options.reads_when_down else []),
        ]  # fmt: skip
        self._running: dict[int, tuple[subprocess.Popen[str], threading.Thread]] = {}

    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _start_node(self, port: int) -> None:
        node_dir = self._workdir / f"node-{port}"
        node_dir.mkdir(parents=True, exist_ok=True)
        args = [
            *_server_args(port, node_dir),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", *self._options,
        ]  # fmt: skip
        process = _launch(self._binary, args)
        self._running[port] = (process, _drain(process))

    def _create(self) -> None:
        for port in self.ports:
            self._start_node(port)
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        subprocess.run(
            [self._cli, "--cluster", "create", *nodes,
             "--cluster-replicas", str(self._replicas), "--cluster-yes"],
            capture_output=True, text=True, check=True, timeout=self._timeout_s,
        )  # fmt: skip
        self.wait_ok()

    def _cli_out(self, port: int, *command: str) -> str:
        return subprocess.run(
            [self._cli, "-p", str(port), *command], capture_output=True, text=True, check=True
        ).stdout

    def wait_ok(self) -> None:
        """Until every running node says `cluster_state:ok` and every running replica is in
        sync with its master (each poll a real request, a deadline)."""
        deadline = time.monotonic() + self._timeout_s
        while not (_cluster_is_ok(self._cli, list(self._running)) and self._replicas_synced()):
            assert time.monotonic() < deadline, f"cluster not ok within {self._timeout_s} s"
            for process, _ in self._running.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    pytest.fail(f"a cluster node exited with {process.wait(0.02)}")

    def _replicas_synced(self) -> bool:
        for port in self._running:
            info = self._cli_out(port, "info", "replication")
            if "role:slave" in info and "master_link_status:up" not in info:
                return False
        return True

    def wait_replicated(self) -> None:
        """Until every running replica has every write its master has acknowledged."""
        deadline = time.monotonic() + self._timeout_s
        while not all(self._in_step(port) for port in self.masters()):
            assert time.monotonic() < deadline, f"replicas behind after {self._timeout_s} s"

    def _in_step(self, master: int) -> bool:
        out = self._cli_out(master, "info", "replication")
        info = dict(line.strip().split(":", 1) for line in out.splitlines() if ":" in line)
        offset = info.get("master_repl_offset")
        return all(
            f"offset={offset}," in value for key, value in info.items() if key.startswith("slave")
        )

    def masters(self) -> list[int]:
        """Ports of the running nodes that are masters now (CLUSTER NODES of a live node)."""
        found = []
        for line in self._cli_out(next(iter(self._running)), "cluster", "nodes").splitlines():
            fields = line.split()
            port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
            if "master" in fields[2] and "fail" not in fields[2] and port in self._running:
                found.append(port)
        return sorted(found)

    def pid(self, port: int) -> int:
        return self._running[port][0].pid

    def kill(self, port: int) -> None:
        """SIGKILL one node, as a crash would (its data is lost unless `persist`)."""
        process, drain = self._running.pop(port)
        process.kill()
        process.wait(10)
        drain.join(10)
        assert process.stdout is not None
        process.stdout.close()

    def restart(self, port: int, *, wait: bool = True) -> None:
        """Start a killed node again (its nodes.conf: same id and slots; no data unless
        `persist`), until every node says `cluster_state:ok` (unless not `wait`)."""
        self._start_node(port)
        if wait:
            self.wait_ok()

    def cluster_state(self, port: int) -> str:
        """The node's own `cluster_state` (ok or fail)."""
        out = self._cli_out(port, "cluster", "info")
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if
                    line.startswith("cluster_state:"))  # fmt: skip

    def restart_empty(self, port: int) -> None:
        """Stop one node and start it again: same slots (its nodes.conf), no data."""
        _stop(*self._running.pop(port))
        self.restart(port)

    def stop(self) -> None:
        for process, drain in self._running.values():
            _stop(process, drain)
        self._running.clear()


@contextlib.contextmanager
def start_redis_cluster(
    workdir: Path,
    *,
    masters: int = 3,
    flavour: str = "redis",
    timeout_s: float = 30.0,
    **options: Any,
) -> Iterator[RedisClusterServers]:
    """`masters` servers (and `replicas` per master) with `--cluster-enabled yes` on free
    ports, joined by `redis-cli --cluster create ... --cluster-replicas N`, once every node
    says `cluster_state:ok` and every replica is in sync. `options`: ClusterOptions' fields."""
    chosen = ClusterOptions(**options)
    ports = [free_cluster_port() for _ in range(masters * (1 + chosen.replicas))]
    cluster = RedisClusterServers(workdir, ports, flavour, timeout_s, chosen)
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


@pytest.fixture(scope="session")
def fault_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A 3-master cluster for tests that kill a master (and restart it before they end), with
    `cluster-require-full-coverage no`."""
    workdir = tmp_path_factory.mktemp("fault-cluster")
    with start_redis_cluster(workdir, full_coverage=False) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def failover_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """3 masters with one replica each and a 1 s node timeout, for failover tests."""
    workdir = tmp_path_factory.mktemp("failover-cluster")
    with start_redis_cluster(
        workdir, replicas=1, full_coverage=False, node_timeout_ms=1000
    ) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def rejoin_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """3 masters as production should run them without replicas: `cluster-require-full-coverage
    no`, `cluster-allow-reads-when-down yes`, append-only files (a killed master comes back
    with its data; fsync always, so with a test's writes of a moment ago too)."""
    workdir = tmp_path_factory.mktemp("rejoin-cluster")
    with start_redis_cluster(
        workdir, full_coverage=False, persist=True, reads_when_down=True, fsync="always"
    ) as cluster:
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
