"""Weight formats: how the model's projections and its token-embedding table are held.

A checkpoint's weights are read as float32 and turned, once at load, into the format's own
copy; the float32 tensors are not kept (the checkpoint files are memory-mapped, so what is
only read to build a copy never stays resident). Every projection matrix is held once, in one
layout, whatever the batch size; the embedding table (shared with the LM head by tied
checkpoints) is held once more in a row-indexed form for the lookup.

- `fp32`: the reference. Float32 weights, oneDNN-prepacked for an engine that batches
  (linear.py `Fp32Linear`); a float32 embedding table.
- `fp16`: every projection, the LM head included, as float16 weights in FBGEMM's fp16 GEMM
  with float32 activations (linear.py `Fp16Linear`); a float16 embedding table, widened to the
  activation dtype on lookup. Half the bytes a token; the only rounding is each weight's, to
  11 significant bits (chosen by measurement: bench/README.md, "Weight formats").

The format is part of the model's identity: `weights.served_version` names it in the version
every cache keys on. Formats are values of the `WeightFormat` protocol, so a bench can pass a
candidate of its own to `LlamaModel` (bench/weight_formats.py does).
"""

from __future__ import annotations

from typing import Protocol

import torch

from infercache.engine.config import WeightsName
from infercache.engine.linear import Fp16Linear, Fp32Linear, Projection, can_pack, has_fp16_gemm
from infercache.errors import ConfigError


class WeightFormat(Protocol):
    @property
    def name(self) -> str: ...

    def projection(
        self, weight: torch.Tensor, bias: torch.Tensor | None, *, packed: bool
    ) -> Projection:
        """A transformer layer's projection of float32 `weight` `[out, in]`; `packed`: steps
        will multiply several rows."""
        ...

    def head(self, weight: torch.Tensor, *, packed: bool) -> Projection:
        """The LM head (float32 `[vocab, hidden]`): the logits every token is chosen from."""
        ...

    def embedding(self, weight: torch.Tensor) -> torch.Tensor:
        """The lookup table held for float32 `weight` `[vocab, hidden]`."""
        ...


class Fp32Weights:
    name = "fp32"

    def projection(
        self, weight: torch.Tensor, bias: torch.Tensor | None, *, packed: bool
    ) -> Projection:
        return Fp32Linear(weight, bias, packed=packed and can_pack())

    def head(self, weight: torch.Tensor, *, packed: bool) -> Projection:
        return self.projection(weight, None, packed=packed)

    def embedding(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.float().contiguous()


class Fp16Weights:
    name = "fp16"

    def projection(
        self, weight: torch.Tensor, bias: torch.Tensor | None, *, packed: bool
    ) -> Projection:
        return Fp16Linear(weight, bias)

    def head(self, weight: torch.Tensor, *, packed: bool) -> Projection:
        return Fp16Linear(weight, None)

    def embedding(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.to(torch.float16).contiguous()


def weight_format(name: WeightsName | str) -> WeightFormat:
    """The format called `name`; a `ConfigError` when unknown or not served by this torch."""
    if name == "fp32":
        return Fp32Weights()
    if name == "fp16":
        if not has_fp16_gemm():
            raise ConfigError("--weights fp16 needs a PyTorch build with FBGEMM (x86); use fp32")
        return Fp16Weights()
    raise ConfigError(f"unknown weight format {name!r}")
