"""The prefix cache: the radix tree (which token prefixes are cached) over the KV pool (where
their K/V live), with the life cycle the runner follows for each sequence: `acquire` when it is
admitted, its lease held (the matched node locked) while it runs, `release` when it finishes.
Many sequences hold leases at once; one that finishes inserts what another inserted meanwhile
only once (the duplicate slots are freed).

- `acquire(namespace, prompt, workspace)`: match the longest cached prefix of the prompt,
  capped at `len(prompt) - 1` so the last prompt token is always recomputed (its logits start
  generation); lock the matched node; copy its KV to the front of the workspace.
- `release(lease, tokens, workspace)`: cache the workspace's KV for `tokens` (the prompt and
  the generated tokens that went through the model) below the locked node, evicting
  least-recently-used unlocked leaves to make room, then unlock. When even that cannot make room
  (other requests hold the memory), only the head of the new tokens that fits is cached.

Invariant: `tree.total_bytes == pool.used_tokens * bytes_per_token <= max_kv_bytes`.
Parameters: `max_kv_bytes` (rounded down to whole tokens), the eviction `policy`.
Not thread-safe: one owner (the engine's worker thread).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from infercache.engine.kv import KVPool, KVShape, KVWorkspace, SlotSpan
from infercache.engine.radix import EvictionPolicy, RadixNode, RadixStats, RadixTree


@dataclass(frozen=True, slots=True)
class Lease:
    """What one request holds between `acquire` and `release`."""

    node: RadixNode[SlotSpan]
    reused_tokens: int


@dataclass(frozen=True, slots=True)
class Release:
    inserted_tokens: int
    evicted_nodes: int
    evicted_tokens: int


class PrefixCache:
    def __init__(
        self, shape: KVShape, *, max_kv_bytes: int, policy: EvictionPolicy | None = None
    ) -> None:
        self.bytes_per_token = shape.bytes_per_token
        capacity = max_kv_bytes // self.bytes_per_token
        self.pool = KVPool(shape, capacity)
        self.tree: RadixTree[SlotSpan] = RadixTree(
            max_kv_bytes=capacity * self.bytes_per_token, policy=policy
        )

    def acquire(self, namespace: str, prompt: Sequence[int], workspace: KVWorkspace) -> Lease:
        match = self.tree.match_prefix(namespace, prompt[: len(prompt) - 1])
        self.tree.lock(match.node)
        try:
            self.pool.gather(match.payloads, workspace)
        except BaseException:
            self.tree.unlock(match.node)
            raise
        return Lease(node=match.node, reused_tokens=match.length)

    def release(self, lease: Lease, tokens: Sequence[int], workspace: KVWorkspace) -> Release:
        """Cache `tokens[lease.reused_tokens:]`, whose KV is in the workspace, then unlock."""
        start = lease.reused_tokens
        if len(tokens) > workspace.length:
            raise ValueError(f"{len(tokens)} tokens but KV for only {workspace.length}")
        try:
            new = tokens[start:]
            eviction = self.tree.evict(len(new) * self.bytes_per_token)
            for payload in eviction.payloads:
                self.pool.free(payload)
            fits = min(len(new), self.tree.free_bytes // self.bytes_per_token)
            inserted = 0
            if fits > 0:
                span = self.pool.store(workspace, start, start + fits)
                result = self.tree.insert(lease.node, new[:fits], span)
                inserted = result.inserted_tokens
                if result.unused is not None:
                    self.pool.free(result.unused)
        finally:
            self.tree.unlock(lease.node)
        return Release(inserted, len(eviction.payloads), eviction.tokens)

    def abandon(self, lease: Lease) -> None:
        """Unlock without caching (the workspace's KV may be incomplete after a failure)."""
        self.tree.unlock(lease.node)

    def stats(self) -> RadixStats:
        return self.tree.stats()
