"""Byte-level BPE text → ids word by word, through a cache of words.

A GPT-2-style byte-level BPE tokenizer (the packaged SmolLM2 one among them) cuts a text into
pre-tokens with one regex, maps each pre-token's UTF-8 bytes to printable characters, and runs
BPE inside each pre-token alone. So a text's ids are its pre-tokens' ids concatenated, and a
pre-token's ids never change: they are cached (two generations, at most `max_words` words).
The regex runs in the `regex` module's engine, which is several times faster here than the
Rust library's own pre-tokenizer (bench/README.md, Analyzer, design figures).

Used only when the tokenizer.json says exactly that: no normalizer, a `ByteLevel`
pre-tokenizer with its regex and without a prefix space, a `BPE` model without dropout or word
affixes; `ByteLevelWords.of(tokenizer)` is None otherwise (and without the `regex` module).
tests/analyze/test_tokenizers.py checks it against the library's own `encode`.
"""

from __future__ import annotations

import json
from typing import Any

TokenIds = tuple[int, ...]  # a text's token ids, in order
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


class ByteLevelWords:
    def __init__(
        self, model: Any, ints: TokenIds, pattern: Any, *, max_words: int = 1 << 20
    ) -> None:
        self._tokenize = model.tokenize
        self._ints = ints
        self._findall = pattern.findall
        self._bytes = [bytes_to_unicode()[b] for b in range(256)]
        self._half = max(1, max_words // 2)
        self._new: dict[str, TokenIds] = {}
        self._old: dict[str, TokenIds] = {}

    @classmethod
    def of(cls, tokenizer: Any, ints: TokenIds) -> ByteLevelWords | None:
        try:
            import regex  # type: ignore[import-untyped]
        except ImportError:
            return None
        config = json.loads(tokenizer.to_str())
        pre, model = config.get("pre_tokenizer") or {}, config.get("model") or {}
        plain_byte_level = (
            config.get("normalizer") is None
            and pre.get("type") == "ByteLevel"
            and pre.get("use_regex") is True
            and pre.get("add_prefix_space") is False
        )
        plain_bpe = (
            model.get("type") == "BPE"
            and model.get("dropout") is None
            and not model.get("continuing_subword_prefix")
            and not model.get("end_of_word_suffix")
        )
        if not (plain_byte_level and plain_bpe):
            return None
        return cls(tokenizer.model, ints, regex.compile(GPT2_PATTERN))

    def encode(self, text: str) -> TokenIds:
        out: list[int] = []
        new = self._new
        for word in self._findall(text):
            ids = new.get(word)
            out += ids if ids is not None else self._miss(word)
        return tuple(out)

    def _miss(self, word: str) -> TokenIds:
        ids = self._old.get(word)
        if ids is None:
            mapped = "".join([self._bytes[b] for b in word.encode("utf-8", "surrogatepass")])
            ints = self._ints
            ids = tuple([ints[token.id] for token in self._tokenize(mapped)])
        self._new[word] = ids
        if len(self._new) >= self._half:
            self._old, self._new = self._new, {}
        return ids
