"""The gateway's cached endpoints as adapters: what differs between `/v1/chat/completions` and
`/v1/completions` (and the endpoints to come) is a value here; the path a request takes
(service.py), the way a miss reaches the upstreams (replica_fetch.py) and the one miss protocol
(miss_flight.py) are the same for all.

    CachedEndpoint
      endpoint, operation         the request model's endpoint (request.py), the log's name
      complete(upstream, body)    one call for the whole answer
      stream(upstream, body)      the answer's chunks as they come (refused: raises before any)
      assembler()                 folds streamed chunks into the answer that is stored
      chunks(response)            a whole answer as the chunks a stream carries (what a
                                  streaming reader reads when the upstream answered at once)
      writer(body)                how this client reads a stream (`StreamWriter`): a stored
                                  answer replayed, each chunk framed as it asked, an error,
                                  the end

Chat and legacy completions share OpenAI's framing (`ChatStreamWriter`: `data: {json}` events,
usage only with `stream_options.include_usage`, then `data: [DONE]`). An upstream that does not
serve an endpoint is a 404 naming it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from infercache.chat import (
    SSE_DONE,
    CompletionAssembler,
    StreamChunk,
    chunks_from_completion,
    for_client,
    include_usage,
    sse_event,
)
from infercache.errors import NotFoundError
from infercache.gateway.upstream import TextCompletions, Upstream
from infercache.request import Endpoint

Body = dict[str, Any]
Complete = Callable[[Upstream, Body, str, str | None], Awaitable[Body]]
Stream = Callable[[Upstream, Body, str, str | None], AsyncIterator[StreamChunk]]


class StreamWriter(Protocol):
    """The bytes one client reads of a streamed answer."""

    def replay(self, response: Body) -> Iterator[bytes]:
        """A stored answer, whole, as the stream's events (without the end)."""
        ...

    def event(self, chunk: StreamChunk) -> bytes | None:
        """One fetched chunk as this client asked for it (None: nothing to send)."""
        ...

    def error(self, body: Body) -> bytes:
        """An error (an OpenAI-shaped body) that ends the stream."""
        ...

    end: bytes


class ChatStreamWriter:
    """OpenAI's framing: usage only with `stream_options.include_usage`, then `[DONE]`."""

    __slots__ = ("_usage",)
    end = SSE_DONE

    def __init__(self, body: Mapping[str, Any]) -> None:
        self._usage = include_usage(body)

    def replay(self, response: Body) -> Iterator[bytes]:
        for chunk in chunks_from_completion(response, include_usage=self._usage):
            yield sse_event(chunk)

    def event(self, chunk: StreamChunk) -> bytes | None:
        out = for_client(chunk, self._usage)
        return sse_event(out) if out is not None else None

    def error(self, body: Body) -> bytes:
        return sse_event(body)


def _whole_answer(answer: Body) -> Iterator[StreamChunk]:
    return chunks_from_completion(answer, include_usage=True)


@dataclass(frozen=True, slots=True)
class CachedEndpoint:
    endpoint: Endpoint
    operation: str
    complete: Complete
    stream: Stream
    assembler: Callable[[], CompletionAssembler] = CompletionAssembler
    chunks: Callable[[Body], Iterator[StreamChunk]] = _whole_answer
    writer: Callable[[Mapping[str, Any]], StreamWriter] = ChatStreamWriter


def _chat(upstream: Upstream, body: Body, tenant: str, api_key: str | None) -> Awaitable[Body]:
    return upstream.complete(body, tenant=tenant, api_key=api_key)


def _chat_stream(
    upstream: Upstream, body: Body, tenant: str, api_key: str | None
) -> AsyncIterator[StreamChunk]:
    return upstream.stream(body, tenant=tenant, api_key=api_key)


def _text_upstream(upstream: Upstream) -> TextCompletions:
    if not isinstance(upstream, TextCompletions):
        raise NotFoundError(f"{upstream.name} does not serve /v1/completions")
    return upstream


def _text(upstream: Upstream, body: Body, tenant: str, api_key: str | None) -> Awaitable[Body]:
    return _text_upstream(upstream).complete_text(body, tenant=tenant, api_key=api_key)


def _text_stream(
    upstream: Upstream, body: Body, tenant: str, api_key: str | None
) -> AsyncIterator[StreamChunk]:
    return _text_upstream(upstream).stream_text(body, tenant=tenant, api_key=api_key)


CHAT = CachedEndpoint(Endpoint.CHAT, "chat", _chat, _chat_stream)
COMPLETIONS = CachedEndpoint(Endpoint.COMPLETIONS, "completions", _text, _text_stream)
ENDPOINTS = {adapter.endpoint: adapter for adapter in (CHAT, COMPLETIONS)}
