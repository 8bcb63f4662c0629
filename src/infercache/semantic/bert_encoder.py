"""A BERT encoder's forward pass in a few torch calls, for sentence embedding (MiniLM).

The packaged all-MiniLM-L6-v2 is a BERT (6 layers, hidden 384, 12 heads, erf GELU, post-layer
norm). Run through transformers' `BertModel`, about a quarter of one short question's CPU time
goes to module dispatch, mask building and dtype checks around ~60 small kernels rather than
to the products themselves (bench/README.md, "Semantic lookup speed": 14.3 → 10.4 ms CPU).
This module computes the same function from the same safetensors weights with the same
tokenizer file, nothing else:

    x = LayerNorm(word[ids] + position[0..L) + token_type[0])
    per layer:  q, k, v = split(x @ Wqkv + b)                (one GEMM for the three)
                x = LayerNorm(x + attention(q, k, v) @ Wo + bo)
                x = LayerNorm(x + gelu(x @ Wi + bi) @ Wo2 + bo2)
    vector = L2(mean of x over the text's tokens)

Weights are stored transposed and contiguous once at load, so every product is one `addmm`.
A batch is padded to its longest text (never to a fixed length); padded keys are masked out of
attention and padded rows out of the mean, so a text's vector does not depend on its batch.
A batch of one has no padding and builds no mask. Texts longer than `max_tokens` word pieces
are truncated (the tokenizer file's own padding and truncation settings are replaced).
The vectors equal transformers' (mean pooling, then L2, as sentence-transformers does) to
float rounding: tests/semantic/test_bert_encoder.py checks 1 - cosine <= 1e-5 on fixed texts.
Not thread-safe by itself: the embedder calls it from its one torch thread.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from infercache.errors import ConfigError


class _Layer(NamedTuple):
    qkv_w: Any
    qkv_b: Any
    out_w: Any
    out_b: Any
    norm1_w: Any
    norm1_b: Any
    up_w: Any
    up_b: Any
    down_w: Any
    down_b: Any
    norm2_w: Any
    norm2_b: Any


class BertEncoder:
    """Token ids → mean-pooled, L2-normalised sentence vectors; see the module docstring."""

    def __init__(self, directory: Path, *, max_tokens: int) -> None:
        import torch
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        if config.get("hidden_act") != "gelu" or config.get("model_type") != "bert":
            raise ConfigError(f"{directory} is not a BERT encoder with erf GELU")
        self._torch = torch
        self.dim = int(config["hidden_size"])
        self._heads = int(config["num_attention_heads"])
        self._eps = float(config["layer_norm_eps"])
        self._max_tokens = min(max_tokens, int(config["max_position_embeddings"]))
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(self._max_tokens)
        weights = load_file(str(directory / "model.safetensors"))
        self._word = weights["embeddings.word_embeddings.weight"]
        self._position = weights["embeddings.position_embeddings.weight"]
        self._token_type = weights["embeddings.token_type_embeddings.weight"][0]
        self._norm_w = weights["embeddings.LayerNorm.weight"]
        self._norm_b = weights["embeddings.LayerNorm.bias"]
        self._layers = [
            _layer(weights, f"encoder.layer.{i}.") for i in range(int(config["num_hidden_layers"]))
        ]

    def embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """One batch: rows in the order of `texts`, unit length (float32)."""
        torch = self._torch
        encodings = self._tokenizer.encode_batch(texts)
        lengths = [len(e.ids) for e in encodings]
        width = max(lengths)
        ids = np.zeros((len(texts), width), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            ids[row, : lengths[row]] = encoding.ids
        with torch.inference_mode():
            keep = None
            if min(lengths) < width:
                keep = torch.from_numpy(np.arange(width)[None, :] < np.array(lengths)[:, None])
            hidden = self._forward(torch.from_numpy(ids), keep)
            if keep is None:
                pooled = hidden.mean(dim=1)
            else:
                weight = keep.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weight).sum(dim=1) / weight.sum(dim=1)
            pooled = pooled / pooled.norm(dim=1, keepdim=True).clamp(min=1e-12)
        out: npt.NDArray[np.float32] = np.ascontiguousarray(pooled.numpy(), dtype=np.float32)
        return out

    def _forward(self, ids: Any, keep: Any) -> Any:
        """Hidden states (batch, width, dim) of the last layer."""
        torch = self._torch
        functional = torch.nn.functional
        batch, width = ids.shape
        dim, heads = self.dim, self._heads
        x = self._word[ids] + self._position[:width] + self._token_type
        x = functional.layer_norm(x, (dim,), self._norm_w, self._norm_b, self._eps)
        x = x.reshape(batch * width, dim)
        mask = None if keep is None else keep[:, None, None, :]
        for layer in self._layers:
            qkv = torch.addmm(layer.qkv_b, x, layer.qkv_w)
            qkv = qkv.view(batch, width, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
            context = functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], mask)
            context = context.transpose(1, 2).reshape(batch * width, dim)
            attended = torch.addmm(layer.out_b, context, layer.out_w).add_(x)
            x = functional.layer_norm(attended, (dim,), layer.norm1_w, layer.norm1_b, self._eps)
            up = functional.gelu(torch.addmm(layer.up_b, x, layer.up_w))
            down = torch.addmm(layer.down_b, up, layer.down_w).add_(x)
            x = functional.layer_norm(down, (dim,), layer.norm2_w, layer.norm2_b, self._eps)
        return x.view(batch, width, dim)


def _layer(weights: dict[str, Any], prefix: str) -> _Layer:
    import torch

    def linear(name: str) -> tuple[Any, Any]:
        return weights[f"{prefix}{name}.weight"].t().contiguous(), weights[f"{prefix}{name}.bias"]

    parts = [linear(f"attention.self.{p}") for p in ("query", "key", "value")]
    out_w, out_b = linear("attention.output.dense")
    up_w, up_b = linear("intermediate.dense")
    down_w, down_b = linear("output.dense")
    return _Layer(
        qkv_w=torch.cat([w for w, _ in parts], dim=1).contiguous(),
        qkv_b=torch.cat([b for _, b in parts]),
        out_w=out_w,
        out_b=out_b,
        norm1_w=weights[f"{prefix}attention.output.LayerNorm.weight"],
        norm1_b=weights[f"{prefix}attention.output.LayerNorm.bias"],
        up_w=up_w,
        up_b=up_b,
        down_w=down_w,
        down_b=down_b,
        norm2_w=weights[f"{prefix}output.LayerNorm.weight"],
        norm2_b=weights[f"{prefix}output.LayerNorm.bias"],
    )
