"""The quality gate of a weight format: how far its answers are from the reference format's.

- `perplexity(model, ids)`: exp of the mean negative log-likelihood of every token of `ids`
  given the ones before it, in one context (prefilled in chunks, every position's logits).
- `greedy_tokens(model, prompts, n)`: the first `n` greedy tokens of each prompt, a batch of
  prompts a step (`forward_batch`, as the engine runs them).
- `compare(candidate, reference)`: the perplexity change and the share of prompts whose `n`
  tokens are all the reference's; `passes` applies the gate (issue 28): perplexity within
  3% and at least 80% of prompts identical.

Used by tests/engine/test_weight_quality.py (a few prompts) and bench/weight_formats.py (all
200 of tests/engine/data/banking77_prompts.txt).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from infercache.engine.model import LlamaModel, Segment

MAX_PERPLEXITY_CHANGE = 0.03
MIN_IDENTICAL_SHARE = 0.8


@dataclass(frozen=True, slots=True)
class Answers:
    perplexity: float
    tokens: list[list[int]]


@dataclass(frozen=True, slots=True)
class QualityComparison:
    perplexity_change: float  # candidate / reference - 1
    identical: int  # prompts whose greedy tokens are all the reference's
    prompts: int
    mean_first_difference: float  # the first differing position, the token count if none

    @property
    def identical_share(self) -> float:
        return self.identical / self.prompts

    @property
    def passes(self) -> bool:
        return (
            abs(self.perplexity_change) <= MAX_PERPLEXITY_CHANGE
            and self.identical_share >= MIN_IDENTICAL_SHARE
        )


def perplexity(model: LlamaModel, ids: torch.Tensor, chunk: int = 256) -> float:
    with torch.inference_mode():
        workspace = model.new_workspace(len(ids))
        logits = torch.cat(
            [
                model.forward(ids[a : a + chunk], workspace, a, all_logits=True)
                for a in range(0, len(ids), chunk)
            ]
        )
        nll = -F.log_softmax(logits[:-1], -1).gather(1, ids[1:, None]).mean().item()
    return math.exp(nll)


def greedy_tokens(
    model: LlamaModel, prompts: Sequence[Sequence[int]], n: int, batch: int = 25
) -> list[list[int]]:
    out: list[list[int]] = []
    with torch.inference_mode():
        for i in range(0, len(prompts), batch):
            group = prompts[i : i + batch]
            spaces = [model.new_workspace(len(p) + n) for p in group]
            first = model.forward_batch(
                [Segment(torch.tensor(p), ws, 0) for p, ws in zip(group, spaces, strict=True)]
            )
            tokens = [[t] for t in first.argmax(-1).tolist()]
            for step in range(n - 1):
                segments = [
                    Segment(torch.tensor([t[-1]]), ws, len(p) + step)
                    for t, ws, p in zip(tokens, spaces, group, strict=True)
                ]
                chosen = model.forward_batch(segments).argmax(-1).tolist()
                for t, token in zip(tokens, chosen, strict=True):
                    t.append(token)
            out += tokens
    return out


def answers(
    model: LlamaModel, text_ids: torch.Tensor, prompts: Sequence[Sequence[int]], n: int
) -> Answers:
    return Answers(perplexity(model, text_ids), greedy_tokens(model, prompts, n))


def compare(candidate: Answers, reference: Answers) -> QualityComparison:
    pairs = list(zip(candidate.tokens, reference.tokens, strict=True))
    firsts = [
        next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))
        for a, b in pairs
    ]
    return QualityComparison(
        perplexity_change=candidate.perplexity / reference.perplexity - 1,
        identical=sum(a == b for a, b in pairs),
        prompts=len(pairs),
        mean_first_difference=sum(firsts) / max(1, len(firsts)),
    )
