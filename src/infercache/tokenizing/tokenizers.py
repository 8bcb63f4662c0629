"""Prompt → token ids the way a server tokenises it: the chat template renders the messages,
the rendered text is encoded. Earlier turns of a conversation render identically inside later
requests, so a conversation's requests extend each other's token sequences, which is what
prefix reuse needs.

Implementations of `PromptTokenizer`:
- `TemplateTokenizer`: a Hugging Face tokenizer (`tokenizer.json`, loaded with `tokenizers`
  only) with its chat template. `smollm2`, the default for text logs, is the packaged
  SmolLM2-135M-Instruct's: its tokenizer files alone are extracted from the GGUF once, under
  `data_dir/tokenizers/` (seconds; the model's conversion takes a minute and ~500 MB, and a
  gateway writing a redacted log in front of a provider never needs the weights).
- `Chars4Tokenizer` (`chars4`): ChatML rendering; each special marker is one token and every
  other run of text is cut into 4-byte pieces of its UTF-8 (ceil(bytes / 4) tokens). Counts
  are approximate, prefix structure is exact to within 3 bytes; for huge logs.

Why not `apply_chat_template` + `encode` per request: a byte-level BPE pre-tokenizer costs
time in every character and a template rendering costs more than the rest of preparing a
request (bench/README.md, Analyzer, design figures). Instead a request is rendered by frames
(chat_frames.py: the template's literal pieces, found once per role sequence) and encoded
through caches that rely on special tokens splitting a text into runs (cached_runs.py): a
shared system prompt or a repeated question costs dict lookups. When a tokenizer's added
tokens do not match verbatim (lstrip/rstrip/single_word/normalized flags), the whole rendered
text is encoded instead. A run the caches have not seen is encoded word by word when the
tokenizer is a plain byte-level BPE (byte_level_words.py).
Invariant (tests/analyze/test_tokenizers.py): `encode_messages(m) == encode(template(m))`.
Token ids are interned (one int object per id) so stored prompts share them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Container, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from infercache.errors import ConfigError
from infercache.tokenizing.byte_level_words import ByteLevelWords, TokenIds
from infercache.tokenizing.cached_runs import CachedRunEncoder
from infercache.tokenizing.chat_frames import (
    CHATML_SPECIALS,
    ChatMLRenderer,
    Renderer,
    TemplateRenderer,
    Turn,
    turns_of,
)

_CHARS4_PARTIAL_BASE = 1 << 32  # ids of a 1-3 byte tail: never equal to a full 4-byte piece
_CHARS4_SPECIAL_BASE = 1 << 34


class PromptTokenizer(Protocol):
    @property
    def name(self) -> str: ...

    def encode_messages(self, messages: Sequence[Mapping[str, Any]]) -> TokenIds:
        """Token ids of the rendered messages plus the assistant turn's opening."""
        ...

    def encode_turns(self, turns: Sequence[Turn]) -> TokenIds:
        """The same from (role, text) pairs (frames.turns_of)."""
        ...

    def count(self, text: str) -> int:
        """Tokens in a plain text (no template)."""
        ...

    @property
    def boundary_ids(self) -> Container[int]:
        """Ids of the tokens a prompt's structure breaks after: the special (added) tokens, a
        chat template's turn markers among them, and every token holding a newline."""
        ...


class TemplateTokenizer:
    """A Hugging Face `tokenizer.json` and its chat template (see the module docstring)."""

    def __init__(
        self, tokenizer: Any, template: str, *, name: str, cache_chars: int = 16 << 20
    ) -> None:
        self.name = name
        self.hf = tokenizer  # the `tokenizers.Tokenizer`
        self._ints: TokenIds = tuple(range(tokenizer.get_vocab_size(with_added_tokens=True)))
        self.renderer = TemplateRenderer(template)
        added = tokenizer.get_added_tokens_decoder()
        verbatim = all(
            not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in added.values()
        )
        specials = {t.content: i for i, t in added.items()}
        self._special_ids = frozenset(specials.values())
        self._boundaries: frozenset[int] | None = None
        self._words = ByteLevelWords.of(tokenizer, self._ints)
        self._segments = (
            CachedRunEncoder(self._encode_run, specials, cache_chars=cache_chars)
            if verbatim and specials
            else None
        )

    @classmethod
    def from_dir(cls, directory: Path, *, name: str | None = None) -> TemplateTokenizer:
        from tokenizers import Tokenizer

        path = directory / "tokenizer.json"
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust library raises a bare Exception
            raise ConfigError(f"cannot load a tokenizer from {path}: {exc}") from exc
        return cls(tokenizer, _chat_template(directory), name=name or f"hf:{directory.name}")

    def _encode_run(self, text: str) -> TokenIds:
        """A run without special tokens: word by word when the tokenizer allows it."""
        if self._words is not None:
            return self._words.encode(text)
        ids = self.hf.encode(text, add_special_tokens=False).ids
        return tuple(map(self._ints.__getitem__, ids))

    @property
    def boundary_ids(self) -> frozenset[int]:
        """Built on first use: every id of the vocabulary decoded once."""
        if self._boundaries is None:
            newline = {i for i in range(len(self._ints)) if "\n" in self.hf.decode([i])}
            self._boundaries = self._special_ids | newline
        return self._boundaries

    def encode_text(self, text: str) -> TokenIds:
        if self._segments is not None:
            return self._segments.encode(text)
        return self._encode_run(text)

    def encode_messages(self, messages: Sequence[Mapping[str, Any]]) -> TokenIds:
        return self.encode_turns(turns_of(messages))

    def encode_turns(self, turns: Sequence[Turn]) -> TokenIds:
        return _encode_turns(self.renderer, self._segments, self.encode_text, turns)

    def count(self, text: str) -> int:
        return len(self.encode_text(text))


def _encode_turns(
    renderer: Renderer,
    segments: CachedRunEncoder | None,
    encode_text: Callable[[str], TokenIds],
    turns: Sequence[Turn],
) -> TokenIds:
    """Frame and contents through the segment encoder when both exist, else render, encode."""
    frame = renderer.frame(turns) if segments is not None else None
    if frame is None or segments is None:
        ids: TokenIds = encode_text(renderer.render(turns))
        return ids
    return segments.encode_frame(frame, [text for _, text in turns])


def _chat_template(directory: Path) -> str:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config = directory / "tokenizer_config.json"
    try:
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{directory} has no readable chat template: {exc}") from exc
    if not isinstance(template, str):
        raise ConfigError(f"{directory} has no chat template (a string in {config.name})")
    return template


class Chars4Tokenizer:
    """ChatML rendering, 4-byte pieces of UTF-8 as tokens (see the module docstring)."""

    name = "chars4"

    def __init__(self, *, cache_chars: int = 16 << 20) -> None:
        self._intern: dict[int, int] = {}
        specials = {s: _CHARS4_SPECIAL_BASE + i for i, s in enumerate(CHATML_SPECIALS)}
        self.boundary_ids = _Chars4Boundaries(frozenset(specials.values()))
        self._segments = CachedRunEncoder(self._encode_run, specials, cache_chars=cache_chars)
        self.renderer = ChatMLRenderer()

    def _encode_run(self, text: str) -> TokenIds:
        data = text.encode("utf-8", "surrogatepass")
        full = len(data) // 4
        ids: list[int] = np.frombuffer(data, dtype="<u4", count=full).tolist() if full else []
        tail = data[4 * full :]
        if tail:
            ids.append(_CHARS4_PARTIAL_BASE + (len(tail) << 24 | int.from_bytes(tail, "little")))
        return tuple(map(self._intern.setdefault, ids, ids))

    def encode_messages(self, messages: Sequence[Mapping[str, Any]]) -> TokenIds:
        return self.encode_turns(turns_of(messages))

    def encode_turns(self, turns: Sequence[Turn]) -> TokenIds:
        return _encode_turns(self.renderer, self._segments, self._segments.encode, turns)

    def count(self, text: str) -> int:
        return -(-len(text.encode("utf-8", "surrogatepass")) // 4)


class _Chars4Boundaries:
    """chars4's special markers and the pieces holding a newline byte."""

    def __init__(self, specials: frozenset[int]) -> None:
        self._specials = specials

    def __contains__(self, token_id: object) -> bool:
        if not isinstance(token_id, int):
            return False
        if token_id in self._specials:
            return True
        if token_id >= _CHARS4_PARTIAL_BASE:  # a 1-3 byte tail: length << 24 | its bytes
            piece = token_id - _CHARS4_PARTIAL_BASE
            data = (piece & 0xFFFFFF).to_bytes(3, "little")[: piece >> 24]
        else:
            data = token_id.to_bytes(4, "little")
        return b"\n" in data


TOKENIZER_HELP = (
    "smollm2 (the packaged SmolLM2 tokenizer and chat template; the default for text logs), "
    "chars4 (fast approximation: 4 bytes a token), or a folder holding tokenizer.json and a "
    "chat template"
)


def load_tokenizer(spec: str, data_dir: Path) -> PromptTokenizer:
    """`smollm2`, `chars4`, or a tokenizer folder (see TOKENIZER_HELP)."""
    if spec == "chars4":
        return Chars4Tokenizer()
    if spec == "smollm2":
        from infercache.engine.weights import PACKAGED_MODEL_ID

        directory = packaged_tokenizer_dir(data_dir)
        return TemplateTokenizer.from_dir(directory, name=f"smollm2:{PACKAGED_MODEL_ID}")
    directory = Path(spec).expanduser()
    if not (directory / "tokenizer.json").is_file():
        raise ConfigError(f"--tokenizer {spec!r}: expected {TOKENIZER_HELP}")
    return TemplateTokenizer.from_dir(directory)


def packaged_tokenizer_dir(data_dir: Path) -> Path:
    """The packaged GGUF's tokenizer files (tokenizer.json, its config, the chat template),
    written once under `data_dir/tokenizers/`, keyed like the engine's converted models by the
    file's name, size and mtime; built aside and renamed into place."""
    from infercache.engine.weights import packaged_gguf, publish_directory

    gguf = packaged_gguf()
    stat = gguf.stat()
    target = data_dir / "tokenizers" / f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}"

    def extract(out: Path) -> None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(
            gguf.parent, gguf_file=gguf.name, local_files_only=True
        )
        tokenizer.save_pretrained(out)

    return publish_directory(target, extract)
