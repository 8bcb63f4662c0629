"""The projections: fp32 plain is PyTorch's GEMM exactly and fp32 packed agrees with it up to
float rounding; fp16 is the GEMM of the weights rounded to float16 with float32 activations, and
a row's result does not depend on the rows beside it (batch invariance)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infercache.engine.linear import Fp16Linear, Fp32Linear, can_pack, has_fp16_gemm

ROWS = (1, 3, 8, 33)


def weights(bias: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Generator]:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=g) * 0.1
    return weight, (torch.randn(96, generator=g) if bias else None), g


@pytest.mark.skipif(not can_pack(), reason="no oneDNN in this torch")
@pytest.mark.parametrize("bias", [False, True])
def test_fp32_plain_is_the_gemm_and_packed_agrees_with_it(bias: bool) -> None:
    weight, b, g = weights(bias)
    packed, plain = Fp32Linear(weight, b, packed=True), Fp32Linear(weight, b, packed=False)
    with torch.inference_mode():
        for rows in ROWS:
            x = torch.randn(rows, 64, generator=g)
            expected = F.linear(x, weight, b)
            assert torch.equal(plain(x), expected)
            got = packed(x)
            assert got.shape == expected.shape
            assert (got - expected).abs().max().item() < 1e-4


@pytest.mark.skipif(not has_fp16_gemm(), reason="no FBGEMM in this torch")
@pytest.mark.parametrize("bias", [False, True])
def test_fp16_is_the_fp32_gemm_of_the_rounded_weights(bias: bool) -> None:
    weight, b, g = weights(bias)
    layer = Fp16Linear(weight, b)
    rounded = weight.half().float()
    assert not torch.equal(rounded, weight)  # the rounding is real: the test can tell
    with torch.inference_mode():
        for rows in ROWS:
            x = torch.randn(rows, 64, generator=g)
            got = layer(x)
            assert got.dtype == torch.float32
            assert (got - F.linear(x, rounded, b)).abs().max().item() < 1e-5
            # and it is not the unrounded product, to well above float32 noise
            assert (got - F.linear(x, weight, b)).abs().max().item() > 1e-5


@pytest.mark.skipif(not has_fp16_gemm(), reason="no FBGEMM in this torch")
def test_fp16_rows_do_not_depend_on_the_rows_beside_them() -> None:
    g = torch.Generator().manual_seed(1)
    layer = Fp16Linear(torch.randn(3072, 576, generator=g) * 0.02, None)
    x = torch.randn(40, 576, generator=g)
    with torch.inference_mode():
        together = layer(x)
        for rows in (1, 2, 7, 16, 33):
            assert torch.equal(layer(x[:rows].contiguous()), together[:rows])


@pytest.mark.skipif(not has_fp16_gemm(), reason="no FBGEMM in this torch")
def test_kernels_take_and_return_the_activation_dtype() -> None:
    weight, b, g = weights(True)
    x = torch.randn(5, 64, generator=g).bfloat16()
    with torch.inference_mode():
        for layer in (Fp16Linear(weight, b), Fp32Linear(weight, b, packed=False)):
            out = layer(x)
            assert out.dtype == torch.bfloat16
            assert (out.float() - F.linear(x.float(), weight, b)).abs().max().item() < 0.05
