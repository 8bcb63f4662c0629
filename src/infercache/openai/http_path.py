"""The path one HTTP request of the wrapped `openai` client takes (client.py holds the clients
that call it): the gateway's steps, in process, on the same miss protocol.

    sync_send / async_send(router, request, stream, send)     send: the wrapped client's own
      not a POST to .../chat/completions or .../embeddings, or not a JSON object:
        send(request) untouched
      chat: cache.begin(body), its store I/O where store_guard.py says (asyncio)
        → a hit: a JSON response, or its SSE replay (chat.chunks_from_completion) then [DONE]
        → a Miss: the one miss protocol (miss_flight.py), the wrapped client's `send` its
          Source (send_source.py): identical requests in flight, streamed or not, make one
          upstream call
            not streaming: the leader answers with the upstream's own response, the others
            with a JSON response
            streaming: every reader reads the flight's chunks as SSE (sse_streams.py): the
            answer is stored when whole, never when cut off or when every reader left
        `x-infercache` (+ `age`, `x-infercache-coalesced`) say which (completion.py)
      embeddings: EmbeddingCache.begin → only the missing inputs fetched, through the same
        protocol → the merged answer; `x-infercache: exact-hit` when every input hit, and
        `x-infercache-cached-inputs: N`
    An upstream error status is returned as it came (the SDK raises and retries as usual):
    nothing stored. An InfercacheError (bad directives: 400; only-if-cached and no entry: 504)
    becomes an OpenAI-shaped error response with `x-should-retry: false`.

Requests and responses are built with the HTTP library of the wrapped client (`CachingRouter.http`:
httpx2 or httpx); the byte streams subclass both libraries' so either accepts them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

import orjson

from infercache.cache import Cache
from infercache.chat import (
    SSE_DONE,
    StreamChunk,
    chunks_from_completion,
    include_usage,
    sse_event,
)
from infercache.completion import Completion, Layer, completion_headers, layer_headers
from infercache.embeddings.embedding_cache import EmbeddingCache
from infercache.embeddings.embedding_miss import AsyncEmbeddingFunction, EmbeddingFunction
from infercache.embeddings.embedding_request import EmbeddingResult
from infercache.errors import InfercacheError
from infercache.header_controls import apply_header_controls
from infercache.hit_usage import served_hit
from infercache.miss import Miss
from infercache.miss_flight import coalesce, coalesce_sync
from infercache.openai.send_source import ASend, AsyncSend, Send, SyncSend, UpstreamStatus
from infercache.openai.sse_streams import AsyncFlightBytes, FlightBytes

# Headers of the upstream's response that describe bytes we re-frame (decoded, re-chunked).
_FRAMING = frozenset({"content-length", "content-encoding", "transfer-encoding"})


class CachingRouter:
    """Builds the requests and responses of one HTTP library (`http`: httpx2 or httpx)."""

    def __init__(self, cache: Cache, http: Any) -> None:
        self.cache = cache
        self.embeddings = EmbeddingCache.of(cache)
        self.http = http

    def route(self, request: Any) -> str | None:
        if request.method != "POST":
            return None
        path = request.url.path.rstrip("/")
        if path.endswith("/chat/completions"):
            return "chat"
        if path.endswith("/embeddings"):
            return "embeddings"
        return None

    def body(self, request: Any) -> dict[str, Any] | None:
        """The JSON body with header controls folded in (None: not a JSON object)."""
        try:
            body = json.loads(request.content)
        except ValueError:
            return None
        return apply_header_controls(body, request.headers) if isinstance(body, dict) else None

    def forward(self, request: Any, body: dict[str, Any]) -> Any:
        """`request` with `body` (directives stripped) and without our control headers."""
        headers = [
            (k, v)
            for k, v in request.headers.multi_items()
            if k.lower() != "content-length" and not k.lower().startswith("x-infercache")
        ]
        return self.http.Request(
            request.method,
            request.url,
            headers=headers,
            content=orjson.dumps(body),
            extensions=request.extensions,
        )

    def reply(
        self, request: Any, body: dict[str, Any], headers: dict[str, str], status: int = 200
    ) -> Any:
        headers = {"content-type": "application/json", **headers}
        return self.http.Response(
            status, headers=headers, content=orjson.dumps(body), request=request
        )

    def refusal(self, request: Any, exc: InfercacheError) -> Any:
        return self.reply(
            request, exc.to_openai(), {"x-should-retry": "false"}, status=exc.status_code
        )

    def hit(self, request: Any, done: Completion, body: dict[str, Any]) -> Any:
        """A cached answer: JSON, or the SSE stream the upstream would have sent."""
        answer, headers = self.served(done)
        if not body.get("stream"):
            return self.reply(request, answer, headers)
        chunks = chunks_from_completion(answer, include_usage=include_usage(body))
        events = b"".join(sse_event(c) for c in chunks) + SSE_DONE
        headers = {"content-type": "text/event-stream", **headers}
        return self.http.Response(200, headers=headers, content=events, request=request)

    def answer(self, request: Any, done: Completion, upstream: Any) -> Any:
        """A non-streaming answer of a miss: the upstream's own response when this call
        fetched it, else a JSON response from the flight."""
        if upstream is not None and not done.coalesced and done.layer is not Layer.EXACT:
            upstream.headers.update(completion_headers(done))
            return upstream
        answer, headers = self.served(done)
        return self.reply(request, answer, headers)

    def served(self, done: Completion) -> tuple[dict[str, Any], dict[str, str]]:
        """A cached answer (a hit, or an identical call's answer) as served, and its headers:
        the usage the `hit_usage` setting says (hit_usage.py)."""
        hit = served_hit(done.response, self.cache.settings.hit_usage)
        return hit.response, {**completion_headers(done), **hit.headers}

    def streamed(
        self, request: Any, miss: Miss, coalesced: bool, upstream: Any, events: Any
    ) -> Any:
        """A streamed answer of a miss: the upstream's headers when this call fetched it."""
        if coalesced:
            headers = layer_headers(Layer.EXACT, age_s=0.0, coalesced=True)
        else:
            headers = {**_passed_headers(upstream), **layer_headers(miss.layer)}
        headers.setdefault("content-type", "text/event-stream")
        return self.http.Response(200, headers=headers, stream=events, request=request)

    def embedded(self, request: Any, result: EmbeddingResult, upstream: Any) -> Any:
        headers = _passed_headers(upstream) if upstream is not None else {}
        n = len(result.response["data"])
        headers["x-infercache"] = "exact-hit" if result.hits == n else "miss"
        headers["x-infercache-cached-inputs"] = str(result.hits)
        return self.reply(request, result.response, headers)


def _whole(answer: dict[str, Any]) -> Iterator[StreamChunk]:
    """An answer that came whole, as the chunks a streaming reader reads (usage included:
    each reader then gets it as it asked)."""
    return chunks_from_completion(answer, include_usage=True)


def _passed_headers(upstream: Any) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in _FRAMING}


# -- the two flows: the same steps, one with blocking I/O, one with asyncio --


def sync_send(router: CachingRouter, request: Any, stream: bool, send: Send) -> Any:
    route = router.route(request)
    body = router.body(request) if route is not None else None
    if body is None:
        return send(request, stream)
    source = SyncSend(functools.partial(router.forward, request), send)
    try:
        if route == "embeddings":
            lookup = router.embeddings.begin(body)
            result = router.embeddings.fetch_missing(lookup, EmbeddingFunction(source.call))
            response = router.embedded(request, result, source.response)
        else:
            response = _sync_chat(router, request, body, source)
    except UpstreamStatus as status:
        return status.response
    except InfercacheError as exc:
        return router.refusal(request, exc)
    if not stream:
        response.read()
    return response


def _sync_chat(router: CachingRouter, request: Any, body: dict[str, Any], source: SyncSend) -> Any:
    cache = router.cache
    outcome = cache.begin(body)
    if isinstance(outcome, Completion):
        return router.hit(request, outcome, body)
    stream = outcome.request.stream
    flight = coalesce_sync(outcome, cache.flights, source, cache.clock, stream=stream)
    if not stream:
        return router.answer(request, flight.wait(), source.response)
    coalesced = flight.start_sync_stream()  # raises an upstream refusal
    events = FlightBytes(flight.iter_chunks(_whole), include_usage(body))
    return router.streamed(request, outcome, coalesced, source.response, events)


async def async_send(router: CachingRouter, request: Any, stream: bool, send: ASend) -> Any:
    route = router.route(request)
    body = router.body(request) if route is not None else None
    if body is None:
        return await send(request, stream)
    source = AsyncSend(functools.partial(router.forward, request), send)
    try:
        if route == "embeddings":
            embeddings = router.embeddings
            lookup = await embeddings.io.read(embeddings.begin, body)
            result = await embeddings.afetch_missing(lookup, AsyncEmbeddingFunction(source.call))
            response = router.embedded(request, result, source.response)
        else:
            response = await _async_chat(router, request, body, source)
    except UpstreamStatus as status:
        return status.response
    except InfercacheError as exc:
        return router.refusal(request, exc)
    if not stream:
        await response.aread()
    return response


async def _async_chat(
    router: CachingRouter, request: Any, body: dict[str, Any], source: AsyncSend
) -> Any:
    cache = router.cache
    outcome = await cache.store_io.read(cache.begin, body)
    if isinstance(outcome, Completion):
        return router.hit(request, outcome, body)
    flight = coalesce(outcome, cache.flights, source, cache.store_io, cache.clock)
    if not outcome.request.stream:
        return router.answer(request, await flight.answer(), source.response)
    coalesced = await flight.start_stream()  # raises an upstream refusal
    events = AsyncFlightBytes(flight.chunks(_whole), include_usage(body))
    return router.streamed(request, outcome, coalesced, source.response, events)
