"""The wrapped client's own `send` as the Source of the one miss protocol (miss_flight.py): how a
miss of the wrapped client reaches the provider, from a thread (`SyncSend`) or an event loop
(`AsyncSend`). The protocol does the rest: one call per key in flight, the readers, the store.

    fetch(miss, sink):
      not streaming: the request, directives stripped, sent as is (the answer comes whole: a
                     streaming reader of the same key in flight replays it)
      streaming:     sent with `stream_options.include_usage` (the stored answer needs its
                     usage; each reader gets it only if it asked); the SSE bytes read into
                     chunks (sse_streams.StreamRecorder), each published as it comes
      an error status, or a body that is not a JSON object: `UpstreamStatus` carrying the
      upstream's response, which every reader returns as it came (the SDK raises as usual)
    `response`: the upstream's own response to this caller's request, when it led the flight
    (a non-streaming answer is that response itself, its headers included)
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from infercache.completion import Response
from infercache.miss import Miss
from infercache.miss_flight import ChunkSink, Fetched
from infercache.openai.sse_streams import StreamRecorder

Send = Callable[[Any, bool], Any]  # (request, stream) → response
ASend = Callable[[Any, bool], Awaitable[Any]]


class UpstreamStatus(Exception):
    """The upstream answered with an error status: its response goes back as it came."""

    def __init__(self, response: Any) -> None:
        super().__init__(response.status_code)
        self.response = response


def answer_of(response: Any) -> dict[str, Any]:
    """The upstream's answer, or its response handed back as it came: an error status, or a
    body that is not a JSON object (the SDK reports it as it would without the cache)."""
    if response.status_code != 200:
        raise UpstreamStatus(response)
    try:
        answer = response.json()
    except ValueError:
        raise UpstreamStatus(response) from None
    if not isinstance(answer, dict):
        raise UpstreamStatus(response)
    return answer


def _body(miss: Miss) -> dict[str, Any]:
    body = dict(miss.request.body)
    if miss.request.stream:
        body["stream_options"] = {"include_usage": True}
    return body


class SyncSend:
    def __init__(self, forward: Callable[[dict[str, Any]], Any], send: Send) -> None:
        self._forward = forward  # body → the request to send (CachingRouter.forward)
        self._send = send
        self.response: Any = None

    def call(self, body: dict[str, Any]) -> Response:
        """One non-streaming call (the embeddings' upstream too)."""
        self.response = self._send(self._forward(body), False)
        return answer_of(self.response)

    def fetch(self, miss: Miss, sink: ChunkSink) -> Fetched:
        if not miss.request.stream:
            return Fetched(self.call(_body(miss)))
        self.response = response = self._send(self._forward(_body(miss)), True)
        if response.status_code != 200:
            response.read()
            raise UpstreamStatus(response)
        recorder = StreamRecorder()
        with contextlib.closing(response):
            for data in response.iter_bytes():
                sink.publish(*recorder.feed(data))
        return Fetched(recorder.answer())


class AsyncSend:
    def __init__(self, forward: Callable[[dict[str, Any]], Any], send: ASend) -> None:
        self._forward = forward
        self._send = send
        self.response: Any = None

    async def call(self, body: dict[str, Any]) -> Response:
        self.response = await self._send(self._forward(body), False)
        return answer_of(self.response)

    async def fetch(self, miss: Miss, sink: ChunkSink) -> Fetched:
        if not miss.request.stream:
            return Fetched(await self.call(_body(miss)))
        self.response = response = await self._send(self._forward(_body(miss)), True)
        if response.status_code != 200:
            await response.aread()
            raise UpstreamStatus(response)
        recorder = StreamRecorder()
        try:
            async for data in response.aiter_bytes():
                sink.publish(*recorder.feed(data))
        finally:
            await response.aclose()
        return Fetched(recorder.answer())

    def observe(self, miss: Miss, response: Response) -> None:
        return None
