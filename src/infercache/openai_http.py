"""The path one HTTP request of the wrapped `openai` client takes (openai_client.py holds the
clients that call it): the same steps as the gateway's, in process.

    sync_send / async_send(router, request, stream, send)     send: the wrapped client's own
      not a POST to .../chat/completions or .../embeddings, or not a JSON object:
        send(request) untouched
      chat, not streaming: cache.complete / acomplete(body, upstream), where upstream forwards
        the request (directives stripped) with `send`; a miss answers with the upstream's own
        response, a hit with a JSON response; both say `x-infercache` (+ `age` on hits)
      chat, streaming: cache.begin(body)
        → a hit: replayed as SSE chunks (chat.chunks_from_completion), then [DONE]
        → a miss: forwarded; the caller reads the upstream's bytes as they come through a
          `_Tee` that feeds a StreamRecorder and closes the Miss exactly once: with the answer
          when `[DONE]` arrives (before passing it on: the SDK stops reading there), else
          with None (cut off, an error event, closed early): nothing stored
      embeddings: EmbeddingCache.begin → only the missing inputs forwarded → finish (merge
        and store); `x-infercache: exact-hit` when every input hit, and
        `x-infercache-cached-inputs: N`
    An upstream error status is returned as it came (the SDK raises and retries as usual):
    nothing stored. An InfercacheError (bad directives: 400; only-if-cached and no entry: 504)
    becomes an OpenAI-shaped error response with `x-should-retry: false`.

Requests and responses are built with the HTTP library of the wrapped client (`CachingRouter.http`:
httpx2 or httpx); the tees subclass both libraries' byte streams so either accepts them. In the
async flow every store call runs in a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import httpx2
import orjson

from infercache.cache import Cache, Completion, Layer, Miss
from infercache.chat import SSE_DONE, chunks_from_completion, sse_event
from infercache.embedding_cache import EmbeddingCache
from infercache.errors import InfercacheError
from infercache.gateway.controls import apply_header_controls
from infercache.hit_usage import served_hit
from infercache.sse_recorder import StreamRecorder

Send = Callable[[Any, bool], Any]  # (request, stream) → response
ASend = Callable[[Any, bool], Awaitable[Any]]

LAYER_HEADER = {
    Layer.EXACT: "exact-hit",
    Layer.SEMANTIC: "semantic-hit",
    Layer.MISS: "miss",
    Layer.BYPASS: "bypass",
    Layer.UNCACHEABLE: "uncacheable",
}
# Headers of the upstream's response that describe bytes we re-frame (decoded, re-chunked).
_FRAMING = frozenset({"content-length", "content-encoding", "transfer-encoding"})


class _UpstreamStatus(Exception):
    """The upstream answered with an error status: its response goes back as it came."""

    def __init__(self, response: Any) -> None:
        super().__init__(response.status_code)
        self.response = response


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

    def answer(self, request: Any, done: Completion, fetched: list[Any]) -> Any:
        """A non-streaming chat answer: the upstream's own response when this call fetched
        it, else a JSON response from the cache."""
        if fetched and not done.coalesced and done.layer not in (Layer.EXACT, Layer.SEMANTIC):
            response = fetched[0]
            response.headers.update(_layer_headers(done))
            return response
        answer, headers = self.served(done)
        return self.reply(request, answer, headers)

    def replay(self, request: Any, done: Completion, body: dict[str, Any]) -> Any:
        """A cached answer as the SSE stream the upstream would have sent."""
        answer, headers = self.served(done)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = chunks_from_completion(answer, include_usage=include_usage)
        events = b"".join(sse_event(c) for c in chunks) + SSE_DONE
        headers = {"content-type": "text/event-stream", **headers}
        return self.http.Response(200, headers=headers, content=events, request=request)

    def served(self, done: Completion) -> tuple[dict[str, Any], dict[str, str]]:
        """A cached answer (a hit, or an identical call's answer) as served, and its headers:
        the usage the `hit_usage` setting says (hit_usage.py)."""
        hit = served_hit(done.response, self.cache.settings.hit_usage)
        return hit.response, {**_layer_headers(done), **hit.headers}

    def streamed(self, request: Any, upstream: Any, stream: Any, miss: Miss) -> Any:
        headers = _passed_headers(upstream)
        headers["x-infercache"] = LAYER_HEADER[miss.layer]
        return self.http.Response(
            upstream.status_code, headers=headers, stream=stream, request=request
        )

    def embedded(self, request: Any, response: dict[str, Any], hits: int, upstream: Any) -> Any:
        headers = _passed_headers(upstream) if upstream is not None else {}
        n = len(response["data"])
        headers["x-infercache"] = "exact-hit" if hits == n else "miss"
        headers["x-infercache-cached-inputs"] = str(hits)
        return self.reply(request, response, headers)


def _answer(response: Any) -> dict[str, Any]:
    """The upstream's answer, or its response handed back as it came: an error status, or a
    body that is not a JSON object (the SDK reports it as it would without the cache)."""
    if response.status_code != 200:
        raise _UpstreamStatus(response)
    try:
        answer = response.json()
    except ValueError:
        raise _UpstreamStatus(response) from None
    if not isinstance(answer, dict):
        raise _UpstreamStatus(response)
    return answer


def _layer_headers(done: Completion) -> dict[str, str]:
    headers = {"x-infercache": LAYER_HEADER[done.layer]}
    if done.layer in (Layer.EXACT, Layer.SEMANTIC):
        headers["age"] = str(int(done.age_s or 0))
    if done.coalesced:
        headers["x-infercache-coalesced"] = "true"
    return headers


def _passed_headers(upstream: Any) -> dict[str, str]:
    return {k: v for k, v in upstream.headers.items() if k.lower() not in _FRAMING}


class _Tee(httpx.SyncByteStream, httpx2.SyncByteStream):
    """The upstream's stream, passed on chunk by chunk and recorded; closes `miss` once."""

    def __init__(self, upstream: Any, miss: Miss, recorder: StreamRecorder, cache: Cache):
        self._upstream = upstream
        self._miss = miss
        self._recorder = recorder
        self._cache = cache

    def __iter__(self) -> Iterator[bytes]:
        try:
            for data in self._upstream.iter_bytes():
                self._recorder.feed(data)
                if self._recorder.ended and not self._miss.closed:
                    # Store before passing `[DONE]` on: the SDK stops reading there.
                    upstream_s = self._cache.clock.monotonic_s() - self._recorder.started_s
                    self._miss.close(self._recorder.result(), upstream_s=upstream_s)
                yield data
        finally:
            self._miss.close(None)  # cut off or closed early: nothing stored; else a no-op

    def close(self) -> None:
        self._miss.close(None)
        self._upstream.close()


class _AsyncTee(httpx.AsyncByteStream, httpx2.AsyncByteStream):
    """`_Tee` for asyncio: the store write runs in a thread, off the event loop."""

    def __init__(self, upstream: Any, miss: Miss, recorder: StreamRecorder, cache: Cache):
        self._upstream = upstream
        self._miss = miss
        self._recorder = recorder
        self._cache = cache

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for data in self._upstream.aiter_bytes():
                self._recorder.feed(data)
                if self._recorder.ended and not self._miss.closed:
                    upstream_s = self._cache.clock.monotonic_s() - self._recorder.started_s
                    result = self._recorder.result()
                    await asyncio.to_thread(self._miss.close, result, upstream_s=upstream_s)
                yield data
        finally:
            self._miss.close(None)

    async def aclose(self) -> None:
        self._miss.close(None)
        await self._upstream.aclose()


# -- the two flows: the same steps, one with blocking I/O, one with asyncio --


def sync_send(router: CachingRouter, request: Any, stream: bool, send: Send) -> Any:
    route = router.route(request)
    body = router.body(request) if route is not None else None
    if body is None:
        return send(request, stream)
    try:
        if route == "embeddings":
            response = _sync_embed(router, request, body, send)
        elif body.get("stream"):
            response = _sync_stream(router, request, body, send)
        else:
            response = _sync_chat(router, request, body, send)
    except _UpstreamStatus as status:
        return status.response
    except InfercacheError as exc:
        return router.refusal(request, exc)
    if not stream:
        response.read()
    return response


def _sync_chat(router: CachingRouter, request: Any, body: dict[str, Any], send: Send) -> Any:
    fetched: list[Any] = []

    def upstream(sent: dict[str, Any]) -> dict[str, Any]:
        response = send(router.forward(request, sent), False)
        answer = _answer(response)
        fetched.append(response)
        return answer

    done = router.cache.complete(body, upstream)
    return router.answer(request, done, fetched)


def _sync_stream(router: CachingRouter, request: Any, body: dict[str, Any], send: Send) -> Any:
    outcome = router.cache.begin(body)
    if isinstance(outcome, Completion):
        return router.replay(request, outcome, body)
    miss = outcome
    recorder = StreamRecorder(router.cache.clock.monotonic_s())
    try:
        upstream = send(router.forward(request, dict(miss.request.body)), True)
    except BaseException:
        miss.close(None)  # the upstream could not be reached
        raise
    if upstream.status_code != 200:
        miss.close(None)
        upstream.read()
        raise _UpstreamStatus(upstream)
    return router.streamed(request, upstream, _Tee(upstream, miss, recorder, router.cache), miss)


def _sync_embed(router: CachingRouter, request: Any, body: dict[str, Any], send: Send) -> Any:
    lookup = router.embeddings.begin(body)
    sent = lookup.upstream_body
    if sent is None:
        result = router.embeddings.finish(lookup, None, upstream_s=0.0)
        return router.embedded(request, result.response, result.hits, None)
    clock = router.cache.clock
    started_s = clock.monotonic_s()
    upstream = send(router.forward(request, sent), False)
    answer = _answer(upstream)
    upstream_s = clock.monotonic_s() - started_s
    result = router.embeddings.finish(lookup, answer, upstream_s=upstream_s)
    return router.embedded(request, result.response, result.hits, upstream)


async def async_send(router: CachingRouter, request: Any, stream: bool, send: ASend) -> Any:
    route = router.route(request)
    body = router.body(request) if route is not None else None
    if body is None:
        return await send(request, stream)
    try:
        if route == "embeddings":
            response = await _async_embed(router, request, body, send)
        elif body.get("stream"):
            response = await _async_stream(router, request, body, send)
        else:
            response = await _async_chat(router, request, body, send)
    except _UpstreamStatus as status:
        return status.response
    except InfercacheError as exc:
        return router.refusal(request, exc)
    if not stream:
        await response.aread()
    return response


async def _async_chat(
    router: CachingRouter, request: Any, body: dict[str, Any], send: ASend
) -> Any:
    fetched: list[Any] = []

    async def upstream(sent: dict[str, Any]) -> dict[str, Any]:
        response = await send(router.forward(request, sent), False)
        answer = _answer(response)
        fetched.append(response)
        return answer

    done = await router.cache.acomplete(body, upstream)
    return router.answer(request, done, fetched)


async def _async_stream(
    router: CachingRouter, request: Any, body: dict[str, Any], send: ASend
) -> Any:
    outcome = await asyncio.to_thread(router.cache.begin, body)
    if isinstance(outcome, Completion):
        return router.replay(request, outcome, body)
    miss = outcome
    recorder = StreamRecorder(router.cache.clock.monotonic_s())
    try:
        upstream = await send(router.forward(request, dict(miss.request.body)), True)
    except BaseException:
        miss.close(None)  # the upstream could not be reached
        raise
    if upstream.status_code != 200:
        miss.close(None)
        await upstream.aread()
        raise _UpstreamStatus(upstream)
    tee = _AsyncTee(upstream, miss, recorder, router.cache)
    return router.streamed(request, upstream, tee, miss)


async def _async_embed(
    router: CachingRouter, request: Any, body: dict[str, Any], send: ASend
) -> Any:
    lookup = await asyncio.to_thread(router.embeddings.begin, body)
    sent = lookup.upstream_body
    if sent is None:
        result = router.embeddings.finish(lookup, None, upstream_s=0.0)
        return router.embedded(request, result.response, result.hits, None)
    clock = router.cache.clock
    started_s = clock.monotonic_s()
    upstream = await send(router.forward(request, sent), False)
    answer = _answer(upstream)
    upstream_s = clock.monotonic_s() - started_s
    finish = router.embeddings.finish
    result = await asyncio.to_thread(finish, lookup, answer, upstream_s=upstream_s)
    return router.embedded(request, result.response, result.hits, upstream)
