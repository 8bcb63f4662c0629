"""The MiniLM embedder's own BERT forward (bert_encoder.py) gives the vectors transformers'
BertModel gives: the path the embedder used before, computed here as it was (transformers'
tokenizer with padding to the batch's longest, BertModel, attention-masked mean, L2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infercache.semantic.bert_encoder import BertEncoder
from infercache.semantic.embedder import MiniLMEmbedder, package_model_dir

pytestmark = pytest.mark.slow

TEXTS = [
    "How do I reset my card PIN?",
    "hi",
    "",
    "Where is my card? It hasn't arrived yet and it has been two weeks.",
    "What's the exchange rate for EUR → GBP today, 2026-12-06?",
    "Ünïcödé façade naïve café, 東京 and emojis 🙂 too",
    "Tell me a joke about dogs.",
    "   spaces   and\ttabs\nand newlines   ",
    # longer than 256 word pieces: truncated the same way
    " ".join(f"word{i} is followed by another sentence about banking" for i in range(60)),
]


def _model_dir() -> Path:
    return package_model_dir(MiniLMEmbedder.MODULE, MiniLMEmbedder.DISTRIBUTION)


@pytest.fixture(scope="module")
def transformers_model() -> tuple[Any, Any]:
    """transformers' tokenizer and BertModel, as the embedder loaded them before."""
    from transformers import AutoModel, AutoTokenizer

    directory = _model_dir()
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    return tokenizer, AutoModel.from_pretrained(directory, local_files_only=True).eval()


def _transformers_vectors(
    parts: tuple[Any, Any], texts: list[str], max_tokens: int
) -> np.ndarray[Any, Any]:
    """The embedder's former path, verbatim: one padded batch through BertModel."""
    import torch

    tokenizer, model = parts
    encoded = tokenizer(
        texts, padding=True, truncation=True, max_length=max_tokens, return_tensors="pt"
    )
    with torch.inference_mode():
        hidden = model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    vectors = pooled.numpy().astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def reference(transformers_model: tuple[Any, Any]) -> np.ndarray[Any, Any]:
    return _transformers_vectors(transformers_model, TEXTS, 256)


@pytest.fixture(scope="module")
def encoder() -> BertEncoder:
    return BertEncoder(_model_dir(), max_tokens=256)


def test_one_text_at_a_time_matches_transformers(
    encoder: BertEncoder, reference: np.ndarray[Any, Any]
) -> None:
    ours = np.concatenate([encoder.embed([t]) for t in TEXTS])
    assert ours.dtype == np.float32
    assert ours.shape == reference.shape
    distance = 1.0 - np.sum(ours * reference, axis=1)
    assert float(np.max(np.abs(distance))) <= 1e-5, distance


def test_a_padded_batch_matches_transformers(
    encoder: BertEncoder, reference: np.ndarray[Any, Any]
) -> None:
    ours = encoder.embed(list(TEXTS))
    distance = 1.0 - np.sum(ours * reference, axis=1)
    assert float(np.max(np.abs(distance))) <= 1e-5, distance


def test_the_embedder_matches_transformers_alone_and_batched(
    minilm: MiniLMEmbedder, reference: np.ndarray[Any, Any]
) -> None:
    alone = np.concatenate([minilm.embed([t]) for t in TEXTS])
    batched = minilm.embed(TEXTS)
    for ours in (alone, batched):
        distance = 1.0 - np.sum(ours * reference, axis=1)
        assert float(np.max(np.abs(distance))) <= 1e-5, distance


def test_truncation_cuts_at_max_tokens_as_transformers_does(
    encoder: BertEncoder, transformers_model: tuple[Any, Any]
) -> None:
    long_text = TEXTS[-1]
    short = BertEncoder(_model_dir(), max_tokens=32)
    ours = short.embed([long_text, "short one"])
    theirs = _transformers_vectors(transformers_model, [long_text, "short one"], 32)
    assert float(np.max(np.abs(1.0 - np.sum(ours * theirs, axis=1)))) <= 1e-5
    # and the cut matters: the untruncated vector is a different one
    full = encoder.embed([long_text])
    assert float(np.sum(full[0] * ours[0])) < 0.999
