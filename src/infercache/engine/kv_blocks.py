"""KV blocks for the tiers below RAM (disk, shared): their names, their layout, their checks.

Blocks. A prompt's tokens are cut from its start into blocks of `block_tokens`; block i covers
tokens [i·B, (i+1)·B). Only whole blocks leave RAM: a tail shorter than a block stays in the
radix tree only.

Names: a chain hash. h₋₁ = sha256 of (format version, model/weights fingerprint, KV dtype,
geometry, block size, namespace); hᵢ = sha256(hᵢ₋₁ ‖ block i's tokens as int32)[:16]. A name
stands for the whole prefix up to the block's end, within one fingerprint, dtype and namespace
(tenant, model, `cache_salt`: kv_namespace.py): another tenant or model computes other names,
and a new fingerprint (a model swap, new weights) makes every old name unreachable.

Layout of a block, one contiguous byte string (a file, a Redis value), little-endian:

    header  64 bytes: magic "ICKV", format version, block_tokens, index, layers, kv_heads,
            head_dim, itemsize, namespace digest (16), chain hash (16), checksum (8)
    tokens  int32 × (index + 1) · block_tokens: the whole prefix up to the block's end
    kv      per layer, K then V: block_tokens × kv_heads × head_dim × itemsize each, the inner
            layout of the KV pool and workspaces (kv.py), so a block is written from a
            workspace as 2 × layers contiguous runs and read back with one strided copy
            (vLLM's offloading connector found one contiguous region per block, rather than a
            piece per layer, several times faster)

The checksum is xxh3-64 over everything but itself (tens of GB/s: a 1,024-token prefix of the
packaged model, 47 MB, is checked in a few ms).

`verify`, before any byte is used: the length is exact; the header is this geometry, this
block's index, namespace and name; the stored tokens equal the prompt's, token by token, for the
whole prefix (so neither a hash collision nor a block planted under another name can pass); the
checksum matches (a flipped bit, a torn write). A failure raises `BlockRejectedError` naming the
reason; the caller counts it and recomputes. No torch here: buffers are anything with the
buffer protocol.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from infercache.errors import BlockRejectedError

FORMAT_VERSION = 1
MAGIC = b"ICKV"
_HEADER = struct.Struct("<4sHHIIHHHH16s16sQ")
HEADER_BYTES = _HEADER.size  # 64
_CHECKSUM_AT = HEADER_BYTES - 8
TOKEN_BYTES = 4
Buffer = Any  # bytes, memoryview, a contiguous numpy array: anything with the buffer protocol


@dataclass(frozen=True, slots=True)
class BlockGeometry:
    block_tokens: int
    layers: int
    kv_heads: int
    head_dim: int
    itemsize: int

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")

    @property
    def run_bytes(self) -> int:
        """One layer's K (or V) of one block."""
        return self.block_tokens * self.kv_heads * self.head_dim * self.itemsize

    @property
    def kv_bytes(self) -> int:
        return 2 * self.layers * self.run_bytes

    def tokens_bytes(self, index: int) -> int:
        return (index + 1) * self.block_tokens * TOKEN_BYTES

    def block_bytes(self, index: int) -> int:
        return HEADER_BYTES + self.tokens_bytes(index) + self.kv_bytes


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A prompt's first `len(hashes)` whole blocks, named: what loads and saves work on."""

    namespace_digest: bytes
    hashes: tuple[bytes, ...]
    token_bytes: bytes  # int32 little-endian, the tokens of those blocks

    def name(self, index: int) -> str:
        return self.hashes[index].hex()

    def __len__(self) -> int:
        return len(self.hashes)


class BlockNames:
    """Chains block names for one model fingerprint, KV dtype and geometry."""

    def __init__(self, fingerprint: str, dtype: str, geometry: BlockGeometry) -> None:
        self.geometry = geometry
        g = geometry
        self._scope = [FORMAT_VERSION, fingerprint, dtype, g.block_tokens, g.layers]
        self._scope += [g.kv_heads, g.head_dim, g.itemsize]
        self.directory_key = hashlib.sha256(json.dumps(self._scope).encode()).hexdigest()[:24]

    def blocks(self, namespace: str, tokens: Sequence[int], count: int) -> PromptBlocks:
        """Names of the first `count` whole blocks of `tokens`."""
        b = self.geometry.block_tokens
        count = max(0, min(count, len(tokens) // b))
        root = hashlib.sha256(json.dumps([*self._scope, namespace]).encode()).digest()
        data = np.asarray(tokens[: count * b], dtype="<i4").tobytes()
        hashes, previous = [], root
        step = b * TOKEN_BYTES
        for i in range(count):
            previous = hashlib.sha256(previous + data[i * step : (i + 1) * step]).digest()[:16]
            hashes.append(previous)
        return PromptBlocks(root[:16], tuple(hashes), data)


def _header(g: BlockGeometry, index: int, blocks: PromptBlocks, checksum: int) -> bytes:
    return _HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        0,
        g.block_tokens,
        index,
        g.layers,
        g.kv_heads,
        g.head_dim,
        g.itemsize,
        blocks.namespace_digest,
        blocks.hashes[index],
        checksum,
    )


def _checksum(header: Buffer, tokens: Buffer, kv: Sequence[Buffer]) -> int:
    h = xxhash.xxh3_64()
    h.update(memoryview(header)[:_CHECKSUM_AT])
    h.update(tokens)
    for run in kv:
        h.update(run)
    return h.intdigest()


def encode(
    g: BlockGeometry, blocks: PromptBlocks, index: int, kv: Sequence[Buffer]
) -> list[Buffer]:
    """Block `index` as buffers to write in order: header, tokens, then `kv` (its 2 × layers
    runs, K then V per layer, each `run_bytes`), which are not copied."""
    if len(kv) != 2 * g.layers:
        raise ValueError(f"{len(kv)} KV runs for {g.layers} layers")
    tokens = memoryview(blocks.token_bytes)[: g.tokens_bytes(index)]
    provisional = _header(g, index, blocks, 0)
    header = _header(g, index, blocks, _checksum(provisional, tokens, kv))
    return [header, tokens, *kv]


def verify(
    g: BlockGeometry,
    blocks: PromptBlocks,
    index: int,
    header: Buffer,
    tokens: Buffer,
    kv: Buffer | list[Buffer],
) -> None:
    """Raise `BlockRejectedError` unless (header, tokens, kv), as read, are block `index` of this
    prompt, intact. `kv` is the block's KV bytes, in one buffer or as its runs (a list)."""
    runs: list[Buffer] = kv if isinstance(kv, list) else [kv]
    if (
        memoryview(header).nbytes != HEADER_BYTES
        or memoryview(tokens).nbytes != g.tokens_bytes(index)
        or sum(memoryview(run).nbytes for run in runs) != g.kv_bytes
    ):
        raise BlockRejectedError("truncated")
    fields = _HEADER.unpack(header)
    expected = _header(g, index, blocks, fields[-1])
    if bytes(header) != expected:
        raise BlockRejectedError("header", f"block {index} is not this prompt's")
    if memoryview(tokens) != memoryview(blocks.token_bytes)[: g.tokens_bytes(index)]:
        raise BlockRejectedError("tokens", f"block {index} holds another prefix")
    if _checksum(header, tokens, runs) != fields[-1]:
        raise BlockRejectedError("checksum", f"block {index}")


def split(g: BlockGeometry, index: int, value: Buffer) -> tuple[Buffer, Buffer, Buffer]:
    """A block read as one byte string → (header, tokens, kv); `verify` checks the sizes."""
    view = memoryview(value)
    end_tokens = HEADER_BYTES + g.tokens_bytes(index)
    return view[:HEADER_BYTES], view[HEADER_BYTES:end_tokens], view[end_tokens:]
