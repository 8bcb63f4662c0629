"""The library's upstream: a function from a chat-completions body (directives stripped) to a
response body, as the Source of the one miss protocol (miss_flight.py) — blocking for
`Cache.complete`, a coroutine function for `Cache.acomplete`. The answer comes whole: no chunk
is published (a streaming reader of the same key in flight replays it)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from infercache.completion import Response
from infercache.miss_flight import ChunkSink, Fetched
from infercache.request import ChatRequest


class ChatLease(Protocol):
    """What a function source needs of a lease: the request (a `Miss`, miss.py)."""

    @property
    def request(self) -> ChatRequest: ...


class FunctionSource:
    """The library's upstream for `Cache.complete`: a blocking function."""

    def __init__(self, fn: Callable[[dict[str, Any]], Response]) -> None:
        self._fn = fn

    def fetch(self, lease: ChatLease, sink: ChunkSink) -> Fetched:
        return Fetched(self._fn(dict(lease.request.body)))


class AsyncFunctionSource:
    """The library's upstream for `Cache.acomplete`: a coroutine function."""

    def __init__(self, fn: Callable[[dict[str, Any]], Awaitable[Response]]) -> None:
        self._fn = fn

    async def fetch(self, lease: ChatLease, sink: ChunkSink) -> Fetched:
        return Fetched(await self._fn(dict(lease.request.body)))

    def observe(self, lease: ChatLease, response: Response) -> None:
        return None
