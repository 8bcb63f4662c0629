"""The bridges from the engine's worker thread to a streaming consumer.

The worker sends a request's `StreamEvent`s through an `emit` callback, in this order: the
response metadata, text deltas, then the result; an error may come at any point and ends the
stream. `sync_chunks` reads them from a thread-safe queue (for a caller's thread);
`async_chunks` from an asyncio queue fed with `call_soon_threadsafe` (for an event loop). Both
submit the request at the call, so a refusal (a full queue: `OverloadedError`) raises there,
before the caller has promised anything to its own client; both translate the events into
`chat.completion.chunk` dicts (`text_completion` ones for a legacy request) with
`responses.ChunkStream`, and both cancel the request when the consumer stops early (the
iterator is closed or garbage collected, or the asyncio task is cancelled).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from typing import Any

from infercache.engine.openai_api import PreparedChat
from infercache.engine.responses import ChunkStream, ResponseMeta
from infercache.engine.sequence import GenerationResult
from infercache.errors import InfercacheError

StreamEvent = ResponseMeta | str | GenerationResult | InfercacheError
Emit = Callable[[StreamEvent], None]
# Queues a prepared request on the worker: (request, emit, cancel) → its future.
Submit = Callable[[PreparedChat, Emit, threading.Event], "Future[Any]"]


def sync_chunks(prepared: PreparedChat, submit: Submit) -> Iterator[dict[str, Any]]:
    events: queue.SimpleQueue[StreamEvent] = queue.SimpleQueue()
    cancel = threading.Event()
    submit(prepared, events.put, cancel)
    chunks = _sync_chunks(events, cancel, prepared)
    weakref.finalize(chunks, cancel.set)  # dropped without being read to the end
    return chunks


def _sync_chunks(
    events: queue.SimpleQueue[StreamEvent], cancel: threading.Event, prepared: PreparedChat
) -> Iterator[dict[str, Any]]:
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


def async_chunks(prepared: PreparedChat, submit: Submit) -> AsyncIterator[dict[str, Any]]:
    """Call from the event loop that will read the chunks."""
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[StreamEvent] = asyncio.Queue()
    cancel = threading.Event()

    def put(event: StreamEvent) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            cancel.set()

    submit(prepared, put, cancel)
    chunks = _async_chunks(events, cancel, prepared)
    weakref.finalize(chunks, cancel.set)
    return chunks


async def _async_chunks(
    events: asyncio.Queue[StreamEvent], cancel: threading.Event, prepared: PreparedChat
) -> AsyncIterator[dict[str, Any]]:
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


def _translate(
    event: StreamEvent, stream: ChunkStream | None, prepared: PreparedChat
) -> tuple[list[dict[str, Any]], ChunkStream | None]:
    if isinstance(event, InfercacheError):
        raise event
    if isinstance(event, ResponseMeta):
        stream = ChunkStream(event, include_usage=prepared.chat.include_usage)
        return stream.start(), stream
    if stream is None:
        raise ValueError("the worker must send the response metadata first")
    if isinstance(event, str):
        return [stream.content(event)], stream
    return stream.finish(event), stream
