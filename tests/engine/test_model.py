"""Our Llama forward against transformers' LlamaForCausalLM (the reference), and the attention
alignment of a suffix computed over cached KV."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from infercache.engine.model import LlamaModel
from infercache.engine.tokenizer import ChatTokenizer
from infercache.engine.weights import load_checkpoint

from .conftest import TinyFactory

TOLERANCE = 1e-4


def hf_logits(directory: Path, ids: list[int]) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32, local_files_only=True)
    with torch.inference_mode():
        logits: torch.Tensor = hf.eval()(torch.tensor([ids])).logits[0]
    return logits


def ours(directory: Path) -> LlamaModel:
    ck = load_checkpoint(directory)
    return LlamaModel(ck.spec, ck.tensors)


VARIANTS: list[dict[str, Any]] = [
    {},
    {"tie_word_embeddings": False},
    {"attention_bias": True, "mlp_bias": True},
    {"num_key_value_heads": 4},  # plain multi-head attention
    {"num_key_value_heads": 1},  # multi-query attention
    {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    {
        "rope_parameters": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
            "rope_theta": 500000.0,
        }
    },
    {
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 128,
            "rope_theta": 10000.0,
        }
    },
]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: ",".join(v) or "default")
def test_forward_matches_transformers_on_tiny_checkpoints(
    make_tiny_llama: TinyFactory, variant: dict[str, Any]
) -> None:
    directory = make_tiny_llama(seed=3, **variant)
    ids = [
        int(i) for i in torch.randint(0, 420, (150,), generator=torch.Generator().manual_seed(1))
    ]
    expected = hf_logits(directory, ids)
    model = ours(directory)
    got = model.forward(torch.tensor(ids), model.new_workspace(), 0, all_logits=True)
    assert (got - expected).abs().max().item() < TOLERANCE


def test_suffix_over_cached_prefix_equals_one_full_pass(tiny_dir: Path) -> None:
    model = ours(tiny_dir)
    ids = torch.randint(0, 420, (90,), generator=torch.Generator().manual_seed(2))
    full = model.forward(ids, model.new_workspace(), 0, all_logits=True)
    ws = model.new_workspace()
    model.forward(ids[:50], ws, 0)
    suffix = model.forward(ids[50:80], ws, 50, all_logits=True)  # a multi-token suffix
    steps = [model.forward(ids[i : i + 1], ws, i) for i in range(80, 90)]  # then decode
    assert (suffix - full[50:80]).abs().max().item() < TOLERANCE
    assert (torch.stack(steps) - full[80:90]).abs().max().item() < TOLERANCE


def test_a_top_left_causal_mask_would_be_caught(tiny_dir: Path) -> None:
    """Guards the test above: a suffix attending only to its own positions differs."""
    model = ours(tiny_dir)
    ids = torch.randint(0, 420, (60,), generator=torch.Generator().manual_seed(4))
    full = model.forward(ids, model.new_workspace(), 0, all_logits=True)
    alone = model.forward(ids[40:], model.new_workspace(), 0, all_logits=True)
    assert (alone - full[40:]).abs().max().item() > 1e-2


def test_forward_refuses_positions_beyond_the_model(tiny_dir: Path) -> None:
    model = ours(tiny_dir)
    ws = model.new_workspace()
    with pytest.raises(ValueError, match="beyond"):
        model.forward(torch.zeros(513, dtype=torch.int64), ws, 0)
    with pytest.raises(ValueError, match="workspace has 0"):
        model.forward(torch.zeros(1, dtype=torch.int64), ws, 5)


@pytest.mark.slow
def test_smollm2_forward_matches_transformers(
    smol_model: LlamaModel, smol_hf: Any, smol_tokenizer: ChatTokenizer
) -> None:
    text = "Explain how a radix tree stores shared prefixes of token sequences. " * 12
    ids = smol_tokenizer.encode_chat([{"role": "user", "content": text}])
    with torch.inference_mode():
        expected = smol_hf(torch.tensor([ids])).logits[0]
    got = smol_model.forward(torch.tensor(ids), smol_model.new_workspace(), 0, all_logits=True)
    diff = (got - expected).abs().max().item()
    print(f"max |logit difference| ours vs transformers over {len(ids)} positions: {diff:.2e}")
    assert diff < 1e-3
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.slow
def test_smollm2_greedy_tokens_match_transformers_generate(
    smol_model: LlamaModel, smol_hf: Any, smol_tokenizer: ChatTokenizer
) -> None:
    ids = smol_tokenizer.encode_chat(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    new_tokens = 12
    with torch.inference_mode():
        out = smol_hf.generate(
            torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, eos_token_id=None
        )
    expected = out[0, len(ids) :].tolist()
    ws = smol_model.new_workspace()
    logits = smol_model.forward(torch.tensor(ids), ws, 0)
    got = []
    for _ in range(new_tokens):
        got.append(int(logits.argmax()))
        logits = smol_model.forward(torch.tensor(got[-1:]), ws, len(ids) + len(got) - 1)
    assert got == expected
