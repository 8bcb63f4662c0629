"""Weight formats: how the model's projections and its token-embedding table are held.

A checkpoint's weights are read as float32 and turned, once at load, into the format's own
copy; the float32 tensors are not kept (the checkpoint files are memory-mapped, so what is
only read to build a copy never stays resident). Every projection matrix is held once, in one
layout, whatever the batch size; the embedding table (shared with the LM head by tied
checkpoints) is held once more in a row-indexed form for the lookup.

- `fp32`: the reference. Float32 weights, oneDNN-prepacked for an engine that batches
  (linear.py `Fp32Linear`); a float32 embedding table.
- `fp16`: every projection, the LM head included, as float16 weights in FBGEMM's fp16 GEMM
  with float32 activations (linear.py `Fp16Linear`). Half the bytes a token; the only rounding
  is each weight's, to 11 significant bits (chosen by measurement: bench/README.md, "Weight
  formats"). The embedding table is held as int8 in blocks of 32 along a row with a float32
  scale each (`Int8BlockTable`) when that holds it exactly, as it does for a checkpoint
  dequantised from GGUF Q8_0 (the packaged one): a quarter of the bytes and no rounding at
  all; otherwise as float16 (`DenseTable`). Either is widened on lookup.

The format is part of the model's identity: `weights.served_version` names it in the version
every cache keys on. Formats are values of the `WeightFormat` protocol, so a bench can pass a
candidate of its own to `LlamaModel` (bench/weight_formats.py does).
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from infercache.engine.config import WeightsName
from infercache.engine.linear import Fp16Linear, Fp32Linear, Projection, can_pack, has_fp16_gemm
from infercache.errors import ConfigError

_BLOCK = 32  # GGUF Q8_0's block: 32 int8 values and one scale
_CHUNK_ROWS = 4096  # rows of an embedding table converted at a time


class EmbeddingTable(Protocol):
    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """The float32 rows of token `ids`."""
        ...


class DenseTable:
    """The table as one tensor (float32 or float16), indexed as it is."""

    __slots__ = ("_table",)

    def __init__(self, table: torch.Tensor) -> None:
        self._table = table.contiguous()

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self._table).float()


class Int8BlockTable:
    """int8 values in blocks of `_BLOCK` along each row, each block with a float32 scale (its
    largest magnitude / 127): a row is `values * scale`, in float32."""

    __slots__ = ("_scales", "_values")

    def __init__(self, values: torch.Tensor, scales: torch.Tensor) -> None:
        self._values, self._scales = values, scales

    @classmethod
    def exact(cls, weight: torch.Tensor) -> Int8BlockTable | None:
        """The table of float32 `weight` `[vocab, hidden]`, or None unless it gives back every
        value bit for bit. Built `_CHUNK_ROWS` rows at a time, so its float32 temporaries stay
        a few MB (whole, they were three copies of the table at once: 340 MB for the packaged
        model's, the peak while loading it)."""
        vocab, hidden = weight.shape
        if hidden % _BLOCK:
            return None
        values = torch.empty((vocab, hidden), dtype=torch.int8)
        scales = torch.empty((vocab, hidden // _BLOCK), dtype=torch.float32)
        for start in range(0, vocab, _CHUNK_ROWS):
            rows = slice(start, start + _CHUNK_ROWS)
            if not _quantise_exactly(weight[rows], values[rows], scales[rows]):
                return None
        return cls(values, scales)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        values = F.embedding(ids, self._values).float().view(*ids.shape, -1, _BLOCK)
        return (values * F.embedding(ids, self._scales)[..., None]).flatten(-2)


def _quantise_exactly(weight: torch.Tensor, values: torch.Tensor, scales: torch.Tensor) -> bool:
    """Fill int8 `values` and float32 `scales` (one per block) from float32 `weight` rows;
    whether they give back every value bit for bit."""
    rows, hidden = weight.shape
    blocks = weight.reshape(rows, hidden // _BLOCK, _BLOCK)
    block_scales = blocks.abs().amax(-1, keepdim=True) / 127
    rounded = torch.round(blocks / torch.where(block_scales == 0, 1, block_scales))
    rounded.clamp_(-127, 127)
    if not torch.equal(rounded * block_scales, blocks):
        return False
    values.copy_(rounded.view(rows, hidden))
    scales.copy_(block_scales.view(rows, -1))
    return True


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

    def embedding(self, weight: torch.Tensor) -> EmbeddingTable:
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

    def embedding(self, weight: torch.Tensor) -> EmbeddingTable:
        return DenseTable(weight.float())


class Fp16Weights:
    name = "fp16"

    def projection(
        self, weight: torch.Tensor, bias: torch.Tensor | None, *, packed: bool
    ) -> Projection:
        return Fp16Linear(weight, bias)

    def head(self, weight: torch.Tensor, *, packed: bool) -> Projection:
        return Fp16Linear(weight, None)

    def embedding(self, weight: torch.Tensor) -> EmbeddingTable:
        return Int8BlockTable.exact(weight) or DenseTable(weight.to(torch.float16))


def weight_format(name: WeightsName | str) -> WeightFormat:
    """The format called `name`; a `ConfigError` when unknown or not served by this torch."""
    if name == "fp32":
        return Fp32Weights()
    if name == "fp16":
        if not has_fp16_gemm():
            raise ConfigError("--weights fp16 needs a PyTorch build with FBGEMM (x86); use fp32")
        return Fp16Weights()
    raise ConfigError(f"unknown weight format {name!r}")
