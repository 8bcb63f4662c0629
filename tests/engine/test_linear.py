"""The projections: one row through PyTorch's GEMM exactly, several rows through the weight
prepacked for oneDNN, the two agreeing up to float rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infercache.engine.linear import Linear, can_pack

pytestmark = pytest.mark.skipif(not can_pack(torch.float32), reason="no oneDNN in this torch")


@pytest.mark.parametrize("bias", [False, True])
def test_packed_rows_agree_with_the_plain_gemm_and_one_row_is_exactly_it(bias: bool) -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 64, generator=g)
    b = torch.randn(96, generator=g) if bias else None
    packed, plain = Linear(weight, b, packed=True), Linear(weight, b, packed=False)
    with torch.inference_mode():
        for rows in (1, 3, 8, 33):
            x = torch.randn(rows, 64, generator=g)
            expected = F.linear(x, weight, b)
            assert torch.equal(plain(x), expected)
            got = packed(x)
            assert got.shape == expected.shape
            assert (got - expected).abs().max().item() < 1e-4
            if rows == 1:
                assert torch.equal(got, expected)


def test_bfloat16_is_never_packed() -> None:
    assert not can_pack(torch.bfloat16)
