"""Acceptance 1: with prefix reuse on, greedy outputs are token-identical to reuse off, on 50
requests of the packaged model that share prefixes: one system prompt with different questions,
and multi-turn conversations built turn by turn (each turn reusing the previous answer).
Both sides run step by step on one model; every step's logits are compared."""

from __future__ import annotations

import pytest
import torch

from infercache.clock import SystemClock
from infercache.engine.model import LlamaModel
from infercache.engine.prefix_cache import PrefixCache
from infercache.engine.runner import Generation, Runner
from infercache.engine.tokenizer import ChatTokenizer

NEW_TOKENS = 8
SYSTEM = (
    "You are a concise geography tutor. Answer in one short sentence, name the place first, and "
    "never add anything the question did not ask for. If you are unsure, say so plainly. "
) * 2
QUESTIONS = [
    f"What is the capital of {c}?"
    for c in [
        "France",
        "Italy",
        "Spain",
        "Japan",
        "Canada",
        "Egypt",
        "Kenya",
        "Peru",
        "Chile",
        "Norway",
        "Poland",
        "Greece",
        "India",
        "China",
        "Brazil",
        "Mexico",
        "Ghana",
        "Nepal",
        "Cuba",
        "Iran",
        "Iraq",
        "Fiji",
        "Laos",
        "Mali",
        "Oman",
        "Chad",
        "Togo",
        "Niger",
        "Qatar",
        "Yemen",
    ]
]
CONVERSATIONS = [
    ["Name a large river.", "Which countries does it cross?", "How long is it?", "Thanks!"],
    ["Name a tall mountain.", "Where is it?", "Who climbed it first?", "Is it still growing?"],
    ["What is a desert?", "Name the largest one.", "Is it hot?", "What lives there?"],
    ["What is an ocean?", "How many are there?", "Which is deepest?", "Why is it salty?"],
    ["Name an island nation.", "What language is spoken?", "Its capital?", "Population?"],
]


def step_both(warm: Generation, cold: Generation) -> tuple[list[int], float]:
    """Greedy-decode both generations in lock step; return the tokens and max logit diff."""
    tokens: list[int] = []
    diff = 0.0
    for _ in range(NEW_TOKENS):
        diff = max(diff, (warm.logits - cold.logits).abs().max().item())
        token, other = int(warm.logits.argmax()), int(cold.logits.argmax())
        assert token == other, f"greedy token differs after {tokens}"
        tokens.append(token)
        if len(tokens) < NEW_TOKENS:
            warm.advance(token)
            cold.advance(token)
    return tokens, diff


@pytest.mark.slow
def test_reuse_is_token_identical_to_recomputation_on_50_requests(
    smol_model: LlamaModel, smol_tokenizer: ChatTokenizer
) -> None:
    cache = PrefixCache(smol_model.kv_shape, max_kv_bytes=256 * 2**20)
    warm = Runner(
        smol_model, smol_tokenizer, prefix_cache=cache, clock=SystemClock(), max_context_tokens=2048
    )
    cold = Runner(
        smol_model, smol_tokenizer, prefix_cache=None, clock=SystemClock(), max_context_tokens=2048
    )
    system = {"role": "system", "content": SYSTEM}
    worst, requests, reused, prompt_total = 0.0, 0, 0, 0

    def run(messages: list[dict[str, str]]) -> tuple[list[int], int]:
        nonlocal worst, requests, reused, prompt_total
        prompt = smol_tokenizer.encode_chat(messages)
        with warm.start(prompt) as w, cold.start(prompt) as c:
            tokens, diff = step_both(w, c)
            got = w.reused_tokens
        worst, requests = max(worst, diff), requests + 1
        reused, prompt_total = reused + got, prompt_total + len(prompt)
        return tokens, got

    for question in QUESTIONS:
        run([system, {"role": "user", "content": question}])
    for turns in CONVERSATIONS:
        messages = [system]
        previous_prompt = 0
        for turn in turns:
            messages.append({"role": "user", "content": turn})
            tokens, got = run(messages)
            # The whole previous turn, its generated answer included, is reused.
            assert got >= previous_prompt
            previous_prompt = len(smol_tokenizer.encode_chat(messages))
            messages.append({"role": "assistant", "content": smol_tokenizer.decode(tokens)})

    print(
        f"\n{requests} requests, {reused}/{prompt_total} prompt tokens reused, "
        f"max |logit difference| reuse vs recompute: {worst:.2e}"
    )
    assert requests >= 50
    assert reused > prompt_total // 2
    assert worst < 1e-3
    assert torch.isfinite(torch.tensor(worst))
