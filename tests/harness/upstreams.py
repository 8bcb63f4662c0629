"""Stand-ins for a paid provider, the upstream infercache sits in front of (nothing here calls
a real one): `FakeUpstream`, an OpenAI-compatible HTTP server app for the gateway tests (serve it
with servers.serve), and `CountingUpstream`, the library's in-process upstream function.

`FakeUpstream` answers `answer #N to <last message>` and lets a test hold an answer back
(`hold`/`release`), fail on demand, slow down, cut or reset streams, or change its reported model
version; it records every request whole. The real engine behind a real gateway is tested end to
end in tests/gateway/test_e2e.py; this twin makes the breadth tests fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from infercache.clock import ManualClock
from infercache.http_errors import exception_handlers


class FakeUpstream:
    """Answers `answer #N to <last message>`; counts calls; thread-safe enough for one loop."""

    def __init__(self) -> None:
        self.calls = 0
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.version = "fp-1"
        # Several fingerprints at once, one picked per answer, as OpenAI answers one model.
        self.fingerprints: tuple[str, ...] = ()
        self._pick = random.Random(29)
        self.models_version: str | None = None  # a `version` in /v1/models, like our engine
        self.fail_status: int | None = None
        self.gate: asyncio.Event | None = None  # hold answers until set (on the server loop)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stream_pieces = 3
        self.truncate_streams = False  # end streams early: no finish_reason, no [DONE]
        self.reset_streams = False  # break the connection mid-stream (a reset)
        self.delay_s = 0.0  # answer this much later (a slow provider)
        self.cancelled_streams = 0
        self.other_requests: list[dict[str, Any]] = []
        self.embedded: list[str] = []
        self.received: list[bytes] = []  # every HTTP request whole: line, headers, body
        self.routes = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/v1/completions", self.text, methods=["POST"]),
                Route("/v1/{rest:path}", self.other, methods=["GET", "POST", "DELETE"]),
            ],
            lifespan=self._lifespan,
            exception_handlers=exception_handlers(),  # errors in the OpenAI shape, as a provider
        )

        self.app = self._recording  # a plain function: uvicorn takes a bound method for ASGI2

    @property
    def _recording(self) -> Any:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            await self._record(scope, receive, send)

        return app

    async def _record(self, scope: Any, receive: Any, send: Any) -> None:
        """The stand-in as an ASGI app that records each request as it arrived (method, path,
        query, every header, the body), so a test can search all of it for a planted secret."""
        if scope["type"] != "http":
            await self.routes(scope, receive, send)
            return
        raw = [scope["method"].encode(), scope["path"].encode(), scope["query_string"]]
        raw += [name + b": " + value for name, value in scope["headers"]]
        body: list[bytes] = []

        async def recording_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                body.append(message.get("body", b""))
                if not message.get("more_body"):
                    self.received.append(b"\n".join([*raw, b"".join(body)]))
            return message

        await self.routes(scope, recording_receive, send)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.loop = asyncio.get_running_loop()
        yield

    def hold(self) -> None:
        """Hold every answer until `release()`."""
        assert self.loop is not None, "hold() needs the server running"
        done = threading.Event()

        def make() -> None:
            self.gate = asyncio.Event()
            done.set()

        self.loop.call_soon_threadsafe(make)
        assert done.wait(10)

    def release(self) -> None:
        assert self.loop is not None
        assert self.gate is not None
        self.loop.call_soon_threadsafe(self.gate.set)

    def fingerprint(self) -> str:
        return self._pick.choice(self.fingerprints) if self.fingerprints else self.version

    def completion(self, body: dict[str, Any], n: int) -> dict[str, Any]:
        # Any body the gateway passes on gets an answer (fuzzed ones too), as a provider would.
        messages = body.get("messages")
        last_message = messages[-1] if isinstance(messages, list) and messages else {}
        last = last_message.get("content") if isinstance(last_message, dict) else None
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": str(body.get("model")),
            "system_fingerprint": self.fingerprint(),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"answer #{n} to {last}"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 30,
                "completion_tokens": 6,
                "total_tokens": 36,
                "prompt_tokens_details": {"cached_tokens": 16 if n > 1 else 0},
            },
        }

    async def chat(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.calls += 1
        n = self.calls
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        if self.fail_status is not None:
            error = {"error": {"message": "slow down", "type": "rate_limit", "code": "429"}}
            retry = {"retry-after": "7"} if self.fail_status in (429, 503) else None
            return JSONResponse(error, status_code=self.fail_status, headers=retry)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)  # a slow provider (the server's own loop)
        if not body.get("stream"):
            if self.gate is not None:
                await self.gate.wait()
            return JSONResponse(self.completion(body, n))
        return StreamingResponse(self.chunks(body, n), media_type="text/event-stream")

    async def chunks(self, body: dict[str, Any], n: int) -> AsyncIterator[bytes]:
        full = self.completion(body, n)
        text = full["choices"][0]["message"]["content"]
        base = {k: full[k] for k in ("id", "created", "model", "system_fingerprint")}
        base["object"] = "chat.completion.chunk"

        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            return f"data: {json.dumps({**base, 'choices': choices, **extra})}\n\n".encode()

        try:
            yield event([{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}])
            if self.gate is not None:
                await self.gate.wait()
            step = max(1, len(text) // self.stream_pieces)
            for i in range(0, len(text), step):
                delta = {"content": text[i : i + step]}
                yield event([{"index": 0, "delta": delta, "finish_reason": None}])
            if self.truncate_streams:
                return
            if self.reset_streams:
                raise ConnectionResetError("the stand-in resets the stream")
            yield event([{"index": 0, "delta": {}, "finish_reason": "stop"}])
            if (body.get("stream_options") or {}).get("include_usage"):
                yield event([], usage=full["usage"])
            yield b"data: [DONE]\n\n"
        except asyncio.CancelledError:
            self.cancelled_streams += 1
            raise

    async def text(self, request: Request) -> Response:
        """The legacy completions API: `text #N for <prompt>`, streamed or not."""
        body = json.loads(await request.body())
        self.calls += 1
        self.bodies.append(body)
        n = self.calls
        full = {
            "id": f"cmpl-{n}",
            "object": "text_completion",
            "created": 1_700_000_000,
            "model": str(body.get("model")),
            "system_fingerprint": self.fingerprint(),
            "choices": [
                {"index": 0, "text": f"text #{n} for {body.get('prompt')}", "logprobs": None,
                 "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9},
        }  # fmt: skip
        if not body.get("stream"):
            return JSONResponse(full)

        async def chunks() -> AsyncIterator[bytes]:
            text = full["choices"][0]["text"]
            base = {k: full[k] for k in ("id", "object", "created", "model")}
            for piece, finish in ((text[:5], None), (text[5:], None), ("", "stop")):
                choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}
                yield f"data: {json.dumps({**base, 'choices': [choice]})}\n\n".encode()
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {**base, "choices": [], "usage": full["usage"]}
                yield f"data: {json.dumps(usage)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def embeddings(self, request: Request) -> Response:
        """A deterministic 3-d vector per input text; records every input it embeds."""
        body = json.loads(await request.body())
        raw = body["input"]
        texts = [raw] if isinstance(raw, str) else raw
        self.embedded.extend(texts)
        data = [
            {"object": "embedding", "index": i, "embedding": [len(t), t.count("a"), i]}
            for i, t in enumerate(texts)
        ]
        tokens = sum(len(t.split()) for t in texts)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return JSONResponse(
            {"object": "list", "data": data, "model": body["model"], "usage": usage}
        )

    async def other(self, request: Request) -> Response:
        """Any other endpoint (files, responses, ...): recorded and echoed."""
        raw = await request.body()
        self.other_requests.append(
            {
                "method": request.method,
                "path": request.url.path,
                "query": request.url.query,
                "headers": dict(request.headers),
                "body": raw,
            }
        )
        if request.url.path == "/v1/files":
            return JSONResponse({"object": "list", "data": [{"id": "file-1", "object": "file"}]})
        return JSONResponse(
            {"id": "resp-1", "object": "response", "path": request.url.path, "echo": len(raw)},
            headers={"x-upstream": "stand-in"},
        )

    async def models(self, request: Request) -> Response:
        model = {"id": "test-model", "object": "model"}
        if self.models_version is not None:
            model["version"] = self.models_version
        return JSONResponse({"object": "list", "data": [model]})


class CountingUpstream:
    """Stands in for a paid provider: answers deterministically from the request, counts calls,
    and takes `latency_s` on the injected clock. Thread-safe."""

    def __init__(
        self,
        clock: ManualClock,
        *,
        latency_s: float = 0.5,
        prompt_tokens: int = 20,
        completion_tokens: int = 8,
    ) -> None:
        self.clock = clock
        self.latency_s = latency_s
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.calls = 0
        self.bodies: list[dict[str, Any]] = []
        self.finish_reason: str | None = "stop"
        self._lock = threading.Lock()
        self.gate: threading.Event | None = None  # when set, calls block until it is set

    def response(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.calls += 1
            self.bodies.append(body)
            n = self.calls
        last = body["messages"][-1]["content"]
        return {
            "id": f"chatcmpl-{n}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": f"answer #{n} to {last}"},
                    "finish_reason": self.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
            },
        }

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.gate is not None:
            assert self.gate.wait(30), "test gate never opened"
        self.clock.advance(self.latency_s)
        return self.response(body)

    async def acall(self, body: dict[str, Any]) -> dict[str, Any]:
        self.clock.advance(self.latency_s)
        return self.response(body)
