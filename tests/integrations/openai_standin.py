"""A stand-in for a paid OpenAI-compatible provider, served on loopback by uvicorn (a real HTTP
server; the official `openai` client talks to it as it would to the provider). It records every
request it receives, answers chat completions (streamed or not, cut off on demand) and
embeddings (deterministic vectors, float or base64), and answers any other `/v1/*` call with a
small JSON echo, so pass-through can be checked."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def vector(text: str | list[int], dimensions: int) -> list[float]:
    """A deterministic vector for an input (exactly representable in float32)."""
    seed = sum(ord(c) for c in text) if isinstance(text, str) else sum(text)
    return [float((seed * (i + 3)) % 251) / 4 for i in range(dimensions)]


def tokens(text: str | list[int]) -> int:
    return len(text.split()) if isinstance(text, str) else len(text)


@dataclass
class Received:
    method: str
    path: str
    body: Any
    headers: dict[str, str]


@dataclass
class StandIn:
    received: list[Received] = field(default_factory=list)
    chat_calls: int = 0
    fail_status: int | None = None  # answer chat and embeddings with this error status
    cut_streams: bool = False  # end streams before the finish_reason and [DONE]
    # Set: every stream waits for it before its finish chunk (a slow answer, held open).
    hold: threading.Event | None = None

    def __post_init__(self) -> None:
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/v1/{rest:path}", self.other, methods=["GET", "POST", "DELETE"]),
            ]
        )

    def reset(self) -> None:
        self.received.clear()
        self.chat_calls = 0
        self.fail_status = None
        self.cut_streams = False
        self.hold = None

    def bodies(self, path: str) -> list[Any]:
        return [r.body for r in self.received if r.path == path]

    async def _record(self, request: Request) -> Any:
        raw = await request.body()
        body = json.loads(raw) if raw else None
        self.received.append(
            Received(request.method, request.url.path, body, dict(request.headers))
        )
        return body

    def _failure(self) -> Response | None:
        if self.fail_status is None:
            return None
        error = {"error": {"message": "stand-in refuses", "type": "invalid_request_error"}}
        return JSONResponse(error, status_code=self.fail_status)

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        last = body["messages"][-1]["content"]
        return {
            "id": f"chatcmpl-{self.chat_calls}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": f"answer #{self.chat_calls} to {last}",
                    },
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        }

    async def chat(self, request: Request) -> Response:
        body = await self._record(request)
        failure = self._failure()
        if failure is not None:
            return failure
        self.chat_calls += 1
        answer = self.completion(body)
        headers = {"x-request-id": f"req-{self.chat_calls}"}
        if not body.get("stream"):
            return JSONResponse(answer, headers=headers)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = self._events(answer, include_usage)
        return StreamingResponse(events, media_type="text/event-stream", headers=headers)

    async def _events(self, answer: dict[str, Any], include_usage: bool) -> AsyncIterator[bytes]:
        base = {k: answer[k] for k in ("id", "created", "model")}
        base["object"] = "chat.completion.chunk"

        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            return f"data: {json.dumps({**base, 'choices': choices, **extra})}\n\n".encode()

        text = answer["choices"][0]["message"]["content"]
        yield event([{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}])
        for i in range(0, len(text), 5):
            yield event(
                [{"index": 0, "delta": {"content": text[i : i + 5]}, "finish_reason": None}]
            )
        if self.hold is not None:
            assert await asyncio.to_thread(self.hold.wait, 30)
        if self.cut_streams:
            return
        yield event([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        if include_usage:
            yield event([], usage=answer["usage"])
        yield b"data: [DONE]\n\n"

    async def embeddings(self, request: Request) -> Response:
        body = await self._record(request)
        failure = self._failure()
        if failure is not None:
            return failure
        raw = body["input"]
        single = isinstance(raw, str) or (isinstance(raw, list) and raw and isinstance(raw[0], int))
        inputs = [raw] if single else raw
        dimensions = body.get("dimensions") or 4
        data = []
        for i, text in enumerate(inputs):
            vec = vector(text, dimensions)
            encoded: Any = vec
            if body.get("encoding_format") == "base64":
                encoded = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        used = sum(tokens(t) for t in inputs)
        usage = {"prompt_tokens": used, "total_tokens": used}
        return JSONResponse(
            {"object": "list", "data": data, "model": body["model"], "usage": usage}
        )

    async def other(self, request: Request) -> Response:
        body = await self._record(request)
        path = request.url.path
        if path == "/v1/models" and request.method == "GET":
            return JSONResponse(
                {
                    "object": "list",
                    "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "standin"}],
                }
            )
        if path.startswith("/v1/models/"):
            model = path.rsplit("/", 1)[1]
            return JSONResponse(
                {"id": model, "object": "model", "created": 0, "owned_by": "standin"}
            )
        return JSONResponse(
            {"object": "echo", "path": path, "body": body}, headers={"x-standin": "1"}
        )
