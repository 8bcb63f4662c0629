"""The engine's OpenAI response shapes, for chat completions and the legacy completions API.

`ResponseMeta.kind` says which API a request came through, and so which shapes answer it:

- `chat.completion`: `completion()` gives `{"object": "chat.completion", "choices": [{"message":
  {"role": "assistant", "content": ...}}]}`; `ChunkStream` gives `chat.completion.chunk`s: a
  role chunk first, then `delta.content` pieces, then a chunk with the finish reason.
- `text_completion` (legacy `/v1/completions`): `completion()` gives `{"object":
  "text_completion", "choices": [{"text": ...}]}`; `ChunkStream` gives `text_completion` chunks
  (no role chunk), a `text` piece each, then one with the finish reason and empty text.

Both: `system_fingerprint` is the model version, `usage.prompt_tokens_details.cached_tokens`
the reused prompt tokens; with `include_usage`, every chunk carries `"usage": null` and a last
chunk with no choices carries the usage, as OpenAI streams it. A cancelled generation has no
finish reason (it was cut off, like an interrupted stream).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from infercache.engine.accounting import RequestStats
from infercache.engine.sequence import GenerationResult

Kind = Literal["chat.completion", "text_completion"]


@dataclass(frozen=True, slots=True)
class ResponseMeta:
    id: str
    created: int
    model: str
    system_fingerprint: str
    kind: Kind = "chat.completion"


def usage(stats: RequestStats) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def _finish_reason(result: GenerationResult) -> str | None:
    return None if result.finish_reason == "cancelled" else result.finish_reason


def _base(meta: ResponseMeta, obj: str) -> dict[str, Any]:
    return {
        "id": meta.id,
        "object": obj,
        "created": meta.created,
        "model": meta.model,
        "system_fingerprint": meta.system_fingerprint,
    }


def completion(meta: ResponseMeta, result: GenerationResult) -> dict[str, Any]:
    """The whole answer: a `chat.completion`, or a `text_completion` for the legacy API."""
    choice: dict[str, Any] = {"index": 0}
    if meta.kind == "text_completion":
        choice["text"] = result.text
    else:
        choice["message"] = {"role": "assistant", "content": result.text}
    choice |= {"logprobs": None, "finish_reason": _finish_reason(result)}
    return {**_base(meta, meta.kind), "choices": [choice], "usage": usage(result.stats)}


class ChunkStream:
    """The chunks of one streamed answer (`chat.completion.chunk`s, or legacy
    `text_completion` chunks)."""

    def __init__(self, meta: ResponseMeta, *, include_usage: bool) -> None:
        self._text = meta.kind == "text_completion"
        self._base = _base(meta, "text_completion" if self._text else "chat.completion.chunk")
        self._include_usage = include_usage

    def _chunk(self, piece: str | dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        choice["text" if self._text else "delta"] = piece
        choice |= {"logprobs": None, "finish_reason": finish_reason}
        chunk = {**self._base, "choices": [choice]}
        if self._include_usage:
            chunk["usage"] = None  # as OpenAI: null on every chunk but the last
        return chunk

    def start(self) -> list[dict[str, Any]]:
        """The chunks sent before any text: the assistant's role (none for the legacy API)."""
        return [] if self._text else [self._chunk({"role": "assistant", "content": ""}, None)]

    def content(self, text: str) -> dict[str, Any]:
        return self._chunk(text if self._text else {"content": text}, None)

    def finish(self, result: GenerationResult) -> list[dict[str, Any]]:
        chunks = [self._chunk("" if self._text else {}, _finish_reason(result))]
        if self._include_usage:
            chunks.append({**self._base, "choices": [], "usage": usage(result.stats)})
        return chunks
