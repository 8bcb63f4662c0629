"""`/v1/responses` (OpenAI's Responses API) as one of the gateway's cached endpoints: the
adapter the request path (service.py) and the miss protocol (replica_fetch.py) call. A request
reaches it whole: a `previous_response_id` was resolved into its input before (responses_route.py),
so it is keyed, sent and kept on its content.

    an `openai` upstream                     POST /responses as the client asked (a derived
                                             `prompt_cache_key` added: upstream.py); a stream's
                                             events as they come; an `error` event raised
    any other upstream (vLLM, SGLang, the    translated to a chat request (responses/
    built-in engine)                         translate.py), its answer translated back; a
                                             stream's text as `response.output_text.delta`s as
                                             it comes, its closing events once the chat stream
                                             ended whole (events.py)
    stored                                   the response its final event carries
                                             (`ResponseAssembler`): only a `completed` one
    a stream read                            `event: TYPE` / `data: JSON` frames; a stored
                                             response replayed as `response.created` ...
                                             `response.completed`; an error as an `error` event
    observe                                  the conversation an answer ends, kept per tenant
                                             for follow-ups (response_conversations.py)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from infercache.chat import CompletionAssembler, StreamChunk, translated_id
from infercache.errors import InfercacheError, StoreError, UpstreamError
from infercache.gateway.endpoints import Body, CachedEndpoint
from infercache.gateway.response_conversations import ResponseConversations
from infercache.gateway.upstream_protocols import Upstream, UpstreamCall, native_api
from infercache.hit_usage import HitUsage, served_hit
from infercache.request import ChatRequest, Endpoint
from infercache.responses.events import (
    ChatToResponseEvents,
    ResponseAssembler,
    response_events,
    sse,
)
from infercache.responses.translate import chat_to_response, input_items, responses_to_chat

log = logging.getLogger(__name__)


def _translated(completion: Mapping[str, Any], body: Body) -> Body:
    created = completion.get("created")
    return chat_to_response(
        completion,
        body,
        response_id=translated_id("resp_", completion.get("id")),
        created_at=float(created) if isinstance(created, int | float) else 0.0,
    )


async def _complete(upstream: Upstream, body: Body, call: UpstreamCall) -> Body:
    native = native_api(upstream, "openai")
    if native is not None:
        return await native.post_json("/responses", body, call)
    chat = responses_to_chat(body, input_items(body["input"]))
    completion = await upstream.complete(chat, tenant=call.tenant, api_key=call.api_key)
    return _translated(completion, body)


async def _stream(upstream: Upstream, body: Body, call: UpstreamCall) -> AsyncIterator[StreamChunk]:
    native = native_api(upstream, "openai")
    if native is not None:
        events = native.post_events("/responses", body, call)
        async for event in events:
            if event.get("type") == "error":  # the stream failed: nothing to store
                message = str(event.get("message") or "the upstream's stream failed")
                raise UpstreamError(message)
            yield event
        return
    chat = responses_to_chat(body, input_items(body["input"]))
    chat["stream_options"] = {"include_usage": True}
    whole = CompletionAssembler()
    translator: ChatToResponseEvents | None = None
    async for chunk in upstream.stream(chat, tenant=call.tenant, api_key=call.api_key):
        whole.add(chunk)
        if translator is None:
            translator = ChatToResponseEvents(_translated({**chunk, "choices": []}, body))
        for event in translator.feed(chunk):
            yield event
    if translator is not None and whole.complete:  # else cut off: never stored
        for event in translator.finish(_translated(whole.result(), body)):
            yield event


def _sent(body: Body, stream: bool) -> Body:
    out = dict(body)
    if not stream:
        out.pop("stream", None)
        out.pop("stream_options", None)
    return out


class ResponsesStreamWriter:
    """OpenAI's Responses framing: `event: TYPE` then `data: JSON`, numbered events; no end
    marker past the final event."""

    __slots__ = ("_sequence",)
    end = b""

    def __init__(self, body: Mapping[str, Any]) -> None:
        self._sequence = 0

    def replay(self, response: Body) -> Iterator[bytes]:
        for event in response_events(response):
            yield self._framed(event)

    def event(self, chunk: StreamChunk) -> bytes | None:
        return self._framed(chunk)

    def _framed(self, event: StreamChunk) -> bytes:
        number = event.get("sequence_number")
        self._sequence = number + 1 if isinstance(number, int) else self._sequence + 1
        return sse(event)

    def error(self, exc: InfercacheError) -> bytes:
        error = exc.to_openai().get("error") or {}
        event = {
            "type": "error",
            "sequence_number": self._sequence,
            "code": error.get("code"),
            "message": error.get("message", exc.message),
            "param": error.get("param"),
        }
        return sse(event)


def _hit_event(event: StreamChunk, mode: HitUsage) -> StreamChunk:
    """An event of an identical request's answer: the usage of the response it carries as
    `hit_usage` says (the final event's; the opening ones carry none)."""
    response = event.get("response")
    if isinstance(response, dict) and isinstance(response.get("usage"), dict):
        return {**event, "response": served_hit(response, mode).response}
    return event


def responses_endpoint(conversations: ResponseConversations) -> CachedEndpoint:
    return CachedEndpoint(
        Endpoint.RESPONSES,
        "responses",
        _complete,
        _stream,
        sent=_sent,
        assembler=ResponseAssembler,
        chunks=response_events,
        writer=ResponsesStreamWriter,
        hit_chunk=_hit_event,
        observe=functools.partial(_keep, conversations),
    )


def _keep(conversations: ResponseConversations, request: ChatRequest, response: Body) -> None:
    """Keep the conversation an answer ends; a store that fails costs the follow-ups their
    cache (they are passed through), never this answer."""
    try:
        conversations.keep(request, response)
    except StoreError as exc:
        log.warning("a Responses conversation was not kept: %s", exc)
