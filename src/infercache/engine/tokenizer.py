"""Text in and out of token ids: the chat template, and streaming detokenization.

`ChatTokenizer` renders OpenAI-style messages with the checkpoint's chat template and encodes
the text with the tokenizer's Rust backend (reentrant; the Python wrapper mutates padding and
truncation state and is not safe to share between threads). Template rendering holds a lock.

`IncrementalDetokenizer` turns generated ids into text deltas without ever splitting a
multi-byte character: it decodes a short window `[prefix_offset, len)` and emits the text past
the window's already-emitted part `[prefix_offset, read_offset)`, waiting while the window ends
in U+FFFD (an incomplete UTF-8 sequence). Decoding a window rather than single tokens also keeps
tokenizers that drop a leading space at a decode boundary (SentencePiece) correct.
Invariant: the concatenated deltas plus `flush()` equal `decode(all ids)`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any


class ChatTokenizer:
    def __init__(self, hf_tokenizer: Any, eos_token_ids: frozenset[int]) -> None:
        self._hf = hf_tokenizer
        self._backend = hf_tokenizer.backend_tokenizer
        self._template_lock = threading.Lock()
        self.eos_token_ids = eos_token_ids

    def encode_chat(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of `messages` followed by the assistant turn's opening."""
        with self._template_lock:
            text = self._hf.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
            )
        return self.encode(str(text))

    def encode(self, text: str) -> list[int]:
        return list(self._backend.encode(text, add_special_tokens=False).ids)

    def encode_prompt(self, text: str) -> list[int]:
        """A raw (legacy completions) prompt: with the tokenizer's own special tokens, such as a
        BOS for tokenizers that add one, as vLLM encodes it (the chat template spells its own)."""
        return list(self._backend.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._backend.decode(list(ids), skip_special_tokens=True))

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self)


class IncrementalDetokenizer:
    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(self._ids)

    def add(self, token_id: int) -> str:
        """Text completed by `token_id` (often "" mid-character)."""
        self._ids.append(token_id)
        prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tokenizer.decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tokenizer.decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]
