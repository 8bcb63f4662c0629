"""Prefix-reuse accounting over the engine's radix tree (engine/radix.py), without any KV.

`SimulatedPrefixCache.observe(namespace, units, ...)` does what the engine's prefix cache does for
one request (engine/prefix_cache.py): match the longest cached prefix of the prompt, lock the
matched node, evict least-recently-used unlocked leaves to make room, insert the rest of the
prompt below the node (only the head that fits, when even eviction cannot make room), unlock.
Reused tokens are capped at `prompt_tokens - 1`, because the engine always recomputes the last
prompt token (its logits start generation).

A unit is a token id (text logs, `unit_tokens=1`) or a prefix-block hash (block traces:
`unit_tokens` tokens a block, 512 in Mooncake's traces). Payloads only count tokens, so the
tree's byte budget is a budget in tokens: `capacity_tokens`. Each payload also remembers when a
request last went through it, which gives the reuse distance of a match.

The census runs one with an (effectively) unbounded capacity; the replay one per simulated KV
budget. Parameters:
- `capacity_tokens`: KV budget in tokens (None: unbounded).
- `evict_batch_tokens`: `RadixTree.evict` walks every node, so when room is needed this evicts
  that many tokens more than needed (default: 1% of the capacity), making an eviction pass rare.
  The simulated cache therefore runs up to that much below its budget: a slight underestimate.
Not thread-safe (one owner), like the tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Self

from infercache.engine.radix import RadixNode, RadixTree

UNBOUNDED_TOKENS = 1 << 62


def kv_namespace(tenant: str, model: str, *, share_across_tenants: bool) -> str:
    """Where KV may be reused: one model's requests, of one tenant unless sharing is on (the
    engine keeps tenants apart by default; KV is never shared across models)."""
    return model if share_across_tenants else f"{tenant}\x00{model}"


class Span:
    """A payload standing for the KV of `units` units: `nbytes` is their token count."""

    __slots__ = ("last_seen_s", "unit_tokens", "units")

    def __init__(self, units: int, unit_tokens: int, last_seen_s: float) -> None:
        self.units = units
        self.unit_tokens = unit_tokens
        self.last_seen_s = last_seen_s

    @property
    def nbytes(self) -> int:
        return self.units * self.unit_tokens

    def split(self, at_tokens: int) -> tuple[Self, Self]:
        cls = type(self)
        head = cls(at_tokens, self.unit_tokens, self.last_seen_s)
        tail = cls(self.units - at_tokens, self.unit_tokens, self.last_seen_s)
        return head, tail


class Reuse(NamedTuple):
    matched_tokens: int  # tokens of the longest cached prefix (uncapped)
    reused_tokens: int  # what the engine would reuse: capped at prompt_tokens - 1
    last_seen_s: float | None  # when a request last went through the matched prefix


@dataclass(frozen=True, slots=True)
class PrefixStats:
    evictions: int  # eviction passes
    evicted_tokens: int
    cached_tokens: int
    nodes: int


class SimulatedPrefixCache:
    def __init__(
        self, *, capacity_tokens: int | None = None, evict_batch_tokens: int | None = None
    ) -> None:
        if capacity_tokens is not None and capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
        self.capacity_tokens = capacity_tokens
        capacity = UNBOUNDED_TOKENS if capacity_tokens is None else capacity_tokens
        self._tree: RadixTree[Span] = RadixTree(max_kv_bytes=capacity)
        self._batch = (
            evict_batch_tokens if evict_batch_tokens is not None else max(1, capacity // 100)
        )
        self._evictions = 0
        self._evicted_tokens = 0
        # One int object per distinct id in the tree: ids unpickled from another process
        # arrive as fresh objects (~32 bytes each) and the tree keeps only the ones it stores.
        self._ints: dict[int, int] = {}

    def observe(
        self,
        namespace: str,
        units: tuple[int, ...],
        *,
        unit_tokens: int,
        prompt_tokens: int,
        now_s: float,
    ) -> Reuse:
        """Account one request's prompt (`units`, `prompt_tokens` tokens) arriving at `now_s`."""
        tree = self._tree
        match = tree.match_prefix(namespace, units)
        last_seen_s = match.payloads[-1].last_seen_s if match.payloads else None
        for payload in match.payloads:
            payload.last_seen_s = now_s
        matched_tokens = min(match.length * unit_tokens, prompt_tokens)
        if match.length < len(units):
            self._insert(match.node, units[match.length :], unit_tokens, now_s)
        return Reuse(matched_tokens, max(0, min(matched_tokens, prompt_tokens - 1)), last_seen_s)

    def _insert(
        self, node: RadixNode[Span], new: tuple[int, ...], unit_tokens: int, now_s: float
    ) -> None:
        tree = self._tree
        new = tuple(map(self._ints.setdefault, new, new))
        if len(new) * unit_tokens <= tree.free_bytes:
            tree.insert(node, new, Span(len(new), unit_tokens, now_s))
            return
        # As the engine does: lock the matched path so eviction cannot take the node we
        # insert below, evict, insert what fits, unlock.
        tree.lock(node)
        try:
            eviction = tree.evict(len(new) * unit_tokens + self._batch)
            if eviction.payloads:
                self._evictions += 1
                self._evicted_tokens += eviction.nbytes
            fits = min(len(new), tree.free_bytes // unit_tokens)
            if fits > 0:
                tree.insert(node, new[:fits], Span(fits, unit_tokens, now_s))
        finally:
            tree.unlock(node)

    @property
    def evicted(self) -> bool:
        return self._evictions > 0

    def stats(self) -> PrefixStats:
        s = self._tree.stats()
        return PrefixStats(self._evictions, self._evicted_tokens, s.total_bytes, s.nodes)
