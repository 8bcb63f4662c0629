"""`y = x Wᵀ + b` for the model's projections, with the weight prepacked once for oneDNN.

Why: a batched decode step multiplies a few rows (one per running sequence) by every weight
matrix. PyTorch's default CPU GEMM repacks the weight on each call, which costs as much as the
multiply itself for a few rows, so 8 rows took about 3× as long as 1 (and ~4× the memory
traffic of reading the weight once). A weight packed once into oneDNN's blocked layout is read
as it is: 8 or 16 rows then cost about what 1 row costs, the weight being read once either way
(bench/README.md, "Continuous batching", has the figures).

`packed=None` chooses: packed for float32 when PyTorch has oneDNN (the op is an internal one
that PyTorch's own compiler uses, `torch.ops.mkldnn._linear_pointwise`); plain `F.linear`
otherwise, and for bfloat16. Both give the same result up to float rounding (the order of the
additions differs), so a model is built one way and keeps it: every request, alone or in a
batch, goes through the same kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# oneDNN picks the blocked layout for this many rows; any row count works with it.
_BATCH_HINT = 8


def can_pack(dtype: torch.dtype) -> bool:
    return (
        dtype == torch.float32
        and bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


class Linear:
    __slots__ = ("_bias", "_packed", "_weight", "in_features", "out_features")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, packed: bool) -> None:
        self.out_features, self.in_features = weight.shape
        self._bias = bias
        self._weight: torch.Tensor | None = None
        self._packed: torch.Tensor | None = None
        if packed:
            with torch.inference_mode():
                self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, _BATCH_HINT)
        else:
            self._weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:
            out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                x, self._packed, self._bias, "none", [], ""
            )
            return out
        assert self._weight is not None
        return F.linear(x, self._weight, self._bias)
