"""KV block names and verification (engine/kv_blocks.py): what makes a stored block usable."""

from __future__ import annotations

import numpy as np
import pytest

from infercache.engine.kv_blocks import (
    HEADER_BYTES,
    BlockGeometry,
    BlockNames,
    encode,
    split,
    verify,
)
from infercache.errors import BlockRejectedError

GEOMETRY = BlockGeometry(block_tokens=4, layers=2, kv_heads=1, head_dim=2, itemsize=4)
TOKENS = tuple(range(10, 30))


def names(fingerprint: str = "fp_a", dtype: str = "torch.float32") -> BlockNames:
    return BlockNames(fingerprint, dtype, GEOMETRY)


def runs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, GEOMETRY.run_bytes, dtype=np.uint8) for _ in range(4)]


def test_a_name_stands_for_the_whole_prefix_in_one_model_dtype_and_namespace() -> None:
    base = names().blocks("ns", TOKENS, 5).hashes
    assert len(set(base)) == 5
    diverged = names().blocks("ns", (*TOKENS[:9], 0, *TOKENS[10:]), 5).hashes
    assert diverged[:2] == base[:2]  # blocks 0-1 end before token 9
    assert set(diverged[2:]).isdisjoint(base)  # block 2 holds it, and every later name follows
    for other in (
        names("fp_b").blocks("ns", TOKENS, 5),
        names(dtype="torch.bfloat16").blocks("ns", TOKENS, 5),
        names().blocks("ns2", TOKENS, 5),
    ):
        assert set(other.hashes).isdisjoint(base)
    assert names("fp_b").directory_key != names().directory_key


def test_only_whole_blocks_are_named() -> None:
    assert len(names().blocks("ns", TOKENS[:7], 5)) == 1
    assert len(names().blocks("ns", TOKENS, 99)) == 5


def block(index: int, seed: int = 0) -> bytes:
    blocks = names().blocks("ns", TOKENS, 5)
    return b"".join(bytes(part) for part in encode(GEOMETRY, blocks, index, runs(seed)))


def test_an_encoded_block_verifies_and_carries_the_whole_prefix() -> None:
    blocks = names().blocks("ns", TOKENS, 5)
    value = block(3)
    assert len(value) == GEOMETRY.block_bytes(3)
    header, tokens, kv = split(GEOMETRY, 3, value)
    verify(GEOMETRY, blocks, 3, header, tokens, kv)
    assert np.frombuffer(tokens, dtype="<i4").tolist() == list(TOKENS[:16])
    assert bytes(kv) == b"".join(r.tobytes() for r in runs(0))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda v: v[:-1], "truncated"),
        (lambda v: v + b"\0", "truncated"),
        (lambda v: v[:9] + bytes([v[9] ^ 1]) + v[10:], "header"),  # the block size field
        (lambda v: v[:HEADER_BYTES] + b"\x09" + v[HEADER_BYTES + 1 :], "tokens"),
        (lambda v: v[:-2] + bytes([v[-2] ^ 0x80]) + v[-1:], "checksum"),
    ],
)
def test_a_damaged_block_is_rejected_with_its_reason(damage: object, reason: str) -> None:
    blocks = names().blocks("ns", TOKENS, 5)
    value = damage(block(2))  # type: ignore[operator]
    with pytest.raises(BlockRejectedError) as caught:
        verify(GEOMETRY, blocks, 2, *split(GEOMETRY, 2, value))
    assert caught.value.reason == reason


def test_a_block_is_rejected_for_another_index_namespace_or_prompt() -> None:
    value = block(2)
    for blocks, index in (
        (names().blocks("ns", TOKENS, 5), 1),
        (names().blocks("ns2", TOKENS, 5), 2),
        (names().blocks("ns", (0, *TOKENS[1:]), 5), 2),
    ):
        with pytest.raises(BlockRejectedError):
            verify(GEOMETRY, blocks, index, *split(GEOMETRY, index, value))
