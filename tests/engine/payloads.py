"""A KV payload for testing the radix tree without a model: it records which absolute token
positions of which sequence it stands for, so tests can check payloads against node keys."""

from __future__ import annotations

from dataclasses import dataclass

BYTES_PER_TOKEN = 10


@dataclass(frozen=True)
class TokenRun:
    sequence: tuple[int, ...]  # the whole token sequence this run was cut from
    start: int
    end: int

    @classmethod
    def of(cls, sequence: tuple[int, ...], start: int = 0) -> TokenRun:
        return cls(sequence, start, len(sequence))

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.sequence[self.start : self.end]

    @property
    def nbytes(self) -> int:
        return (self.end - self.start) * BYTES_PER_TOKEN

    def split(self, at_tokens: int) -> tuple[TokenRun, TokenRun]:
        assert 0 < at_tokens < self.end - self.start
        cut = self.start + at_tokens
        return TokenRun(self.sequence, self.start, cut), TokenRun(self.sequence, cut, self.end)
