"""The in-process adapter the gateway calls: answers, chunks, and a full engine queue raised as
`OverloadedError` (a 429 with Retry-After) at the call, before any chunk."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infercache.engine.engine import Engine
from infercache.errors import OverloadedError
from infercache.gateway.engine_upstream import EngineUpstream


def body(engine: Engine, max_tokens: int = 4) -> dict[str, Any]:
    return {
        "model": engine.model_id,
        "messages": [{"role": "user", "content": "hello world"}],
        "temperature": 0,
        "max_tokens": max_tokens,
    }


def test_the_adapter_answers_streams_and_raises_overloaded_when_the_queue_is_full(
    make_engine: Callable[..., Engine], tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir, max_batch=1, max_queue=0, max_step_tokens=64)
    upstream = EngineUpstream(engine)

    async def run() -> None:
        answer = await upstream.complete(body(engine), tenant="t", api_key=None)
        assert answer["choices"][0]["finish_reason"] == "length"
        busy = upstream.stream(body(engine, 400), tenant="t", api_key=None)
        first = await anext(busy)
        assert first["choices"][0]["delta"]["role"] == "assistant"
        with pytest.raises(OverloadedError) as refused:
            upstream.stream(body(engine), tenant="u", api_key=None)
        assert refused.value.headers() == {"retry-after": "1"}
        with pytest.raises(OverloadedError):
            await upstream.complete(body(engine), tenant="u", api_key=None)
        await busy.aclose()  # the client left: cancelled

    asyncio.run(run())
    assert engine.wait_idle(30)
    assert engine.stats()["running_sequences"] == 0
