"""A port already in use is reported at once, before any model loads, by `serve` and `engine
serve` alike (listen.py; issue 26 item 10)."""

from __future__ import annotations

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
