"""`y = x Wᵀ + b` for the model's projections, one kernel per weight format, each holding its
weight once.

- `Fp32Linear`: float32 weights. `packed=True` (an engine that batches) keeps only a copy
  prepacked once into oneDNN's blocked layout, read as it is by every step: PyTorch's default
  CPU GEMM repacks the weight on each call, which costs as much as the multiply itself for a
  few rows (8 rows took about 3× as long as 1, though the weight is read once either way).
  `packed=False` keeps the plain weight for PyTorch's GEMM, a little faster for one row (an
  engine that never batches). The packed op is an internal one that PyTorch's own compiler
  uses, `torch.ops.mkldnn._linear_pointwise`.
- `Fp16Linear`: the weight rounded to float16 and prepacked once for FBGEMM's fp16 GEMM
  (`quantized::linear_dynamic_fp16`, PyTorch's own kernel). Only the weight is half precision:
  activations stay float32, each fp16 weight is widened to fp32 in registers and the products
  are summed in fp32. It reads half the bytes a token, and its rows are computed independently
  of each other: a row's result is bit-identical whether it is multiplied alone or among 40
  (tests/engine/test_linear.py), so batching and prompt chunking change nothing in the
  projections.

Every kernel takes and returns the activation dtype of its input (float32, or bfloat16 with
`--dtype bfloat16`), converting at its edges when its own GEMM wants float32.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

# oneDNN picks the blocked layout for this many rows; any row count works with it.
_BATCH_HINT = 8


class Projection(Protocol):
    """A weight matrix ready to multiply: `x [rows, in] → [rows, out]` in `x`'s dtype."""

    @property
    def weight_bytes(self) -> int: ...

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


def can_pack() -> bool:
    """Whether this torch has the oneDNN linear ops `Fp32Linear(packed=True)` uses."""
    return (
        bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def has_fp16_gemm() -> bool:
    """Whether this torch has FBGEMM's fp16-weight GEMM (x86 builds do)."""
    return "fbgemm" in torch.backends.quantized.supported_engines and hasattr(
        torch.ops.quantized, "linear_prepack_fp16"
    )


class Fp32Linear:
    __slots__ = ("_bias", "_packed", "_weight", "weight_bytes")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, packed: bool) -> None:
        self._weight: torch.Tensor | None = None
        self._packed: torch.Tensor | None = None
        self._bias = None if bias is None else bias.float().contiguous()
        with torch.inference_mode():
            w = weight.float().contiguous()
            if packed:
                self._packed = torch.ops.mkldnn._reorder_linear_weight(w, _BATCH_HINT)
            else:
                self._weight = w
        self.weight_bytes = weight.numel() * 4

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x if x.dtype == torch.float32 else x.float()
        if self._packed is not None:
            out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                x32, self._packed, self._bias, "none", [], ""
            )
        else:
            assert self._weight is not None
            out = F.linear(x32, self._weight, self._bias)
        return out if x.dtype == torch.float32 else out.to(x.dtype)


class Fp16Linear:
    __slots__ = ("_packed", "weight_bytes")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        with torch.inference_mode():
            b = None if bias is None else bias.float().contiguous()
            self._packed = torch.ops.quantized.linear_prepack_fp16(weight.float().contiguous(), b)
        self.weight_bytes = weight.numel() * 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x if x.dtype == torch.float32 else x.float()
        out: torch.Tensor = torch.ops.quantized.linear_dynamic_fp16(x32.contiguous(), self._packed)
        return out if x.dtype == torch.float32 else out.to(x.dtype)
