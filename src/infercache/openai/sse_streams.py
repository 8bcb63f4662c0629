"""Server-sent events both ways for the wrapped client: an upstream's SSE bytes read into chunks
(`StreamRecorder`), and a flight's chunks written as the SSE bytes a client reads (`FlightBytes`,
`AsyncFlightBytes`: the byte streams of both HTTP libraries the SDK accepts).

Reading follows the SSE framing: `data:` lines (one leading space dropped) joined until a blank
line ends the event; other fields and comments are ignored; bytes may split anywhere. An event
that is an error, or not a JSON object, raises `UpstreamError` carrying it. The answer
(`answer()`) exists only when the stream ended properly: `[DONE]` arrived and every choice got a
finish_reason; anything else is cut off (`UpstreamAbortedError`): never stored.

Writing passes each chunk as the client asked (usage only with `stream_options.include_usage`,
chat.for_client), then `[DONE]`. A stream the upstream cut off ends as it did, without
`[DONE]`; an upstream's error event is passed on; anything else is raised to the reader.
Closing the byte stream leaves the flight (the last reader to leave ends its fetch).
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import Any

import httpx
import httpx2

from infercache.chat import SSE_DONE, CompletionAssembler, StreamChunk, for_client, sse_event
from infercache.errors import UpstreamAbortedError, UpstreamError


class StreamRecorder:
    """Reads an upstream's SSE bytes into chunks and folds them into one completion."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._assembler = CompletionAssembler()
        self._done = False

    def feed(self, data: bytes) -> list[StreamChunk]:
        """The chunks `data` completes, in order."""
        self._buffer += data
        chunks: list[StreamChunk] = []
        while True:
            line, newline, rest = self._buffer.partition(b"\n")
            if not newline:
                return chunks
            self._buffer = rest
            chunk = self._line(line.rstrip(b"\r"))
            if chunk is not None:
                chunks.append(chunk)

    def _line(self, line: bytes) -> StreamChunk | None:
        if line.startswith(b"data:"):
            self._data.append(line[5:].removeprefix(b" "))
        elif not line and self._data:  # a blank line ends an event
            payload, self._data = b"\n".join(self._data), []
            return self._event(payload)
        return None

    def _event(self, payload: bytes) -> StreamChunk | None:
        if self._done or payload.strip() == b"[DONE]":
            self._done = True
            return None
        try:
            chunk = json.loads(payload)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            raise UpstreamError("the upstream streamed an event that is not a JSON object")
        if chunk.get("error") is not None:
            raise UpstreamError("the upstream streamed an error", body=chunk)
        self._assembler.add(chunk)
        return chunk

    @property
    def ended(self) -> bool:
        """`[DONE]` arrived: nothing the stream sends after it can change the answer."""
        return self._done

    def answer(self) -> dict[str, Any]:
        if not (self._done and self._assembler.complete):
            raise UpstreamAbortedError("the upstream stream ended before its answer did")
        return self._assembler.result()


def _events(chunks: Iterator[StreamChunk], include_usage: bool) -> Iterator[bytes]:
    try:
        for chunk in chunks:
            out = for_client(chunk, include_usage)
            if out is not None:
                yield sse_event(out)
    except UpstreamAbortedError:  # cut off upstream: the stream ends as it did
        return
    except UpstreamError as exc:  # an error event: passed on
        yield sse_event(exc.to_openai())
        return
    yield SSE_DONE


class FlightBytes(httpx.SyncByteStream, httpx2.SyncByteStream):
    """A flight's chunks (MissFlight.iter_chunks) as a client's SSE bytes."""

    def __init__(self, chunks: Generator[StreamChunk, None, None], include_usage: bool) -> None:
        self._chunks = chunks
        self._include_usage = include_usage

    def __iter__(self) -> Iterator[bytes]:
        return _events(self._chunks, self._include_usage)

    def close(self) -> None:
        self._chunks.close()


class AsyncFlightBytes(httpx.AsyncByteStream, httpx2.AsyncByteStream):
    """A flight's chunks (MissFlight.chunks) as a client's SSE bytes."""

    def __init__(self, chunks: AsyncGenerator[StreamChunk, None], include_usage: bool) -> None:
        self._chunks = chunks
        self._include_usage = include_usage

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._chunks:
                out = for_client(chunk, self._include_usage)
                if out is not None:
                    yield sse_event(out)
        except UpstreamAbortedError:
            return
        except UpstreamError as exc:
            yield sse_event(exc.to_openai())
            return
        yield SSE_DONE

    async def aclose(self) -> None:
        await self._chunks.aclose()
