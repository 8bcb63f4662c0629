"""The gateway's cached endpoints as adapters: what differs between `/v1/chat/completions` and
`/v1/completions` (and the endpoints to come) is a value here; the path a request takes
(service.py) and the one miss protocol (miss_flight.py) are the same for all.

    CachedEndpoint
      endpoint, operation         the request model's endpoint (request.py), the log's name
      complete(upstream, body)    one call for the whole answer
      stream(upstream, body)      the answer's chunks as they come (refused: raises before any)
      assembler()                 folds streamed chunks into the answer that is stored
      replay(response, usage)     a stored answer as the chunks a stream would have carried
      event(chunk), end           the SSE framing of a chunk, and what closes the stream

An upstream that does not serve an endpoint is a 404 naming it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

from infercache.chat import (
    SSE_DONE,
    CompletionAssembler,
    StreamChunk,
    chunks_from_completion,
    sse_event,
)
from infercache.errors import NotFoundError
from infercache.gateway.upstream import TextCompletions, Upstream
from infercache.request import Endpoint

Body = dict[str, Any]
Complete = Callable[[Upstream, Body, str, str | None], Awaitable[Body]]
Stream = Callable[[Upstream, Body, str, str | None], AsyncIterator[StreamChunk]]


@dataclass(frozen=True, slots=True)
class CachedEndpoint:
    endpoint: Endpoint
    operation: str
    complete: Complete
    stream: Stream
    assembler: Callable[[], CompletionAssembler] = CompletionAssembler
    replay: Callable[..., Iterator[StreamChunk]] = chunks_from_completion
    event: Callable[[Body], bytes] = sse_event
    end: bytes = SSE_DONE


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
