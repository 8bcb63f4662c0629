"""Continuous batching through real HTTP servers on loopback, with a tiny random model:

- issue 14, acceptance 2: a streaming client that disconnects mid-answer has its sequence
  cancelled and its KV freed while the others are still decoding, and the others finish;
- acceptance 3: a burst of 32 against `infercache engine serve --max-queue 4` (the real CLI in a
  subprocess) gets some 429s with Retry-After in the OpenAI shape and no 5xx, and the engine
  serves again afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infercache.engine.config import EngineConfig
from infercache.engine.engine import Engine
from infercache.engine.server import create_app
from tests.harness.engine_requests import engine_chat
from tests.harness.processes import engine_server
from tests.harness.servers import serve

from .conftest import TinyFactory


def body(model: str, question: str, max_tokens: int, **fields: Any) -> dict[str, Any]:
    return engine_chat(model, question, max_tokens=max_tokens, **fields)


def events(lines: Iterator[str]) -> Iterator[dict[str, Any] | None]:
    """The SSE stream's chunks; None for `[DONE]`."""
    for line in lines:
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            yield None if data == "[DONE]" else json.loads(data)


@pytest.fixture
def long_engine(make_tiny_llama: TinyFactory, tmp_path: Path) -> Iterator[Engine]:
    directory = make_tiny_llama(seed=5, max_position_embeddings=2048)
    config = EngineConfig(
        data_dir=tmp_path, model_path=directory, max_context_tokens=2048, max_batch=4
    )
    with Engine(config) as engine:
        yield engine


@pytest.fixture
def served(long_engine: Engine) -> Iterator[str]:
    with serve(create_app(long_engine)) as url:
        yield f"{url}/v1/chat/completions"


def test_a_client_that_disconnects_frees_its_kv_at_once_and_the_others_finish(
    long_engine: Engine, served: str
) -> None:
    engine, model = long_engine, long_engine.model_id
    with httpx.Client(timeout=120) as http, contextlib.ExitStack() as stack:
        others = [
            stack.enter_context(
                http.stream(
                    "POST",
                    served,
                    json=body(
                        model,
                        f"other {i}",
                        1200,
                        stream=True,
                        stream_options={"include_usage": True},
                    ),
                )
            )
            for i in range(2)
        ]
        victim = http.stream("POST", served, json=body(model, "victim", 1800, stream=True))
        with victim as leaving:
            chunks = events(leaving.iter_lines())
            for _ in range(4):  # mid-answer
                assert next(chunks) is not None
            assert engine.stats()["running_sequences"] == 3
            reserved = engine.stats()["prefix"]["gauges"]["running_kv_tokens"]
        # The victim's connection is closed. Watch a neighbour's stream, chunk by chunk, until
        # the engine shows the victim gone: that must happen while the neighbour still decodes.
        watched = events(others[0].iter_lines())
        seen: list[dict[str, Any] | None] = []
        for chunk in watched:
            seen.append(chunk)
            gauges = engine.stats()["prefix"]["gauges"]  # recorded together after each step
            if gauges["running_sequences"] == 2:
                break
        assert seen[-1] is not None
        assert seen[-1]["choices"][0]["finish_reason"] is None, "the neighbour had finished"
        assert gauges["running_kv_tokens"] == reserved - (len_prompt(engine, "victim") + 1799)
        rests = [list(watched), list(events(others[1].iter_lines()))]
    for rest in rests:
        assert rest[-1] is None  # [DONE]
        usage = rest[-2]
        assert usage is not None
        assert usage["usage"]["completion_tokens"] == 1200
        assert rest[-3] is not None
        assert rest[-3]["choices"][0]["finish_reason"] == "length"
    assert engine.wait_idle(60)
    stats = engine.stats()
    assert (stats["running_sequences"], stats["queue_length"]) == (0, 0)
    assert stats["prefix_cache"]["locked_bytes"] == 0
    assert stats["prefix"]["gauges"]["running_kv_tokens"] == 0


def len_prompt(engine: Engine, question: str) -> int:
    return len(engine.tokenizer.encode_chat(body(engine.model_id, question, 1)["messages"]))


@pytest.fixture
def cli_server(tiny_dir: Path, tmp_path: Path) -> Iterator[str]:
    """`infercache engine serve --max-batch 2 --max-queue 4` on a tiny model, in a subprocess."""
    args = ["--model", str(tiny_dir), "--data-dir", str(tmp_path), "--max-batch", "2"]
    with engine_server([*args, "--max-queue", "4", "--max-step-tokens", "64"]) as url:
        yield url


def test_a_burst_over_the_queue_gets_429s_and_no_5xx_and_the_engine_recovers(
    cli_server: str, tiny_dir: Path
) -> None:
    model = tiny_dir.name

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=cli_server, timeout=120) as http:
            calls = [
                http.post("/v1/chat/completions", json=body(model, f"q{i}", 150, stream=i % 2 == 1))
                for i in range(32)
            ]
            return await asyncio.gather(*calls)

    responses = asyncio.run(burst())
    statuses = [r.status_code for r in responses]
    assert all(s < 500 for s in statuses), statuses
    assert set(statuses) == {200, 429}, statuses
    assert 6 <= statuses.count(200) < 32  # 2 running + 4 waiting at least, never all
    for r in responses:
        if r.status_code == 429:
            error = r.json()["error"]
            assert (error["type"], error["code"]) == ("rate_limit_error", "overloaded")
            assert r.headers["retry-after"] == "1"
    with httpx.Client(base_url=cli_server, timeout=120) as http:
        for i in range(3):  # recovered: served one after another
            r = http.post("/v1/chat/completions", json=body(model, f"after {i}", 5))
            assert r.status_code == 200
            assert r.json()["choices"][0]["finish_reason"] == "length"
        stats = http.get("/stats").json()
    assert (stats["queue_length"], stats["running_sequences"]) == (0, 0)
    assert (stats["config"]["max_queue"], stats["config"]["max_batch"]) == (4, 2)
