"""Shared fixtures: an injected clock, a counting upstream, request factories and a real
`redis-server` on loopback (started once per session, a unique key prefix per test)."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infercache.clock import ManualClock

_ids = itertools.count()


def chat(content: str = "What is the capital of France?", **fields: Any) -> dict[str, Any]:
    """A deterministic chat-completions request body."""
    body: dict[str, Any] = {
        "model": "test-model",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": content},
        ],
        "temperature": 0,
    }
    body.update(fields)
    return body


class CountingUpstream:
    """Stands in for a paid provider: answers deterministically from the request, counts calls,
    and takes `latency_s` on the injected clock. Thread-safe."""

    def __init__(
        self,
        clock: ManualClock,
        *,
        latency_s: float = 0.5,
        prompt_tokens: int = 20,
        completion_tokens: int = 8,
    ) -> None:
        self.clock = clock
        self.latency_s = latency_s
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.calls = 0
        self.bodies: list[dict[str, Any]] = []
        self.finish_reason: str | None = "stop"
        self._lock = threading.Lock()
        self.gate: threading.Event | None = None  # when set, calls block until it is set

    def response(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.calls += 1
            self.bodies.append(body)
            n = self.calls
        last = body["messages"][-1]["content"]
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"answer #{n} to {last}"},
                    "finish_reason": self.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
        }

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.gate is not None:
            assert self.gate.wait(30), "test gate never opened"
        self.clock.advance(self.latency_s)
        return self.response(body)

    async def acall(self, body: dict[str, Any]) -> dict[str, Any]:
        self.clock.advance(self.latency_s)
        return self.response(body)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def upstream(clock: ManualClock) -> CountingUpstream:
    return CountingUpstream(clock)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    def __init__(self, port: int, process: subprocess.Popen[str]) -> None:
        self.port = port
        self.process = process

    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


@contextlib.contextmanager
def start_redis(workdir: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free loopback port, stopped on exit."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed: run the tests with ./run test")
    port = free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--dir", str(workdir), "--maxmemory", "256mb", "--maxmemory-policy", "volatile-lru"]
    process = subprocess.Popen([binary, *args], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    # Wait on the server's own readiness line: no polling, no sleeping.
    for line in process.stdout:
        if "Ready to accept connections" in line:
            break
    else:
        pytest.fail(f"redis-server exited with {process.wait()}")
    # Keep draining its log so a full pipe can never block the server.
    drain = threading.Thread(target=process.stdout.read, daemon=True)
    drain.start()
    try:
        yield RedisServer(port, process)
    finally:
        process.terminate()
        process.wait(10)
        drain.join(10)
        process.stdout.close()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server on loopback for the session. `./run test` installs it."""
    with start_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture
def redis_prefix() -> str:
    return f"t{next(_ids)}-{id(object())}:"


MakeChat = Callable[..., dict[str, Any]]
