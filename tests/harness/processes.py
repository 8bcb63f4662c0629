"""Real `infercache` processes for end-to-end tests: started exactly as a user starts them, and
waited on through their own output (no polling, no sleeping). `engine_server(args)` is the
engine's OpenAI server (`infercache engine serve`) on a free loopback port, its stderr drained
while it runs so its log never fills the pipe."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from tests.harness.servers import free_port

UVICORN_STARTED = "Uvicorn running on"


def infercache_exe() -> str:
    exe = shutil.which("infercache", path=str(Path(sys.executable).parent))
    assert exe is not None
    return exe


def wait_for_line(stream: IO[str], marker: str, process: subprocess.Popen[str]) -> str:
    """Block on the process's own output until a line holds `marker`; return that line."""
    seen = []
    for line in stream:
        seen.append(line)
        if marker in line:
            return line
    raise AssertionError(f"exited with {process.wait()} before {marker!r}: {''.join(seen)}")


def start(
    args: list[str],
    marker: str,
    *,
    on_stderr: bool,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """`infercache ARGS...` running, once it printed `marker`; (the process, that line)."""
    process = subprocess.Popen(
        [infercache_exe(), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )
    stream = process.stderr if on_stderr else process.stdout
    assert stream is not None
    return process, wait_for_line(stream, marker, process)


def stop(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Terminate it (if it still runs) and close its pipes; (the rest of its stdout and
    stderr)."""
    if process.poll() is None:
        process.terminate()
    out, err = process.communicate(timeout=60)
    return out, err


@contextmanager
def engine_server(args: list[str], *, env: dict[str, str] | None = None) -> Iterator[str]:
    """`infercache engine serve ARGS... --port P`, yielding `http://127.0.0.1:P` once uvicorn
    says it runs; stopped with SIGTERM at the end, which it must take as a clean exit."""
    port = free_port()
    process, _ = start(
        ["engine", "serve", *args, "--port", str(port)], UVICORN_STARTED, on_stderr=True, env=env
    )
    pipes = [pipe for pipe in (process.stdout, process.stderr) if pipe is not None]
    drains = [threading.Thread(target=pipe.read, daemon=True) for pipe in pipes]
    for drain in drains:
        drain.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        assert process.wait(30) == 0
        for drain, pipe in zip(drains, pipes, strict=True):
            drain.join(10)
            pipe.close()


@contextmanager
def sqlite_lock_held(path: Path, *statements: str) -> Iterator[None]:
    """Another process opens the SQLite file at `path`, runs `statements` (the lock it takes)
    and holds on until the block ends."""
    script = "\n".join(
        [
            "import sqlite3, sys",
            f"c = sqlite3.connect({str(path)!r}, isolation_level=None)",
            *(f"c.execute({statement!r})" for statement in statements),
            "print('locked', flush=True)",
            "sys.stdin.read()",
        ]
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdin is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.stdin.close()
        holder.wait(10)
        holder.stdout.close()
