"""A port already in use is reported at once, before any model loads, by `serve` and `engine
serve` alike (listen.py; issue 26 item 10)."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from infercache.errors import ConfigError
from infercache.listen import bind_listener
from tests.harness.processes import infercache_exe


@pytest.mark.parametrize("command", [["serve"], ["engine", "serve"]])
def test_a_port_in_use_is_said_before_the_model_loads(command: list[str], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run(
            [infercache_exe(), *command, "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "INFERCACHE_DATA_DIR": str(tmp_path), "HF_HUB_OFFLINE": "1"},
        )
        took_s = time.monotonic() - started
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"infercache {' '.join(command)}: cannot listen on 127.0.0.1:{port}: the port is "
        "already in use (another server on it?); choose another with --port"
    )
    assert took_s < 5.0  # the engine alone loads in more; nothing was loaded


def test_a_bound_listener_is_handed_over_and_errors_name_the_address() -> None:
    with bind_listener("127.0.0.1", 0) as sock:
        sock.listen()  # as uvicorn's server does with it
        port = sock.getsockname()[1]
        in_use = re.escape(f"127.0.0.1:{port}: the port is already in use")
        with pytest.raises(ConfigError, match=in_use):
            bind_listener("127.0.0.1", port)
    with pytest.raises(ConfigError, match=re.escape("cannot listen on 203.0.113.9:80")):
        bind_listener("203.0.113.9", 80)  # not an address of this machine


def test_connections_to_a_bound_listener_have_nagle_off() -> None:
    """asyncio (so uvicorn) turns TCP_NODELAY on for an accepted connection only when the
    listening socket says TCP; without it each answer on a kept-alive connection waited ~40 ms
    for the client's delayed ACK."""

    async def accepted_nodelay() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                conn = transport.get_extra_info("socket")
                seen.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        sock = bind_listener("127.0.0.1", 0)
        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        async with server:
            _, writer = await asyncio.open_connection(*sock.getsockname())
            flag = await asyncio.wait_for(seen, 10)
            writer.close()
        return flag

    assert asyncio.run(accepted_nodelay()) != 0
