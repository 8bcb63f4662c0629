"""Text → token ids through caches, using what tokenizers guarantee about special tokens.

A tokenizer matches its added (special) tokens before anything else, so a text's ids are the
ids of the runs between special tokens, concatenated, with each special's own id in between.
`CachedRunEncoder` relies on that:
- `encode(text)`: split at the specials, look each run up in the run cache, encode the misses.
- `encode_frame(frame, contents)`: the same result for `frames.interleave(frame, contents)`
  without building or scanning the whole text. Each literal of the frame is split once (and
  remembered): the run before its first special, the ids from its first to its last special,
  the run after its last special. A request then only joins each content with the literal text
  around it into the run that holds it, and looks that run up. A content that itself contains
  a special token is still right: a run is split at specials when it is first encoded.
The run cache has two generations (a cheap LRU approximation): runs go to `_new`; when that
holds `cache_chars / 2` characters it becomes `_old` and a new `_new` starts; a hit in `_old`
moves the run back. At most `cache_chars` characters are held; a run longer than
`cache_chars / 16` is never kept. Not thread-safe (one owner).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from infercache.tokenizing.byte_level_words import TokenIds


class _Literal(NamedTuple):
    head: str  # text before the first special; the whole literal when it has none
    middle: TokenIds  # ids from its first special to its last, inclusive
    tail: str | None  # text after the last special; None when it has no special


def alternation(literals: Iterable[str]) -> re.Pattern[str]:
    """A capturing regex matching any of `literals`, longest first. Their common prefix is
    factored out: `re` then scans for that literal quickly."""
    alternatives = sorted(literals, key=len, reverse=True)
    head = os.path.commonprefix(alternatives)  # noqa: RUF071 (a string prefix, not a path)
    tails = "|".join(re.escape(a[len(head) :]) for a in alternatives)
    return re.compile(f"({re.escape(head)}(?:{tails}))")


class CachedRunEncoder:
    def __init__(
        self,
        encode_run: Callable[[str], TokenIds],
        specials: Mapping[str, int],
        *,
        cache_chars: int = 16 << 20,
        max_frames: int = 4096,
    ) -> None:
        if not specials:
            raise ValueError("a segment encoder needs at least one special token")
        pattern = alternation(specials)
        self._split = pattern.split
        self._search = pattern.search
        self._specials = dict(specials)
        self._encode_run = encode_run
        self._half_chars = max(1, cache_chars // 2)
        self._new: dict[str, TokenIds] = {}
        self._old: dict[str, TokenIds] = {}
        self._new_chars = 0
        self._frames: dict[Sequence[str], tuple[_Literal, ...]] = {}
        self._max_frames = max_frames

    def encode(self, text: str) -> TokenIds:
        parts = self._split(text)
        cache, specials = self._new, self._specials
        out: list[int] = []
        last = len(parts) - 1
        for i in range(0, len(parts), 2):
            run = parts[i]
            if run:
                ids = cache.get(run)
                out += ids if ids is not None else self._miss(run, pure=True)
            if i < last:
                out.append(specials[parts[i + 1]])
        return tuple(out)

    def encode_frame(self, frame: Sequence[str], contents: Sequence[str]) -> TokenIds:
        literals = self._frames.get(frame)
        if literals is None:
            literals = self._literals(frame)
        cache = self._new
        out: list[int] = []
        pending = ""
        for i, literal in enumerate(literals):
            if i:
                pending += contents[i - 1]
            pending += literal.head
            if literal.tail is None:
                continue
            if pending:
                ids = cache.get(pending)
                out += ids if ids is not None else self._miss(pending, pure=False)
            out += literal.middle
            pending = literal.tail
        if pending:
            ids = cache.get(pending)
            out += ids if ids is not None else self._miss(pending, pure=False)
        return tuple(out)

    def _literals(self, frame: Sequence[str]) -> tuple[_Literal, ...]:
        literals = []
        for piece in frame:
            parts = self._split(piece)
            if len(parts) == 1:
                literals.append(_Literal(piece, (), None))
                continue
            middle: list[int] = []
            for i in range(1, len(parts) - 1):
                if i % 2:
                    middle.append(self._specials[parts[i]])
                elif parts[i]:
                    middle += self._miss(parts[i], pure=True)
            literals.append(_Literal(parts[0], tuple(middle), parts[-1]))
        if len(self._frames) >= self._max_frames:
            self._frames.clear()
        self._frames[tuple(frame)] = result = tuple(literals)
        return result

    def _miss(self, run: str, *, pure: bool) -> TokenIds:
        """Ids of a run not in `_new`: from `_old`, else encoded (split at any special it
        holds, unless the caller knows it has none)."""
        ids = self._old.get(run)
        if ids is None:
            ids = self._encode_run(run) if pure or not self._search(run) else self.encode(run)
        if len(run) <= self._half_chars // 8:
            self._new[run] = ids
            self._new_chars += len(run)
            if self._new_chars > self._half_chars:
                self._old, self._new, self._new_chars = self._new, {}, 0
        return ids
