"""Real redis-server processes for the store benches: one server, or a cluster of masters, on
free loopback ports in a temporary directory, stopped on exit. (tests/conftest.py does the
same for the tests, with pytest's failure reporting.)"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path


def _port(pair: bool) -> int:
    """A free port; with `pair`, one whose cluster bus port (+10000) is free too."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if not pair:
            return port
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port")


def _launch(args: list[str]) -> tuple[subprocess.Popen[str], threading.Thread]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (./run install)")
    process = subprocess.Popen([binary, *args], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if "Ready to accept connections" in line:
            break
    else:
        raise RuntimeError(f"redis-server exited with {process.wait()}")
    drain = threading.Thread(target=process.stdout.read, daemon=True)
    drain.start()
    return process, drain


def _args(port: int, workdir: Path) -> list[str]:
    return [
        "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir", str(workdir), "--maxmemory-policy", "volatile-lru",
    ]  # fmt: skip


@contextlib.contextmanager
def redis_servers(*, cluster_masters: int = 3) -> Iterator[tuple[str, str]]:
    """(a one-server URL, a cluster URL), both live until exit."""
    running: list[tuple[subprocess.Popen[str], threading.Thread]] = []
    with tempfile.TemporaryDirectory(prefix="infercache-bench-") as tmp:
        try:
            single = _port(pair=False)
            (Path(tmp) / "single").mkdir()
            running.append(_launch(_args(single, Path(tmp) / "single")))
            ports = [_port(pair=True) for _ in range(cluster_masters)]
            for port in ports:
                node = Path(tmp) / f"node-{port}"
                node.mkdir()
                running.append(
                    _launch([*_args(port, node), "--cluster-enabled", "yes",
                             "--cluster-config-file", "nodes.conf"])
                )  # fmt: skip
            nodes = [f"127.0.0.1:{p}" for p in ports]
            subprocess.run(
                ["redis-cli", "--cluster", "create", *nodes, "--cluster-replicas", "0",
                 "--cluster-yes"],
                capture_output=True, check=True, timeout=60,
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while not all(
                "cluster_state:ok"
                in subprocess.run(
                    ["redis-cli", "-p", str(p), "cluster", "info"], capture_output=True, text=True
                ).stdout
                for p in ports
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster did not come up")
            yield f"redis://127.0.0.1:{single}/0", "redis+cluster://" + ",".join(nodes)
        finally:
            for process, drain in running:
                process.terminate()
                process.wait(10)
                drain.join(10)


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """One redis-server's URL, live until exit."""
    with tempfile.TemporaryDirectory(prefix="infercache-bench-") as tmp:
        port = _port(pair=False)
        process, drain = _launch(_args(port, Path(tmp)))
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(10)
            drain.join(10)
