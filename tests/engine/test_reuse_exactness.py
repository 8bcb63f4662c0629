"""Acceptance 1: with prefix reuse on, greedy outputs are token-identical to reuse off, on 50
requests of the packaged model that share prefixes: one system prompt with different questions,
and multi-turn conversations built turn by turn (each turn reusing the previous answer).
Both sides run step by step on one model (a runner with the prefix cache, one without); every
step's logits are compared. The model is the packaged one in the weight format the engine
serves by default (issue 28: reuse stays exact within a format)."""

from __future__ import annotations

import pytest
import torch

from infercache.clock import SystemClock
from infercache.engine.config import BatchLimits
from infercache.engine.model import LlamaModel
from infercache.engine.prefix_cache import PrefixCache
from infercache.engine.runner import Runner
from infercache.engine.sampling import SamplingParams
from infercache.engine.sequence import GenerationRequest
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


def step_both(warm: Runner, cold: Runner, prompt: list[int]) -> tuple[list[int], int, float]:
    """Greedy-decode the prompt on both runners in lock step; return the tokens, the reused
    prompt tokens and the max logit difference."""
    req = GenerationRequest(tuple(prompt), SamplingParams(NEW_TOKENS, temperature=0))
    w, c = warm.submit(req), cold.submit(req)
    diff = 0.0
    while warm.has_work() or cold.has_work():
        a, b = warm.step(), cold.step()
        assert a.logits is not None
        assert b.logits is not None
        diff = max(diff, (a.logits - b.logits).abs().max().item())
        assert int(a.logits.argmax()) == int(b.logits.argmax()), (
            f"greedy differs after {w.generated}"
        )
    assert w.generated == c.generated
    return list(w.generated), w.reused_tokens, diff


@pytest.mark.slow
def test_reuse_is_token_identical_to_recomputation_on_50_requests(
    smol_served_model: LlamaModel, smol_tokenizer: ChatTokenizer
) -> None:
    smol_model = smol_served_model
    cache = PrefixCache(smol_model.kv_shape, max_kv_bytes=256 * 2**20)
    one_step_prefill = BatchLimits(max_step_tokens=2048)  # both sides sample at each step
    warm, cold = (
        Runner(
            smol_model,
            smol_tokenizer,
            prefix_cache=prefix,
            clock=SystemClock(),
            max_context_tokens=2048,
            limits=one_step_prefill,
        )
        for prefix in (cache, None)
    )
    system = {"role": "system", "content": SYSTEM}
    worst, requests, reused, prompt_total = 0.0, 0, 0, 0

    def run(messages: list[dict[str, str]]) -> tuple[list[int], int]:
        nonlocal worst, requests, reused, prompt_total
        prompt = smol_tokenizer.encode_chat(messages)
        tokens, got, diff = step_both(warm, cold, prompt)
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
