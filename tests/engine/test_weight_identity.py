"""The weight format is part of the model's identity (issue 28, acceptance 5): the served
version names it, and a gateway whose engine changes format on one store never serves the
other format's answers: each change is a miss answered by the engine, under its own version."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from infercache.engine.config import EngineConfig, WeightsName
from infercache.engine.weights import served_version
from infercache.settings import Settings
from tests.harness.engine_gateway import serve_engine_gateway
from tests.harness.processes import start, stop
from tests.harness.servers import free_port


def test_the_served_version_names_the_format_and_the_activation_dtype() -> None:
    versions = {
        served_version("fp_0123456789abcdef", weights, dtype)
        for weights in ("fp32", "fp16")
        for dtype in ("float32", "bfloat16")
    }
    assert versions == {
        "fp_0123456789abcdef-fp32",
        "fp_0123456789abcdef-fp16",
        "fp_0123456789abcdef-fp32-bfloat16",
        "fp_0123456789abcdef-fp16-bfloat16",
    }


@contextmanager
def gateway(store: Path, model: Path, weights: WeightsName) -> Iterator[tuple[str, str]]:
    """A gateway with the built-in engine in `weights`, over the SQLite store in `store`."""
    settings = Settings(
        data_dir=store, store_url=f"sqlite:///{store / 'cache.db'}", default_ttl_s=600
    )
    engine_config = EngineConfig(data_dir=store / "engine", model_path=model, weights=weights)
    with serve_engine_gateway(settings, engine_config) as (url, engine):
        yield url, engine.model_version


def ask(url: str, model: str) -> tuple[str, str, str]:
    """The cache's verdict, the answer's fingerprint and its text."""
    request: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "hello world"}],
        "temperature": 0,
        "max_tokens": 6,
    }
    with httpx.Client(base_url=url, timeout=60) as http:
        response = http.post("/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    answer = response.json()
    content = answer["choices"][0]["message"]["content"]
    return response.headers["x-infercache"], answer["system_fingerprint"], content


def test_swapping_the_format_on_one_store_never_serves_the_other_formats_answer(
    tmp_path: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = tiny_dir.name
    seen: dict[str, str] = {}
    formats: tuple[WeightsName, ...] = ("fp32", "fp16", "fp32")
    for weights in formats:
        with gateway(tmp_path, tiny_dir, weights) as (url, version):
            assert version.endswith(f"-{weights}")
            first, second = ask(url, model), ask(url, model)
        # A miss answered by this format's engine, then a hit on what it stored.
        assert first[:2] == ("miss", version), f"{weights}: {first}"
        assert second == ("exact-hit", version, first[2])
        seen.setdefault(weights, version)
        assert seen[weights] == version  # the same format keeps the same identity
    assert seen["fp32"] != seen["fp16"]


def test_engine_serve_names_the_format_in_its_ready_line_and_models(
    tiny_dir: Path, tmp_path: Path
) -> None:
    """`engine serve --weights fp32` (not the default): the ready line and /v1/models name
    the format and the version that carries it."""
    weights, port = "fp32", free_port()
    args = ["engine", "serve", "--model", str(tiny_dir), "--weights", weights]
    process, line = start(
        [*args, "--data-dir", str(tmp_path), "--port", str(port)],
        "infercache engine ready",
        on_stderr=False,
    )
    try:
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=30).json()["data"]
    finally:
        stop(process)
    [model] = models
    assert model["weights"] == weights
    assert model["version"].endswith(f"-{weights}")
    assert f"weights: {weights}; version: {model['version']}" in line
