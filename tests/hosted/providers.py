"""Stand-ins for the two hosted providers, applying their documented prompt-cache rules and
recording what they receive. Their own tokenizer (words and punctuation marks), their own
event framing and their own cache: nothing here shares code with what they test.

Anthropic (`POST /v1/messages`, `x-api-key` and `anthropic-version` required):
- a prefix is cached only up to a block marked `cache_control` (tools, then system, then
  messages, in that order), at most 4 markers (a 400 otherwise), and only when it reaches the
  model's minimum (1,024 tokens; 2,048 for Haiku 3.x; 4,096 for Haiku 4.5 and Opus 4.5);
- a request reads the longest marked prefix cached and still alive, then writes every longer
  marked prefix: `cache_read_input_tokens`, `cache_creation_input_tokens`, and
  `input_tokens` for the rest; entries live 5 minutes, refreshed when read.
OpenAI (`POST /v1/chat/completions` and `/v1/responses`): automatic prefix caching of prompts of
at least 1,024 tokens, reused in 128-token steps, within 5 minutes, partitioned by the
`prompt_cache_key` (none is a partition too); reported as `cached_tokens`. `OpenAIStandIn`
serves both: chat with `prompt_tokens_details.cached_tokens`, Responses natively (its own
response objects and event stream, `previous_response_id` resolved from the responses it keeps
itself, an unknown one a 404), and records each body with the `prompt_cache_key` it carried.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from infercache.clock import Clock

TTL_S = 300.0
_TOKEN = re.compile(r"\w+|[^\w\s]")


def tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def minimum(model: str) -> int:
    if "haiku-4-5" in model or "opus-4-5" in model:
        return 4096
    return 2048 if "haiku" in model else 1024


def _blocks_text(value: Any) -> str:
    """The text a stand-in tokenizes for a block or a list of them (JSON of non-text parts)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if value.get("type") == "text":
            return str(value.get("text", ""))
        return json.dumps({k: v for k, v in value.items() if k != "cache_control"}, sort_keys=True)
    if isinstance(value, list):
        return " ".join(_blocks_text(v) for v in value)
    return json.dumps(value, sort_keys=True)


class AnthropicStandIn:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._cache: dict[bytes, float] = {}  # prefix digest -> expiry (wall clock)
        self.stop_reason = "end_turn"  # "max_tokens": every answer cut off
        self.usages: list[dict[str, int]] = []  # each answer's usage, as billed
        self.app = Starlette(routes=[Route("/v1/messages", self.messages, methods=["POST"])])

    def _pieces(self, body: dict[str, Any]) -> list[tuple[str, bool]]:
        """Every block in cache order, with whether it carries a marker."""
        out: list[tuple[str, bool]] = []
        for tool in body.get("tools") or []:
            out.append((_blocks_text(tool), "cache_control" in tool))
        system = body.get("system")
        if isinstance(system, str):
            out.append((system, False))
        for block in system if isinstance(system, list) else []:
            out.append((_blocks_text(block), "cache_control" in block))
        for message in body["messages"]:
            content = message["content"]
            if isinstance(content, str):
                out.append((f"{message['role']}: {content}", False))
                continue
            for block in content:
                out.append((f"{message['role']}: {_blocks_text(block)}", "cache_control" in block))
        return out

    def usage(self, key: str, body: dict[str, Any]) -> dict[str, int]:
        now = self.clock.now_s()
        pieces = self._pieces(body)
        digest = hashlib.sha256(f"{key}\x00{body['model']}".encode()).digest()
        marked: list[tuple[bytes, int]] = []  # (prefix digest, prefix tokens) at each marker
        total = 0
        for text, marker in pieces:
            digest = hashlib.sha256(digest + text.encode()).digest()
            total += tokens(text)
            if marker:
                marked.append((digest, total))
        read = 0
        for prefix, length in marked:
            if self._cache.get(prefix, 0.0) > now and length >= minimum(body["model"]):
                read = max(read, length)
                self._cache[prefix] = now + TTL_S
        written = 0
        for prefix, length in marked:
            if length > read and length >= minimum(body["model"]):
                self._cache[prefix] = now + TTL_S
                written = max(written, length)
        write = max(0, written - read)
        usage = {"input_tokens": total - read - write, "output_tokens": 5,
                 "cache_read_input_tokens": read, "cache_creation_input_tokens": write}  # fmt: skip
        self.usages.append(usage)
        return usage

    async def messages(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        key = request.headers.get("x-api-key")
        if not key:
            error = {"type": "authentication_error", "message": "x-api-key header is required"}
            return JSONResponse({"type": "error", "error": error}, status_code=401)
        if not request.headers.get("anthropic-version"):
            error = {"type": "invalid_request_error", "message": "anthropic-version is required"}
            return JSONResponse({"type": "error", "error": error}, status_code=400)
        if str(body).count("'cache_control'") > 4:
            text = "A maximum of 4 blocks with cache_control may be provided."
            error = {"type": "invalid_request_error", "message": text}
            return JSONResponse({"type": "error", "error": error}, status_code=400)
        last = body["messages"][-1]["content"]
        text = f"answer #{len(self.requests)} to {_blocks_text(last)}"
        message = {"id": f"msg_{len(self.requests):04d}", "type": "message", "role": "assistant",
                   "model": body["model"], "content": [{"type": "text", "text": text}],
                   "stop_reason": self.stop_reason, "stop_sequence": None,
                   "usage": self.usage(key, body)}  # fmt: skip
        if not body.get("stream"):
            return JSONResponse(message)
        return StreamingResponse(self._events(message), media_type="text/event-stream")

    async def _events(self, message: dict[str, Any]) -> AsyncIterator[bytes]:
        def frame(kind: str, **data: Any) -> bytes:
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()

        start = {**message, "content": [], "stop_reason": None,
                 "usage": {**message["usage"], "output_tokens": 1}}  # fmt: skip
        yield frame("message_start", message=start)
        yield frame("content_block_start", index=0, content_block={"type": "text", "text": ""})
        yield frame("ping")
        text = message["content"][0]["text"]
        for i in range(0, len(text), 5):
            yield frame("content_block_delta", index=0,
                        delta={"type": "text_delta", "text": text[i : i + 5]})  # fmt: skip
        yield frame("content_block_stop", index=0)
        yield frame("message_delta", delta={"stop_reason": self.stop_reason, "stop_sequence": None},
                    usage={"output_tokens": 5})  # fmt: skip
        yield frame("message_stop")


class OpenAIPromptCache:
    """OpenAI's automatic prefix cache: 1,024 tokens at least, 128-token steps, 5 minutes, one
    partition per `prompt_cache_key`."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._cache: dict[bytes, float] = {}

    def cached_tokens(self, partition: str | None, words: list[str]) -> int:
        now = self.clock.now_s()
        if len(words) < 1024:
            return 0
        steps = [1024 + 128 * k for k in range((len(words) - 1024) // 128 + 1)]
        digests = {
            n: hashlib.sha256(f"{partition}\x00{' '.join(words[:n])}".encode()).digest()
            for n in steps
        }
        cached = max((n for n, d in digests.items() if self._cache.get(d, 0.0) > now), default=0)
        for d in digests.values():
            self._cache[d] = now + TTL_S
        return cached


def _words(value: Any) -> list[str]:
    """The stand-in's tokens of a chat message list, a Responses input or instructions."""
    if isinstance(value, str):
        return _TOKEN.findall(value)
    if isinstance(value, dict):
        return _words(value.get("content", value.get("text", value.get("output", ""))))
    if isinstance(value, list):
        return [w for v in value for w in _words(v)]
    return []


class OpenAIStandIn:
    """OpenAI's chat and Responses APIs with its automatic prefix cache (module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self.cache = OpenAIPromptCache(clock)
        self.clock = clock
        self.requests: list[tuple[str, dict[str, Any]]] = []  # (path, body)
        self.headers: list[dict[str, str]] = []
        self._kept: dict[str, list[Any]] = {}  # response id -> its whole conversation
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
            ]
        )

    def _record(self, request: Request, body: dict[str, Any]) -> int:
        self.requests.append((request.url.path, body))
        self.headers.append(dict(request.headers))
        return len(self.requests)

    async def chat(self, request: Request) -> Response:
        body = json.loads(await request.body())
        n = self._record(request, body)
        words = _words(body["messages"])
        cached = self.cache.cached_tokens(body.get("prompt_cache_key"), words)
        text = f"answer #{n} to {_blocks_text(body['messages'][-1]['content'])}"
        return JSONResponse({
            "id": f"chatcmpl-{n:04d}", "object": "chat.completion", "created": 1_700_000_000,
            "model": body["model"], "system_fingerprint": "fp_standin",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop"}],
            "usage": {"prompt_tokens": len(words), "completion_tokens": 5,
                      "total_tokens": len(words) + 5,
                      "prompt_tokens_details": {"cached_tokens": cached}},
        })  # fmt: skip

    async def responses(self, request: Request) -> Response:
        body = json.loads(await request.body())
        n = self._record(request, body)
        items = body["input"] if isinstance(body["input"], list) else [
            {"role": "user", "content": body["input"]}
        ]  # fmt: skip
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self._kept:
            error = {"message": f"Previous response with id '{previous}' not found.",
                     "type": "invalid_request_error", "param": "previous_response_id",
                     "code": "previous_response_not_found"}  # fmt: skip
            return JSONResponse({"error": error}, status_code=404)
        conversation = [*self._kept.get(previous or "", []), *items]
        words = _words(body.get("instructions") or "") + _words(conversation)
        cached = self.cache.cached_tokens(body.get("prompt_cache_key"), words)
        text = f"answer #{n} to {_blocks_text(items[-1].get('content', ''))}"
        item = {"type": "message", "id": f"msg_{n:04d}", "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
        response = {
            "id": f"resp_{n:04d}", "object": "response", "created_at": 1_700_000_000,
            "status": "completed", "model": body["model"], "output": [item],
            "instructions": body.get("instructions"), "previous_response_id": previous,
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "error": None,
            "incomplete_details": None, "temperature": body.get("temperature"),
            "usage": {"input_tokens": len(words), "output_tokens": 5,
                      "total_tokens": len(words) + 5,
                      "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens_details": {"reasoning_tokens": 0}},
        }  # fmt: skip
        if body.get("store", True):
            self._kept[response["id"]] = [*conversation, item]
        if not body.get("stream"):
            return JSONResponse(response)
        return StreamingResponse(self._events(response), media_type="text/event-stream")

    async def _events(self, response: dict[str, Any]) -> AsyncIterator[bytes]:
        number = iter(range(1000))

        def frame(kind: str, **data: Any) -> bytes:
            event = {"type": kind, "sequence_number": next(number), **data}
            return f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode()

        opening = {**response, "status": "in_progress", "output": [], "usage": None}
        yield frame("response.created", response=opening)
        yield frame("response.in_progress", response=opening)
        item = response["output"][0]
        text = item["content"][0]["text"]
        yield frame("response.output_item.added", output_index=0,
                    item={**item, "status": "in_progress", "content": []})  # fmt: skip
        part = {"type": "output_text", "text": "", "annotations": []}
        yield frame("response.content_part.added", item_id=item["id"], output_index=0,
                    content_index=0, part=part)  # fmt: skip
        for i in range(0, len(text), 7):
            yield frame("response.output_text.delta", item_id=item["id"], output_index=0,
                        content_index=0, delta=text[i : i + 7], logprobs=[])  # fmt: skip
        yield frame("response.output_text.done", item_id=item["id"], output_index=0,
                    content_index=0, text=text, logprobs=[])  # fmt: skip
        yield frame("response.content_part.done", item_id=item["id"], output_index=0,
                    content_index=0, part={**part, "text": text})  # fmt: skip
        yield frame("response.output_item.done", output_index=0, item=item)
        yield frame("response.completed", response=response)
