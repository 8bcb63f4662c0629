"""`streamed(client, ...)`: a chat completion streamed through the official `openai` SDK with
usage in its last chunk, read to the end: its text and its chunks."""

from __future__ import annotations

from typing import Any

import openai
from openai.types.chat import ChatCompletionChunk


def streamed(client: openai.OpenAI, **ask: Any) -> tuple[str, list[ChatCompletionChunk]]:
    """`client.chat.completions.create(**ask)` streamed with `include_usage`: the text of its
    deltas and every chunk (the last one carries the usage)."""
    stream = client.chat.completions.create(
        **ask, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks
