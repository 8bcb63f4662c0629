"""The prefix cache: the radix tree (which token prefixes are cached) over the KV pool (where
their K/V live), with the life cycle the runner follows for each sequence: `acquire` when it is
admitted, its lease held (the matched node locked) while it runs, `release` when it finishes.
Many sequences hold leases at once; one that finishes inserts what another inserted meanwhile
only once (the duplicate slots are freed). Optional tiers below RAM (kv_tiers.py: disk, a
shared Redis) continue a lookup that RAM ends, and keep what RAM computed.

- `acquire(namespace, prompt, workspace)`: match the longest cached prefix of the prompt,
  capped at `len(prompt) - 1` so the last prompt token is always recomputed (its logits start
  generation); lock the matched node; copy its KV to the front of the workspace. With tiers,
  continue from there with the verified whole blocks they hold, and insert those into the tree
  at once (evicting as `release` does; only the head that fits), locking the deeper node, so the
  next request with this prefix finds it in RAM.
- `release(lease, tokens, workspace)`: cache the workspace's KV for `tokens` (the prompt and
  the generated tokens that went through the model) below the locked node, evicting
  least-recently-used unlocked leaves to make room, then unlock. When even that cannot make room
  (other requests hold the memory), only the head of the new tokens that fits is cached. With
  tiers, then write the whole blocks of `tokens` through to them.
A tier that fails in a way it did not foresee (a bug, not a fault it counts) is logged,
counted (`kv_tier_errors:unforeseen`) and skipped: the request recomputes, as it
would without tiers.

Invariant: `tree.stats().total_bytes == (pool.capacity_tokens - pool.free_tokens) *
bytes_per_token <= max_kv_bytes`.
Parameters: `max_kv_bytes` (rounded down to whole tokens), the eviction `policy`.
Not thread-safe: one owner (the engine's worker thread).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from infercache.engine.eviction import EvictionPolicy
from infercache.engine.kv import KVPool, KVShape, KVWorkspace, SlotSpan
from infercache.engine.kv_tiers import KVTiers, TierLoad
from infercache.engine.radix import RadixNode, RadixStats, RadixTree

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Lease:
    """What one request holds between `acquire` and `release`: the locked `node`, which ends
    `node_tokens` into the prompt; the workspace's KV covers `reused_tokens` of it, `ram_tokens`
    from RAM and the rest from the tiers (`tiers`, None without tiers)."""

    namespace: str
    node: RadixNode[SlotSpan]
    node_tokens: int
    reused_tokens: int
    ram_tokens: int
    tiers: TierLoad | None = None
    evicted_nodes: int = 0
    evicted_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Release:
    inserted_tokens: int
    evicted_nodes: int
    evicted_tokens: int


class PrefixCache:
    def __init__(
        self,
        shape: KVShape,
        *,
        max_kv_bytes: int,
        policy: EvictionPolicy | None = None,
        tiers: KVTiers | None = None,
    ) -> None:
        self.tiers = tiers
        self.bytes_per_token = shape.bytes_per_token
        capacity = max_kv_bytes // self.bytes_per_token
        self.pool = KVPool(shape, capacity)
        self.tree: RadixTree[SlotSpan] = RadixTree(
            max_kv_bytes=capacity * self.bytes_per_token, policy=policy
        )

    def acquire(self, namespace: str, prompt: Sequence[int], workspace: KVWorkspace) -> Lease:
        match = self.tree.match_prefix(namespace, prompt[: len(prompt) - 1])
        node, ram = match.node, match.length
        self.tree.lock(node)
        try:
            self.pool.gather(match.payloads, workspace)
            loaded = self._load(namespace, prompt, ram, workspace)
            if loaded is None or loaded.end == ram:
                return Lease(namespace, node, ram, ram, ram, loaded)
            node, depth, evicted = self._adopt(node, prompt, ram, loaded.end, workspace)
        except BaseException:
            self.tree.unlock(node)
            raise
        return Lease(namespace, node, depth, loaded.end, ram, loaded, *evicted)

    def _load(
        self, namespace: str, prompt: Sequence[int], start: int, workspace: KVWorkspace
    ) -> TierLoad | None:
        if self.tiers is None:
            return None
        try:
            return self.tiers.load(namespace, prompt, start, workspace)
        except Exception:
            log.exception("KV tiers failed to load; the prompt is recomputed")
            self.tiers.count_unforeseen()
            workspace.length = start
            return None

    def _adopt(
        self,
        node: RadixNode[SlotSpan],
        prompt: Sequence[int],
        start: int,
        end: int,
        workspace: KVWorkspace,
    ) -> tuple[RadixNode[SlotSpan], int, tuple[int, int]]:
        """Cache the workspace's KV for prompt[start:end] (loaded from a tier) below the
        locked `node`, as much as fits; move the lock to the node where that ends."""
        inserted = self._insert(node, prompt[start:end], start, workspace)
        if inserted.node is None:
            return node, start, inserted.evicted
        self.tree.lock(inserted.node)
        self.tree.unlock(node)
        return inserted.node, start + inserted.tokens, inserted.evicted

    def _insert(
        self, node: RadixNode[SlotSpan], new: Sequence[int], start: int, workspace: KVWorkspace
    ) -> _Inserted:
        """Evict to make room, then insert the head of `new` (whose KV is in the workspace
        from `start`) that fits below `node`."""
        eviction = self.tree.evict(len(new) * self.bytes_per_token)
        for payload in eviction.payloads:
            self.pool.free(payload)
        evicted = (len(eviction.payloads), eviction.tokens)
        fits = min(len(new), self.tree.free_bytes // self.bytes_per_token)
        if fits <= 0:
            return _Inserted(None, 0, 0, evicted)
        span = self.pool.store(workspace, start, start + fits)
        result = self.tree.insert(node, new[:fits], span)
        if result.unused is not None:
            self.pool.free(result.unused)
        return _Inserted(result.node, fits, result.inserted_tokens, evicted)

    def release(self, lease: Lease, tokens: Sequence[int], workspace: KVWorkspace) -> Release:
        """Cache `tokens[lease.node_tokens:]`, whose KV is in the workspace, then unlock; then
        write the whole blocks of `tokens` through to the tiers."""
        start = lease.node_tokens
        if len(tokens) > workspace.length:
            raise ValueError(f"{len(tokens)} tokens but KV for only {workspace.length}")
        inserted = _Inserted(None, 0, 0, (0, 0))
        try:
            inserted = self._insert(lease.node, tokens[start:], start, workspace)
        finally:
            self.tree.unlock(lease.node)
        if self.tiers is not None:
            try:
                self.tiers.save(lease.namespace, tokens, workspace)
            except Exception:
                log.exception("KV tiers failed to save; RAM keeps the prefix")
                self.tiers.count_unforeseen()
        return Release(inserted.inserted_tokens, *inserted.evicted)

    def abandon(self, lease: Lease) -> None:
        """Unlock without caching (the workspace's KV may be incomplete after a failure)."""
        self.tree.unlock(lease.node)

    def stats(self) -> RadixStats:
        return self.tree.stats()


@dataclass(frozen=True, slots=True)
class _Inserted:
    node: RadixNode[SlotSpan] | None  # where the inserted tokens end (None: nothing fit)
    tokens: int  # tokens now cached below the node it was asked for
    inserted_tokens: int  # of those, new to the tree
    evicted: tuple[int, int]  # (nodes, tokens) evicted to make room
