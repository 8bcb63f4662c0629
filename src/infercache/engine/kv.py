"""KV storage: a preallocated slot pool (what the prefix tree's payloads point into) and the
contiguous workspace of each running sequence, which the model attends over.

Layout: the pool is `[layers, 2 (K, V), slots, kv_heads, head_dim]`, the workspace
`[layers, 2, max_tokens, kv_heads, head_dim]`. They share the inner layout, so a gather is one
`index_select` per (layer, K|V) written straight into the workspace (its destination slice is
contiguous), and a run of consecutive slots is a single strided copy of every layer at once.

A payload (`SlotSpan`) is a 1-D int64 tensor of slot ids: splitting it is slicing, freeing it
pushes the ids back on the pool's free stack. The pool holds `max_kv_bytes // bytes_per_token`
slots, so cached KV can never exceed the budget. `torch.empty` leaves pages untouched until
written, so resident memory grows with what is cached, not with the budget.

Why a workspace per sequence rather than attending over pool slots (vLLM's paged KV): on a CPU,
with PyTorch's attention kernels, reading scattered slots means gathering them again at every
step and layer; a sequence's own contiguous workspace is copied into once (its cached prefix, at
admission) and out of once (its new KV, when it finishes). A workspace is sized to the sequence
(prompt + `max_tokens`) and dropped when it leaves the batch; the scheduler bounds their sum.
The tiers below RAM (kv_tiers.py) see a workspace as bytes (`runs`, `put_block`): numpy views
of the same memory, [layers, 2, tokens, row bytes], so a block is written from it without a copy
and a verified block is copied in with one strided numpy copy (no torch op off the tensors'
own path, and no warning for read-only source buffers).
Not thread-safe: the engine's worker thread owns the pool and the workspaces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True, slots=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * self.itemsize

    def allocate(self, tokens: int) -> torch.Tensor:
        return torch.empty((self.layers, 2, tokens, self.kv_heads, self.head_dim), dtype=self.dtype)


class SlotSpan:
    """Slots holding the KV of a run of tokens, in token order. `first_slot` is set when the
    slots are consecutive (then a gather is one strided copy)."""

    __slots__ = ("bytes_per_token", "first_slot", "slots")

    def __init__(self, slots: torch.Tensor, bytes_per_token: int, first_slot: int | None) -> None:
        self.slots = slots
        self.bytes_per_token = bytes_per_token
        self.first_slot = first_slot

    @classmethod
    def of(cls, slots: torch.Tensor, bytes_per_token: int) -> SlotSpan:
        n = slots.numel()
        consecutive = n == 1 or (n > 1 and bool((slots[1:] - slots[:-1] == 1).all()))
        return cls(slots, bytes_per_token, int(slots[0]) if consecutive else None)

    def __len__(self) -> int:
        return self.slots.numel()

    @property
    def nbytes(self) -> int:
        return len(self) * self.bytes_per_token

    def split(self, at_tokens: int) -> tuple[SlotSpan, SlotSpan]:
        if not 0 < at_tokens < len(self):
            raise ValueError(f"split at {at_tokens} of a {len(self)}-token span")
        tail_first = None if self.first_slot is None else self.first_slot + at_tokens
        return (
            SlotSpan(self.slots[:at_tokens], self.bytes_per_token, self.first_slot),
            SlotSpan(self.slots[at_tokens:], self.bytes_per_token, tail_first),
        )


class KVWorkspace:
    """The KV of the sequence being computed, positions [0, length)."""

    def __init__(self, shape: KVShape, max_tokens: int) -> None:
        self.shape = shape
        self.max_tokens = max_tokens
        with torch.inference_mode():
            self.data = shape.allocate(max_tokens)
        self.length = 0
        # The same memory as bytes: [layers, 2, max_tokens, kv_heads * head_dim * itemsize].
        self._rows = self.data.view(torch.uint8).numpy().reshape(shape.layers, 2, max_tokens, -1)

    def runs(self, start: int, end: int) -> list[np.ndarray[Any, Any]]:
        """Positions [start, end) as 2 × layers contiguous byte arrays, K then V per layer:
        views (writing them writes the workspace)."""
        rows = self._rows
        return [rows[layer, kv, start:end] for layer in range(rows.shape[0]) for kv in (0, 1)]

    def put_block(self, position: int, kv: Any, block_tokens: int, skip: int = 0) -> None:
        """Copy one block's KV (`kv`: bytes laid out [layers, 2, block_tokens, row bytes]) to
        positions [position + skip, position + block_tokens); the first `skip` positions of the
        block are left as they are."""
        rows = self._rows
        block = np.frombuffer(kv, dtype=np.uint8).reshape(rows.shape[0], 2, block_tokens, -1)
        rows[:, :, position + skip : position + block_tokens] = block[:, :, skip:]


class KVPool:
    def __init__(self, shape: KVShape, capacity_tokens: int) -> None:
        if capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
        self.shape = shape
        self.capacity_tokens = capacity_tokens
        self.bytes_per_token = shape.bytes_per_token
        with torch.inference_mode():
            self._data = shape.allocate(capacity_tokens)
        # A stack of free slot ids; the top is handed out first, lowest id first.
        self._free = torch.arange(capacity_tokens - 1, -1, -1, dtype=torch.int64)
        self._free_count = capacity_tokens

    @property
    def free_tokens(self) -> int:
        return self._free_count

    def alloc(self, tokens: int) -> SlotSpan:
        if tokens > self._free_count:
            raise ValueError(f"KV pool has {self._free_count} free slots, {tokens} asked")
        top = self._free_count
        slots = self._free[top - tokens : top].flip(0)
        self._free_count -= tokens
        return SlotSpan.of(slots, self.bytes_per_token)

    def free(self, span: SlotSpan) -> None:
        n = len(span)
        if self._free_count + n > self.capacity_tokens:
            raise ValueError("freeing more slots than were allocated")
        self._free[self._free_count : self._free_count + n] = span.slots.flip(0)
        self._free_count += n

    def gather(self, spans: Iterable[SlotSpan], workspace: KVWorkspace) -> int:
        """Copy the spans' KV, in order, to the start of the workspace; return its length."""
        dst = workspace.data
        offset = 0
        with torch.inference_mode():
            for span in spans:
                n = len(span)
                if span.first_slot is not None:
                    first = span.first_slot
                    dst[:, :, offset : offset + n].copy_(self._data[:, :, first : first + n])
                else:
                    for layer in range(self.shape.layers):
                        for kv in (0, 1):
                            torch.index_select(
                                self._data[layer, kv],
                                0,
                                span.slots,
                                out=dst[layer, kv, offset : offset + n],
                            )
                offset += n
        workspace.length = offset
        return offset

    def store(self, workspace: KVWorkspace, start: int, end: int) -> SlotSpan:
        """Copy workspace positions [start, end) into newly allocated slots."""
        if not 0 <= start <= end <= workspace.length:
            raise ValueError(f"store [{start}, {end}) outside workspace of {workspace.length}")
        span = self.alloc(end - start)
        src = workspace.data[:, :, start:end]
        with torch.inference_mode():
            if span.first_slot is not None:
                first = span.first_slot
                self._data[:, :, first : first + (end - start)].copy_(src)
            else:
                self._data[:, :, span.slots] = src
        return span

    def read(self, span: SlotSpan) -> torch.Tensor:
        """A copy of a span's KV, `[layers, 2, tokens, kv_heads, head_dim]` (for tests)."""
        with torch.inference_mode():
            return self._data[:, :, span.slots].clone()
