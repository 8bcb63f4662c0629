"""The KV pool and workspace: slot allocation, gather and store round trips."""

from __future__ import annotations

import pytest
import torch

from infercache.engine.kv import KVPool, KVShape, KVWorkspace, SlotSpan

SHAPE = KVShape(layers=3, kv_heads=2, head_dim=4, dtype=torch.float32)


def filled_workspace(tokens: int, seed: int = 0) -> KVWorkspace:
    ws = KVWorkspace(SHAPE, 64)
    with torch.inference_mode():
        ws.data[:, :, :tokens] = torch.randn(
            3, 2, tokens, 2, 4, generator=torch.Generator().manual_seed(seed)
        )
    ws.length = tokens
    return ws


def test_bytes_per_token_counts_k_and_v_of_every_layer() -> None:
    assert SHAPE.bytes_per_token == 3 * 2 * 2 * 4 * 4
    smollm2 = KVShape(layers=30, kv_heads=3, head_dim=64, dtype=torch.float32)
    assert smollm2.bytes_per_token == 46_080


def test_store_then_gather_round_trips_the_kv() -> None:
    pool = KVPool(SHAPE, capacity_tokens=32)
    src = filled_workspace(10)
    head = pool.store(src, 0, 6)
    tail = pool.store(src, 6, 10)
    dst = KVWorkspace(SHAPE, 64)
    assert pool.gather([head, tail], dst) == 10
    assert dst.length == 10
    assert torch.equal(dst.data[:, :, :10], src.data[:, :, :10])


def test_gather_of_scattered_slots_equals_gather_of_consecutive_ones() -> None:
    pool = KVPool(SHAPE, capacity_tokens=32)
    src = filled_workspace(12)
    spans = [pool.store(src, i, i + 1) for i in range(12)]
    for span in spans[::2]:
        pool.free(span)
    scattered_src = filled_workspace(6, seed=1)
    scattered = pool.store(scattered_src, 0, 6)  # reuses every other freed slot
    assert scattered.first_slot is None
    dst = KVWorkspace(SHAPE, 64)
    pool.gather([scattered], dst)
    assert torch.equal(dst.data[:, :, :6], scattered_src.data[:, :, :6])
    assert torch.equal(pool.read(scattered), scattered_src.data[:, :, :6])


def test_split_spans_cover_the_same_slots() -> None:
    span = SlotSpan.of(torch.arange(5, 12), SHAPE.bytes_per_token)
    head, tail = span.split(3)
    assert span.first_slot == 5
    assert (head.first_slot, tail.first_slot) == (5, 8)
    assert head.nbytes + tail.nbytes == span.nbytes
    assert torch.equal(torch.cat([head.slots, tail.slots]), span.slots)
    with pytest.raises(ValueError, match="split"):
        span.split(0)


def test_pool_refuses_to_allocate_beyond_its_capacity() -> None:
    pool = KVPool(SHAPE, capacity_tokens=4)
    first = pool.alloc(3)
    with pytest.raises(ValueError, match="free slots"):
        pool.alloc(2)
    pool.free(first)
    assert pool.free_tokens == 4
    with pytest.raises(ValueError, match="more slots"):
        pool.free(first)


def test_store_outside_the_workspace_is_refused() -> None:
    pool = KVPool(SHAPE, capacity_tokens=8)
    with pytest.raises(ValueError, match="outside"):
        pool.store(filled_workspace(3), 2, 5)
