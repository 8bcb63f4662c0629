"""Warm restart of the real CLI (acceptance 2's behaviour): `infercache engine serve` with a disk
tier, stopped with SIGTERM or killed with SIGKILL after answering, started again on the same
directory, serves the prefix from disk with the same answer. Blocks are written through as they
are computed, so neither stop has anything left to save."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness.processes import UVICORN_STARTED, start, stop
from tests.harness.servers import free_port

SYSTEM = "You are a helpful assistant. Answer the question briefly and politely. " * 4


@contextmanager
def engine_serve(tiny_dir: Path, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """`infercache engine serve` with a disk tier in tmp_path; (its URL, the process)."""
    port = free_port()
    args = [
        *("engine", "serve", "--model", str(tiny_dir), "--data-dir", str(tmp_path / "data")),
        *("--port", str(port), "--kv-disk-bytes", str(8 << 20), "--kv-block-tokens", "8"),
    ]
    process, _ = start(args, UVICORN_STARTED, on_stderr=True)
    try:
        yield f"http://127.0.0.1:{port}", process
    finally:
        stop(process)


def ask(base: str, model: str) -> dict[str, Any]:
    body = {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
        "temperature": 0,
        "max_tokens": 5,
    }
    response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


@pytest.mark.parametrize(
    ("stop_signal", "status"),
    [(signal.SIGTERM, 0), (signal.SIGKILL, -signal.SIGKILL)],
    ids=["SIGTERM", "SIGKILL"],
)
def test_an_engine_restarted_on_its_directory_serves_its_prefixes_from_disk(
    tiny_dir: Path, tmp_path: Path, stop_signal: signal.Signals, status: int
) -> None:
    with engine_serve(tiny_dir, tmp_path) as (base, process):
        first = ask(base, tiny_dir.name)
        process.send_signal(stop_signal)
        assert process.wait(30) == status
    with engine_serve(tiny_dir, tmp_path) as (base, process):
        second = ask(base, tiny_dir.name)
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        process.terminate()
        assert process.wait(30) == 0
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= len(SYSTEM) // 4  # the system prompt's whole blocks, at least
    assert cached % 8 == 0
    assert second["choices"] == first["choices"]
    disk_hits = 'infercache_prefix_cache_tier_hits_total{strategy="prefix",tier="disk"}'
    assert f"{disk_hits} {float(cached)}" in metrics
