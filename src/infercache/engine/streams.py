"""The bridges from the engine's worker thread to a streaming consumer.

The worker sends a request's `StreamEvent`s through an `emit` callback, in this order: the
response metadata, text deltas, then the result; an error may come at any point and ends the
stream. `sync_chunks` reads them from a thread-safe queue (for a caller's thread);
`async_chunks` from an asyncio queue fed with `call_soon_threadsafe` (for an event loop). Both
translate them into `chat.completion.chunk` dicts with `openai_api.ChunkStream`, and both
cancel the request when the consumer stops early (the iterator is closed or garbage collected,
or the asyncio task is cancelled).
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from typing import Any

from infercache.engine.openai_api import ChunkStream, PreparedChat, ResponseMeta
from infercache.engine.runner import GenerationResult
from infercache.errors import InfercacheError

StreamEvent = ResponseMeta | str | GenerationResult | InfercacheError
Emit = Callable[[StreamEvent], None]
# Queues a prepared request on the worker: (request, emit, cancel) → its future.
Submit = Callable[[PreparedChat, Emit, threading.Event], "Future[Any]"]


def sync_chunks(prepared: PreparedChat, submit: Submit) -> Iterator[dict[str, Any]]:
    events: queue.SimpleQueue[StreamEvent] = queue.SimpleQueue()
    cancel = threading.Event()
    future = submit(prepared, events.put, cancel)
    try:
        stream: ChunkStream | None = None
        while True:
            event = events.get()
            chunks, stream = _translate(event, stream, prepared)
            yield from chunks
            if isinstance(event, GenerationResult):
                return
    finally:
        cancel.set()
        future.cancel()


async def async_chunks(prepared: PreparedChat, submit: Submit) -> AsyncIterator[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[StreamEvent] = asyncio.Queue()
    cancel = threading.Event()

    def put(event: StreamEvent) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            cancel.set()

    future = submit(prepared, put, cancel)
    try:
        stream: ChunkStream | None = None
        while True:
            event = await events.get()
            chunks, stream = _translate(event, stream, prepared)
            for chunk in chunks:
                yield chunk
            if isinstance(event, GenerationResult):
                return
    finally:
        cancel.set()
        future.cancel()


def _translate(
    event: StreamEvent, stream: ChunkStream | None, prepared: PreparedChat
) -> tuple[list[dict[str, Any]], ChunkStream | None]:
    if isinstance(event, InfercacheError):
        raise event
    if isinstance(event, ResponseMeta):
        stream = ChunkStream(event, include_usage=prepared.chat.include_usage)
        return [stream.role()], stream
    if stream is None:
        raise ValueError("the worker must send the response metadata first")
    if isinstance(event, str):
        return [stream.content(event)], stream
    return stream.finish(event), stream
