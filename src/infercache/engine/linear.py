"""`y = x Wᵀ + b` for the model's projections: one row through PyTorch's GEMM, several rows
through a copy of the weight prepacked once for oneDNN.

Why: a batched decode step multiplies a few rows (one per running sequence) by every weight
matrix. PyTorch's default CPU GEMM repacks the weight on each call, which costs as much as the
multiply itself for a few rows: 8 rows took about 3× as long as 1, though the weight is read
once either way. A weight packed once into oneDNN's blocked layout is read as it is, and 8 or 16
rows cost little more than one. For a single row (one sequence decoding alone) the plain GEMM
is the faster of the two, so both are kept: the packed copy costs the weights' size again in
memory, the price of batching (bench/README.md, "Batching (engine)", has the figures).

`packed=True` needs float32 and PyTorch's oneDNN (`can_pack`); the op is an internal one that
PyTorch's own compiler uses, `torch.ops.mkldnn._linear_pointwise`. The two kernels agree up to
float rounding (they add in another order), so a row's last bits may differ between a step of
one row and a step of several: a batch may flip a genuine near-tie, as any batched engine may
(tests/engine/test_batch_exactness.py checks that nothing else differs).
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
    __slots__ = ("_bias", "_packed", "_weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, packed: bool) -> None:
        self._weight = weight
        self._bias = bias
        self._packed: torch.Tensor | None = None
        if packed:
            with torch.inference_mode():
                self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, _BATCH_HINT)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None and x.shape[0] > 1:
            out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                x, self._packed, self._bias, "none", [], ""
            )
            return out
        return F.linear(x, self._weight, self._bias)
