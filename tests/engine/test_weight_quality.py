"""The default weight format's quality gate (issue 28, acceptance 3), on the packaged model:
perplexity of a public text within 3% of fp32's, and on chat prompts the first 16 greedy
tokens equal fp32's for at least 80% of them. The bench runs all 200 prompts and the whole
text (bench/weight_formats.py); this test takes the first 16 prompts (one batch) and 192
tokens of the text."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infercache.engine.config import DEFAULT_WEIGHTS
from infercache.engine.model import LlamaModel
from infercache.engine.quality import MAX_PERPLEXITY_CHANGE, answers, compare
from infercache.engine.weights import Checkpoint

DATA = Path(__file__).parent / "data"
PROMPTS = 16
TEXT_TOKENS = 192
NEW_TOKENS = 16


@pytest.mark.slow
def test_the_default_format_passes_the_quality_gate_against_fp32(
    smol_checkpoint: Checkpoint, smol_model: LlamaModel, smol_served_model: LlamaModel
) -> None:
    assert smol_model.weights.name == "fp32"
    tokenizer = smol_checkpoint.tokenizer
    text = torch.tensor(tokenizer((DATA / "hwu64_intents.txt").read_text())["input_ids"])
    lines = (DATA / "banking77_prompts.txt").read_text().splitlines()[:PROMPTS]
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": line}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
        for line in lines
    ]
    candidate = smol_served_model
    assert candidate.weights.name == DEFAULT_WEIGHTS != "fp32"
    reference = answers(smol_model, text[:TEXT_TOKENS], prompts, NEW_TOKENS)
    got = answers(candidate, text[:TEXT_TOKENS], prompts, NEW_TOKENS)
    result = compare(got, reference)
    print(
        f"\n{DEFAULT_WEIGHTS} vs fp32: perplexity {got.perplexity:.3f} vs "
        f"{reference.perplexity:.3f} ({result.perplexity_change:+.2%}); "
        f"{result.identical}/{result.prompts} prompts with fp32's {NEW_TOKENS} greedy tokens"
    )
    assert abs(result.perplexity_change) <= MAX_PERPLEXITY_CHANGE
    assert result.identical_share >= 0.8
    assert result.passes
    # The comparison can tell formats apart: the logits are not fp32's bit for bit.
    ids = torch.tensor(prompts[0])
    with torch.inference_mode():
        a = smol_model.forward(ids, smol_model.new_workspace(len(ids)), 0)
        b = candidate.forward(ids, candidate.new_workspace(len(ids)), 0)
    assert not torch.equal(a, b)
