"""Choosing the next token from logits.

Greedy (temperature 0): the argmax, lowest id on ties, as transformers' greedy search does.
Otherwise softmax(logits / temperature), restricted to the nucleus: the most probable tokens
whose cumulative probability reaches `top_p` (always at least one), drawn with the request's
own `torch.Generator` seeded from `seed`, so a seeded request is reproducible whatever else the
engine serves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens whatever (benchmarks)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 <= self.top_p <= 1:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    def __init__(self, params: SamplingParams) -> None:
        """An unseeded request is seeded 0 here: the engine draws a seed for those first."""
        self._params = params
        self._generator: torch.Generator | None = None
        if not params.greedy:
            self._generator = torch.Generator().manual_seed(params.seed or 0)

    def __call__(self, logits: torch.Tensor) -> int:
        if self._generator is None:
            return int(torch.argmax(logits))
        with torch.inference_mode():
            probs = torch.softmax(logits.float() / self._params.temperature, dim=-1)
            if self._params.top_p < 1:
                sorted_probs, order = torch.sort(probs, descending=True)
                before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
                outside = before >= self._params.top_p
                outside[0] = False  # the most probable token always stays
                sorted_probs[outside] = 0
                choice = torch.multinomial(sorted_probs, 1, generator=self._generator)
                return int(order[choice])
            return int(torch.multinomial(probs, 1, generator=self._generator))
