"""A Flight shares one upstream call between its subscribers and knows when it was cut off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from infercache.gateway.flight import Flight, FlightAborted


def chunk(content: str | None = None, finish: str | None = None) -> dict[str, Any]:
    delta = {"content": content} if content is not None else {}
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


class Producer:
    def __init__(self, pieces: list[str], *, finish: str | None = "stop") -> None:
        self.pieces = pieces
        self.finish = finish
        self.step = asyncio.Event()
        self.calls = 0
        self.cancelled = False

    async def __call__(self) -> AsyncIterator[dict[str, Any]]:
        self.calls += 1
        try:
            for piece in self.pieces:
                yield chunk(piece)
                await self.step.wait()
            if self.finish is not None:
                yield chunk(finish=self.finish)
        except asyncio.CancelledError:
            self.cancelled = True
            raise


class Outcome:
    def __init__(self) -> None:
        self.done: list[dict[str, Any]] = []
        self.aborted: list[BaseException | None] = []


def flight(producer: Producer, outcome: Outcome) -> Flight:
    return Flight(producer, on_done=outcome.done.append, on_abort=outcome.aborted.append)


async def collect(f: Flight) -> str:
    parts = [
        c["choices"][0]["delta"].get("content") or "" async for c in f.chunks() if c["choices"]
    ]
    return "".join(parts)


@pytest.mark.anyio
async def test_late_joiners_get_every_chunk_and_one_call_feeds_all() -> None:
    producer, outcome = Producer(["a", "b", "c"]), Outcome()
    f = flight(producer, outcome)
    f.start()
    early = asyncio.ensure_future(collect(f))
    await f.first_chunk.wait()
    late = asyncio.ensure_future(collect(f))
    waiter = asyncio.ensure_future(f.result())
    producer.step.set()
    assert await early == await late == "abc"
    assert (await waiter)["choices"][0]["message"]["content"] == "abc"
    assert producer.calls == 1
    assert len(outcome.done) == 1
    assert outcome.aborted == []


@pytest.mark.anyio
async def test_when_every_subscriber_leaves_the_upstream_is_cancelled_and_nothing_done() -> None:
    producer, outcome = Producer(["a", "b"]), Outcome()
    f = flight(producer, outcome)
    f.start()
    stream = f.chunks()
    await anext(stream)
    await stream.aclose()  # the only client hung up
    with pytest.raises(FlightAborted):
        await f.result()
    assert producer.cancelled
    assert outcome.done == []
    assert len(outcome.aborted) == 1


@pytest.mark.anyio
async def test_a_stream_without_finish_reason_is_aborted_not_done() -> None:
    producer, outcome = Producer(["a"], finish=None), Outcome()
    producer.step.set()
    f = flight(producer, outcome)
    f.start()
    with pytest.raises(FlightAborted):
        await collect(f)
    assert outcome.done == []
    assert len(outcome.aborted) == 1


@pytest.mark.anyio
async def test_an_upstream_error_reaches_every_subscriber() -> None:
    async def failing() -> AsyncIterator[dict[str, Any]]:
        raise RuntimeError("upstream refused")
        yield chunk("never")

    outcome = Outcome()
    f = Flight(failing, on_done=outcome.done.append, on_abort=outcome.aborted.append)
    f.start()
    await f.first_chunk.wait()
    assert isinstance(f.error_before_chunks, RuntimeError)
    with pytest.raises(RuntimeError):
        await f.result()
    assert outcome.done == []


@pytest.mark.anyio
async def test_a_non_streaming_call_is_kept_verbatim_and_replayed_as_chunks() -> None:
    response = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        "provider_extra": {"kept": True},
    }

    async def call() -> dict[str, Any]:
        return response

    outcome = Outcome()
    f = Flight(call=call, on_done=outcome.done.append, on_abort=outcome.aborted.append)
    f.start()
    assert await f.result() is response
    assert await collect(f) == "hi"
    assert outcome.done == [response]
