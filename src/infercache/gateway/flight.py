"""One upstream call shared by every identical request in flight, streaming or not.

A `Flight` runs its producer (an upstream stream, or a non-streaming call replayed as chunks)
in its own task and keeps every chunk it has produced. Subscribers iterate from the first chunk:
a late joiner gets the chunks so far at once, then the rest as they arrive. So one upstream
generation feeds a streaming leader, streaming waiters and non-streaming waiters (who only await
`result()`) alike.

A non-streaming leader makes a non-streaming upstream call (`Flight.of_call`): its response is
kept exactly as the upstream sent it and replayed as chunks to streaming waiters.

Lifetime: the producer runs while at least one party is interested. When the last one leaves
(every streaming client hung up and nobody awaits the result), the producer is cancelled: the
upstream stops generating and the cut-off answer is never stored. `on_done` receives the
assembled completion only when the stream finished complete (every choice has a finish_reason
and no error); otherwise `on_abort` runs. Exactly one of them runs, once.

Single event loop; not thread-safe (the gateway runs on one loop).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from infercache.chat import CompletionAssembler, chunks_from_completion
from infercache.errors import UpstreamError

log = logging.getLogger(__name__)

Chunk = dict[str, Any]


class FlightAborted(UpstreamError):
    """The shared upstream call ended without a complete answer (a 502 for those waiting)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status_code=502)


class Flight:
    def __init__(
        self,
        producer: Callable[[], AsyncIterator[Chunk]] | None = None,
        *,
        call: Callable[[], Awaitable[dict[str, Any]]] | None = None,
        on_done: Callable[[dict[str, Any]], None],
        on_abort: Callable[[BaseException | None], None],
    ) -> None:
        """Exactly one of `producer` (an upstream stream) or `call` (a non-streaming call)."""
        if (producer is None) == (call is None):
            raise ValueError("a Flight needs exactly one of producer or call")
        self._producer = producer
        self._call = call
        self._on_done = on_done
        self._on_abort = on_abort
        self._chunks: list[Chunk] = []
        self._changed = asyncio.Condition()
        self._finished = False
        self._error: BaseException | None = None
        self._response: dict[str, Any] | None = None
        self._interested = 0
        self._task: asyncio.Task[None] | None = None
        self.first_chunk = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def error_before_chunks(self) -> BaseException | None:
        """The error that ended the flight before it produced anything (an upstream refusal)."""
        if self._finished and not self._chunks:
            return self._error
        return None

    async def _run(self) -> None:
        assembler = CompletionAssembler()
        try:
            if self._call is not None:
                response = await self._call()
                for chunk in chunks_from_completion(response, include_usage=True):
                    await self._publish(chunk)
                self._response = response
                self._on_done(response)
                await self._close()
                return
            assert self._producer is not None
            async for chunk in self._producer():
                assembler.add(chunk)
                await self._publish(chunk)
        except asyncio.CancelledError:
            self._error = FlightAborted("every client left before the answer completed")
            self._on_abort(None)
            await self._close()
            raise
        except Exception as exc:  # noqa: BLE001 - kept and re-raised to every subscriber
            self._error = exc
            self._on_abort(exc)
            await self._close()
            return
        if assembler.complete:
            self._response = assembler.result()
            self._on_done(self._response)
        else:
            self._error = FlightAborted("the upstream stream ended without a finish_reason")
            self._on_abort(self._error)
        await self._close()

    async def _publish(self, chunk: Chunk) -> None:
        async with self._changed:
            self._chunks.append(chunk)
            self.first_chunk.set()
            self._changed.notify_all()

    async def _close(self) -> None:
        async with self._changed:
            self._finished = True
            self.first_chunk.set()
            self._changed.notify_all()

    def _join(self) -> None:
        self._interested += 1

    def _leave(self) -> None:
        self._interested -= 1
        if self._interested == 0 and not self._finished and self._task is not None:
            self._task.cancel()

    async def chunks(self) -> AsyncIterator[Chunk]:
        """Every chunk from the first; raises the producer's error, or FlightAborted."""
        self._join()
        try:
            i = 0
            while True:
                async with self._changed:
                    await self._changed.wait_for(
                        lambda seen=i: seen < len(self._chunks) or self._finished  # type: ignore[misc]
                    )
                    batch = self._chunks[i:]
                    finished = self._finished
                for chunk in batch:
                    yield chunk
                i += len(batch)
                if finished and i >= len(self._chunks):
                    break
            if self._error is not None:
                raise self._error
        finally:
            self._leave()

    async def result(self) -> dict[str, Any]:
        """The assembled completion; raises the producer's error, or FlightAborted."""
        self._join()
        try:
            async with self._changed:
                await self._changed.wait_for(lambda: self._finished)
        finally:
            self._leave()
        if self._error is not None:
            raise self._error
        assert self._response is not None
        return self._response
