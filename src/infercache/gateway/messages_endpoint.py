"""`/v1/messages` (Anthropic's Messages API) as one of the gateway's cached endpoints: the
adapter the request path (service.py) and the miss protocol (replica_fetch.py) call.

    an `anthropic` upstream                  the body as the client sent it, its `cache_control`
                                             breakpoints as the tenant's policy says
                                             (`Breakpoints`), POST /messages with the client's
                                             `anthropic-beta`; a stream's events as they come
                                             (`ping`s dropped: they carry nothing to store)
    any other upstream (OpenAI-compatible,   translated to a chat request (anthropic/
    the built-in engine)                     translate.py), its answer or chunks translated back
                                             into a message or Anthropic's events (events.py)
    stored                                   the whole message (a stream folded by
                                             `MessageAssembler`); a cut-off stream never
    a stream read                            `event: TYPE` / `data: JSON` frames; a stored
                                             message replayed as `message_start` ...
                                             `message_stop`; an error as Anthropic's `error`
                                             event

Breakpoints (prompt_cache/breakpoints.py): `inject` (the default) marks a prefix only once this
gateway has seen it within the provider's cache lifetime, so a prefix asked once never pays the
write premium; `pass` sends the client's markers as they are; `strip` removes them. A tenant's
own policy (`anthropic_breakpoints_by_tenant`, its base tenant's when it narrowed one) wins over
the default. The prefixes seen are this gateway's (`SeenPrefixes`, behind a lock).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from infercache.anthropic.events import ChatToMessageEvents, MessageAssembler, message_events, sse
from infercache.anthropic.translate import chat_to_message, messages_to_chat
from infercache.chat import StreamChunk, translated_id
from infercache.clock import Clock
from infercache.errors import InfercacheError
from infercache.gateway.endpoints import Body, CachedEndpoint
from infercache.gateway.upstream_protocols import Upstream, UpstreamCall, native_api
from infercache.hit_usage import HitUsage, served_hit
from infercache.prompt_cache.breakpoints import BreakpointPolicy, SeenPrefixes, apply_policy
from infercache.request import Endpoint


class Breakpoints:
    """The breakpoint policy per tenant, and the prefixes this gateway has seen. Thread-safe."""

    def __init__(
        self,
        clock: Clock,
        default: BreakpointPolicy = BreakpointPolicy.INJECT,
        by_tenant: Mapping[str, BreakpointPolicy] | None = None,
        seen: SeenPrefixes | None = None,
    ) -> None:
        self._clock = clock
        self._default = default
        self._by_tenant = dict(by_tenant or {})
        self._seen = seen or SeenPrefixes()
        self._lock = threading.Lock()

    def policy(self, tenant: str) -> BreakpointPolicy:
        """The tenant's own policy, else its base tenant's (`team-a` of `team-a/eu`), else
        the default."""
        found = self._by_tenant.get(tenant) or self._by_tenant.get(tenant.partition("/")[0])
        return found or self._default

    def body(self, tenant: str, body: Body) -> Body:
        """`body` as the tenant's policy sends it."""
        policy = self.policy(tenant)
        with self._lock:
            return apply_policy(policy, tenant, body, self._seen, self._clock.monotonic_s())


class MessagesCalls:
    """How an answer is fetched, native or translated (module docstring)."""

    def __init__(self, breakpoints: Breakpoints) -> None:
        self.breakpoints = breakpoints

    async def complete(self, upstream: Upstream, body: Body, call: UpstreamCall) -> Body:
        native = native_api(upstream, "anthropic")
        if native is not None:
            sent = self.breakpoints.body(call.tenant, body)
            return await native.post_json("/messages", sent, call)
        chat = messages_to_chat(body)
        completion = await upstream.complete(chat, tenant=call.tenant, api_key=call.api_key)
        return chat_to_message(completion, message_id=translated_id("msg_", completion.get("id")))

    async def stream(
        self, upstream: Upstream, body: Body, call: UpstreamCall
    ) -> AsyncIterator[StreamChunk]:
        native = native_api(upstream, "anthropic")
        if native is not None:
            sent = self.breakpoints.body(call.tenant, body)
            events = native.post_events("/messages", sent, call)
            async for event in events:
                if event.get("type") != "ping":
                    yield event
            return
        chat = {**messages_to_chat(body), "stream_options": {"include_usage": True}}
        translator: ChatToMessageEvents | None = None
        async for chunk in upstream.stream(chat, tenant=call.tenant, api_key=call.api_key):
            if translator is None:
                translator = ChatToMessageEvents(
                    translated_id("msg_", chunk.get("id")), body["model"]
                )
            for event in translator.feed(chunk):
                yield event
        if translator is not None and translator.finished:  # else cut off: never stored
            for event in translator.finish():
                yield event


def _sent(body: Body, stream: bool) -> Body:
    out = dict(body)
    if not stream:
        out.pop("stream", None)
    return out


class MessagesStreamWriter:
    """Anthropic's framing: `event: TYPE` then `data: JSON`; no end marker past
    `message_stop`."""

    __slots__ = ()
    end = b""

    def __init__(self, body: Mapping[str, Any]) -> None:
        pass

    def replay(self, response: Body) -> Iterator[bytes]:
        for event in message_events(response):
            yield sse(event)

    def event(self, chunk: StreamChunk) -> bytes | None:
        return sse(chunk)

    def error(self, exc: InfercacheError) -> bytes:
        return sse(exc.to_anthropic())


def _hit_event(event: StreamChunk, mode: HitUsage) -> StreamChunk:
    """An event of an identical request's answer, its usage as `hit_usage` says: the
    message's in `message_start`; the output count of `message_delta` zeroed in `zero` mode."""
    kind = event.get("type")
    if kind == "message_start" and isinstance(event.get("message"), dict):
        return {**event, "message": served_hit(event["message"], mode).response}
    if kind == "message_delta" and isinstance(event.get("usage"), dict) and mode is HitUsage.ZERO:
        return {**event, "usage": {name: 0 for name in event["usage"]}}
    return event


def messages_endpoint(breakpoints: Breakpoints) -> CachedEndpoint:
    calls = MessagesCalls(breakpoints)
    return CachedEndpoint(
        Endpoint.MESSAGES,
        "messages",
        calls.complete,
        calls.stream,
        sent=_sent,
        assembler=MessageAssembler,
        chunks=message_events,
        writer=MessagesStreamWriter,
        hit_chunk=_hit_event,
    )
