"""The engine's prefix cache without any KV: which prompt tokens it would reuse, over the engine's
radix tree (engine/radix.py, its public API only).

`SimulatedPrefixCache.observe(namespace, units, ...)` does what the engine's prefix cache does
for one request (engine/prefix_cache.py): match the longest cached prefix of the prompt, lock
the matched node, evict least-recently-used unlocked leaves to make room, insert the rest of
the prompt below the node (only the head that fits, when even eviction cannot make room),
unlock. Reused tokens are capped at `prompt_tokens - 1`, because the engine always recomputes
the last prompt token (its logits start generation).

A unit is a token id (text logs, 1 token), a block hash (block traces: `unit_tokens` tokens a
block, 512 in Mooncake's) or a chunk hash of a redacted log (each unit its own token count, a
tuple). Payloads only count tokens, so the tree's byte budget is a budget in tokens:
`capacity_tokens`. Each payload also remembers when a request last went through it (the reuse
distance of a match) and that request's index (for the KV sweep, kv_sweep.py, which a cache
may drive: `sweep`).

The census runs one unbounded; the replay one per simulated KV budget. Eviction frees exactly
what the insert needs: the tree keeps its evictable leaves up to date, so an eviction costs
O(log n) per evicted node. Not thread-safe (one owner), like the tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Self

from infercache.analyze.kv_sweep import BudgetSweep
from infercache.engine.radix import RadixNode, RadixTree

UNBOUNDED_TOKENS = 1 << 62
TokensPerUnit = int | tuple[int, ...]  # one size for every unit, or each unit's own


class Span:
    """A payload standing for the KV of some units: `nbytes` is their token count. `sizes`
    holds each unit's tokens when they differ (redacted logs), else None."""

    __slots__ = ("last_index", "last_seen_s", "nbytes", "sizes", "unit_tokens", "units")

    def __init__(
        self, units: int, unit_tokens: TokensPerUnit, last_seen_s: float, last_index: int
    ) -> None:
        self.units = units
        self.last_seen_s = last_seen_s
        self.last_index = last_index
        if isinstance(unit_tokens, tuple):
            self.sizes: tuple[int, ...] | None = unit_tokens
            self.unit_tokens = 0
            self.nbytes = sum(unit_tokens)
        else:
            self.sizes = None
            self.unit_tokens = unit_tokens
            self.nbytes = units * unit_tokens

    def split(self, at_tokens: int) -> tuple[Self, Self]:
        """(the first `at_tokens` units, the rest): the tree counts units as its tokens."""
        cls = type(self)
        if self.sizes is not None:
            head_sizes, tail_sizes = self.sizes[:at_tokens], self.sizes[at_tokens:]
            return (
                cls(at_tokens, head_sizes, self.last_seen_s, self.last_index),
                cls(self.units - at_tokens, tail_sizes, self.last_seen_s, self.last_index),
            )
        head = cls(at_tokens, self.unit_tokens, self.last_seen_s, self.last_index)
        tail = cls(self.units - at_tokens, self.unit_tokens, self.last_seen_s, self.last_index)
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
    def __init__(self, *, capacity_tokens: int | None = None, sweep: bool = False) -> None:
        if capacity_tokens is not None and capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
        self.capacity_tokens = capacity_tokens
        capacity = UNBOUNDED_TOKENS if capacity_tokens is None else capacity_tokens
        self._tree: RadixTree[Span] = RadixTree(max_kv_bytes=capacity)
        self.sweep = BudgetSweep() if sweep else None
        self._requests = 0
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
        unit_tokens: TokensPerUnit,
        prompt_tokens: int,
        now_s: float,
    ) -> Reuse:
        """Account one request's prompt (`units`, `prompt_tokens` tokens) arriving at `now_s`."""
        self._requests += 1
        index = self._requests
        match = self._tree.match_prefix(namespace, units)
        payloads = match.payloads
        if self.sweep is not None:
            self.sweep.access(payloads, prompt_tokens, index)
        last_seen_s = payloads[-1].last_seen_s if payloads else None
        matched = 0
        for payload in payloads:
            payload.last_seen_s = now_s
            payload.last_index = index
            matched += payload.nbytes
        matched_tokens = min(matched, prompt_tokens)
        if match.length < len(units):
            rest = unit_tokens[match.length :] if isinstance(unit_tokens, tuple) else unit_tokens
            self._insert(match.node, units[match.length :], rest, now_s, index)
        return Reuse(matched_tokens, max(0, min(matched_tokens, prompt_tokens - 1)), last_seen_s)

    def _insert(
        self,
        node: RadixNode[Span],
        new: tuple[int, ...],
        unit_tokens: TokensPerUnit,
        now_s: float,
        index: int,
    ) -> None:
        tree = self._tree
        new = tuple(map(self._ints.setdefault, new, new))
        span = Span(len(new), unit_tokens, now_s, index)
        if span.nbytes > tree.free_bytes:
            # As the engine does: lock the matched path so eviction cannot take the node we
            # insert below, evict what the insert needs, insert what fits, unlock.
            tree.lock(node)
            try:
                eviction = tree.evict(span.nbytes)
                if eviction.payloads:
                    self._evictions += 1
                    self._evicted_tokens += eviction.nbytes
                    if self.sweep is not None:
                        self.sweep.evicted(eviction.payloads)
                span = self._head_that_fits(span, tree.free_bytes)
                if span.units:
                    self._store(node, new[: span.units], span)
            finally:
                tree.unlock(node)
            return
        self._store(node, new, span)

    def _store(self, node: RadixNode[Span], units: tuple[int, ...], span: Span) -> None:
        self._tree.insert(node, units, span)
        if self.sweep is not None:
            self.sweep.inserted(span)

    @staticmethod
    def _head_that_fits(span: Span, free_tokens: int) -> Span:
        if span.nbytes <= free_tokens:
            return span
        if span.sizes is None:
            return span.split(free_tokens // span.unit_tokens)[0]
        fits, used = 0, 0
        for size in span.sizes:
            if used + size > free_tokens:
                break
            fits, used = fits + 1, used + size
        return span.split(fits)[0]

    @property
    def evicted(self) -> bool:
        return self._evictions > 0

    def stats(self) -> PrefixStats:
        s = self._tree.stats()
        return PrefixStats(self._evictions, self._evicted_tokens, s.total_bytes, s.nodes)
