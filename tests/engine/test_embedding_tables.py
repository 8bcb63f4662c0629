"""The embedding tables of weight_formats.py: int8 blocks of 32 hold a table dequantised from
GGUF Q8_0 (int8 × a scale per 32 values) bit for bit, and refuse any table they would round;
the fp16 format then falls back to a float16 table."""

from __future__ import annotations

import torch

from infercache.engine.weight_formats import DenseTable, Fp16Weights, Int8BlockTable


def q8_0_table(vocab: int = 50, hidden: int = 96) -> torch.Tensor:
    """What llama.cpp's Q8_0 dequantisation gives: int8 values times a per-block scale."""
    g = torch.Generator().manual_seed(0)
    values = torch.randint(-127, 128, (vocab, hidden // 32, 32), generator=g).float()
    values[:, :, 0] = 127  # Q8_0 scales each block by its largest magnitude / 127
    scales = torch.rand(vocab, hidden // 32, 1, generator=g).half().float() / 100
    scales[3, 1] = 0  # an all-zero block
    return (values * scales).view(vocab, hidden)


def test_int8_blocks_give_back_a_q8_0_table_bit_for_bit() -> None:
    table = q8_0_table()
    held = Int8BlockTable.exact(table)
    assert held is not None
    ids = torch.tensor([0, 3, 49, 3, 7])
    assert torch.equal(held.lookup(ids), table[ids])
    assert torch.equal(held.lookup(ids[None, :]), table[ids][None])
    assert isinstance(Fp16Weights().embedding(table), Int8BlockTable)


def test_a_table_int8_would_round_is_held_dense_in_float16() -> None:
    table = torch.randn(50, 96, generator=torch.Generator().manual_seed(1))
    assert Int8BlockTable.exact(table) is None
    assert Int8BlockTable.exact(q8_0_table(hidden=96)[:, :80]) is None  # not whole blocks
    held = Fp16Weights().embedding(table)
    assert isinstance(held, DenseTable)
    ids = torch.tensor([4, 0, 4])
    assert torch.equal(held.lookup(ids), table[ids].half().float())


def test_a_table_longer_than_a_chunk_is_checked_in_every_chunk() -> None:
    """The table is converted a chunk of rows at a time (weight_formats `_CHUNK_ROWS`): every
    chunk is held bit for bit, and a single rounded value in the last chunk refuses it all."""
    from infercache.engine import weight_formats

    vocab = weight_formats._CHUNK_ROWS * 2 + 7
    table = q8_0_table(vocab=vocab)
    held = Int8BlockTable.exact(table)
    assert held is not None
    ids = torch.tensor([0, weight_formats._CHUNK_ROWS - 1, weight_formats._CHUNK_ROWS, vocab - 1])
    assert torch.equal(held.lookup(ids), table[ids])
    table[vocab - 1, 5] += table[vocab - 1, 5].abs().clamp(min=1e-3) * 1e-3  # off the int8 grid
    assert Int8BlockTable.exact(table) is None
