"""The gateway's cached endpoints as adapters: what differs between `/v1/chat/completions`,
`/v1/completions`, `/v1/messages` (messages_endpoint.py) and `/v1/responses`
(responses_endpoint.py) is a value here; the path a request takes (service.py), the way a miss
reaches the upstreams (replica_fetch.py) and the one miss protocol (miss_flight.py) are the
same for all.

    CachedEndpoint
      endpoint, operation         the request model's endpoint (request.py), the log's name
      sent(body, stream)          the body an upstream call carries (delivery fields set)
      complete(upstream, body, call)   one call for the whole answer
      stream(upstream, body, call)     the answer's chunks as they come (refused: raises
                                  before any): for chat, chat chunks; for the other APIs,
                                  their own events (translated from chat when the upstream
                                  speaks only chat)
      assembler()                 folds streamed chunks into the answer that is stored
      chunks(response)            a whole answer as the chunks a stream carries (what a
                                  streaming reader reads when the upstream answered at once)
      writer(body)                how this client reads a stream (`StreamWriter`): a stored
                                  answer replayed, each chunk framed as it asked, an error,
                                  the end
      hit_chunk(chunk, mode)      a chunk as an identical request's reader gets it: its usage
                                  as `hit_usage` says (hit_usage.py)
      observe(request, answer)    what the endpoint keeps of a fetched answer (store I/O, run
                                  with the store write): Responses keeps the conversation

`UpstreamCall` (upstream_protocols.py) carries who a call is for: the tenant (the KV salt, the
derived prompt-cache key), the caller's bearer (sent only when configured) and an Anthropic
client's beta header.
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
from infercache.errors import InfercacheError, NotFoundError
from infercache.gateway.upstream_protocols import TextCompletions, Upstream, UpstreamCall
from infercache.hit_usage import HitUsage, served_hit
from infercache.request import ChatRequest, Endpoint

Body = dict[str, Any]


Complete = Callable[[Upstream, Body, UpstreamCall], Awaitable[Body]]
StreamCall = Callable[[Upstream, Body, UpstreamCall], AsyncIterator[StreamChunk]]


class StreamWriter(Protocol):
    """The bytes one client reads of a streamed answer."""

    def replay(self, response: Body) -> Iterator[bytes]:
        """A stored answer, whole, as the stream's events (without the end)."""
        ...

    def event(self, chunk: StreamChunk) -> bytes | None:
        """One fetched chunk as this client asked for it (None: nothing to send)."""
        ...

    def error(self, exc: InfercacheError) -> bytes:
        """An error event, in the API's shape, that ends the stream."""
        ...

    end: bytes


class Assembler(Protocol):
    """Folds a stream's chunks into the one answer they describe."""

    def add(self, chunk: StreamChunk) -> None: ...

    @property
    def complete(self) -> bool:
        """The stream ended as the API ends a whole answer (not cut off)."""
        ...

    def result(self) -> Body: ...


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

    def error(self, exc: InfercacheError) -> bytes:
        return sse_event(exc.to_openai())


def _whole_answer(answer: Body) -> Iterator[StreamChunk]:
    return chunks_from_completion(answer, include_usage=True)


def _chat_sent(body: Body, stream: bool) -> Body:
    """Chat and completions: a stream always asks for usage (the answer stored is whole)."""
    out = dict(body)
    if stream:
        out["stream_options"] = {"include_usage": True}
    else:
        out.pop("stream", None)
        out.pop("stream_options", None)
    return out


def _chat_hit_chunk(chunk: StreamChunk, mode: HitUsage) -> StreamChunk:
    return served_hit(chunk, mode).response if chunk.get("usage") is not None else chunk


@dataclass(frozen=True, slots=True)
class CachedEndpoint:
    endpoint: Endpoint
    operation: str
    complete: Complete
    stream: StreamCall
    sent: Callable[[Body, bool], Body] = _chat_sent
    assembler: Callable[[], Assembler] = CompletionAssembler
    chunks: Callable[[Body], Iterator[StreamChunk]] = _whole_answer
    writer: Callable[[Mapping[str, Any]], StreamWriter] = ChatStreamWriter
    hit_chunk: Callable[[StreamChunk, HitUsage], StreamChunk] = _chat_hit_chunk
    observe: Callable[[ChatRequest, Body], None] | None = None


def _chat(upstream: Upstream, body: Body, call: UpstreamCall) -> Awaitable[Body]:
    return upstream.complete(body, tenant=call.tenant, api_key=call.api_key)


def _chat_stream(upstream: Upstream, body: Body, call: UpstreamCall) -> AsyncIterator[StreamChunk]:
    return upstream.stream(body, tenant=call.tenant, api_key=call.api_key)


def _text_upstream(upstream: Upstream) -> TextCompletions:
    if not isinstance(upstream, TextCompletions):
        raise NotFoundError(f"{upstream.name} does not serve /v1/completions")
    return upstream


def _text(upstream: Upstream, body: Body, call: UpstreamCall) -> Awaitable[Body]:
    return _text_upstream(upstream).complete_text(body, tenant=call.tenant, api_key=call.api_key)


def _text_stream(upstream: Upstream, body: Body, call: UpstreamCall) -> AsyncIterator[StreamChunk]:
    return _text_upstream(upstream).stream_text(body, tenant=call.tenant, api_key=call.api_key)


CHAT = CachedEndpoint(Endpoint.CHAT, "chat", _chat, _chat_stream)
COMPLETIONS = CachedEndpoint(Endpoint.COMPLETIONS, "completions", _text, _text_stream)
ENDPOINTS: Mapping[Endpoint, CachedEndpoint] = {a.endpoint: a for a in (CHAT, COMPLETIONS)}
"""The OpenAI endpoints, which need nothing of the gateway's; build.py adds Messages and
Responses, built with what they keep (breakpoints seen, conversations)."""
