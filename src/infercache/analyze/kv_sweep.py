"""Prefix reuse at every KV budget from one pass: Mattson's LRU stack algorithm over the spans
of the prefix tree (simulated_prefix_cache.py).

Why it works. The radix tree evicts least-recently-used unlocked leaves. A request touches its
whole matched path at once, so a node is never less recent than its descendants, and evicting
the least recent leaf is evicting the least recent node: the cache behaves as LRU over spans
(runs of tokens), which has the inclusion property. A span last used at request t is still
cached at budget S exactly when the tokens of every span used since t, plus the span and the
ancestors used with it at t, fit in S. Call that total its `need`; it is the span's LRU stack
distance in tokens. One unbounded tree answers every budget: reuse at S is the run of leading
matched spans whose need is at most S.

How. Each span's tokens are a weight at the index of the request that last used it, in a
Fenwick tree over request indexes; `need` is a suffix sum plus the same-request ancestors'
tokens. A request's reused tokens (capped at prompt − 1, as the engine recomputes the last
token) and whether it reused anything are added to the bin of the smallest power of two at
least `need`: the curve at budget 2^b is the running sum up to bin b. Along a path `need` never
decreases (ancestors are at least as recent), so the bins add up to the tree's own figures at
every budget the working set fits in.

Approximation: the real tree evicts whole leaves of its own shape (a bounded tree splits
differently from the unbounded one), so a bounded replay can reuse slightly less than the
curve says at the same budget; tests/analyze/test_kv_sweep.py bounds the gap against real
bounded replays. Cost: O(log n) per distinct last-use index on a request's path.

`curve()` gives (budget, token share, hit share) from the first budget that reuses anything to
the first where the share stops rising (within `flat`), and `knee()` the budget farthest above
the chord of that curve on a log-budget axis (Kneedle): past it each doubling adds less.

A disk tier below RAM (`with_disk`, the engine's kv_tiers.py). The engine writes every whole
block through to disk and refreshes a block's disk recency whenever a request uses it, so disk
is an LRU over the same accesses as RAM, holding everything RAM holds while it is the larger:
RAM of R tokens over a disk of D together reuse what one LRU cache of max(R, D) would, the curve
at max(R, D), of which the curve at R comes from RAM. Approximation: the disk holds and loads
whole blocks only, so each request's share from disk is over-counted by less than one block
(`block_tokens`, 64 by default in the engine); budgets between powers of two round down.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

MAX_BIN = 62


class Weighted(Protocol):
    """A span as the sweep sees it: its tokens and the index of the request last using it."""

    @property
    def nbytes(self) -> int: ...

    last_index: int


class Fenwick:
    """Prefix sums over indexes 1..n that grow as needed (a binary indexed tree)."""

    def __init__(self, size: int = 1 << 12) -> None:
        self._size = size
        self._tree = [0] * (size + 1)
        self._values = [0] * (size + 1)
        self.total = 0

    def add(self, index: int, weight: int) -> None:
        if index > self._size:
            self._grow(index)
        self._values[index] += weight
        self.total += weight
        tree, size = self._tree, self._size
        while index <= size:
            tree[index] += weight
            index += index & -index

    def prefix(self, index: int) -> int:
        """Sum of the weights at indexes 1..index."""
        index = min(index, self._size)
        tree, out = self._tree, 0
        while index > 0:
            out += tree[index]
            index -= index & -index
        return out

    def _grow(self, index: int) -> None:
        size = max(2 * self._size, index)
        values = self._values + [0] * (size - self._size)
        tree = values[:]
        for i in range(1, size + 1):  # the linear-time construction
            parent = i + (i & -i)
            if parent <= size:
                tree[parent] += tree[i]
        self._size, self._values, self._tree = size, values, tree


def budget_bin(need_tokens: int) -> int:
    """The smallest b with 2**b >= need_tokens."""
    return min(MAX_BIN, max(0, need_tokens - 1).bit_length())


@dataclass(frozen=True, slots=True)
class SweepPoint:
    budget_tokens: int
    token_share: float  # reused prompt tokens / all prompt tokens, at this KV budget
    hit_share: float  # requests reusing at least one token / all requests


@dataclass(frozen=True, slots=True)
class TieredPoint:
    ram_tokens: int
    disk_tokens: int
    token_share: float  # prompt tokens reused, from RAM or disk / all prompt tokens
    disk_share: float  # of those, loaded from disk / all prompt tokens


class BudgetSweep:
    """Accumulates the reuse curve; driven by SimulatedPrefixCache (see the module docstring)."""

    def __init__(self) -> None:
        self._weights = Fenwick()
        self._tokens = [0] * (MAX_BIN + 1)
        self._hits = [0] * (MAX_BIN + 1)
        self.requests = 0
        self.prompt_tokens = 0

    def access(self, path: Sequence[Weighted], prompt_tokens: int, now_index: int) -> None:
        """One request matched `path` (spans not yet marked used at `now_index`)."""
        self.requests += 1
        self.prompt_tokens += prompt_tokens
        weights = self._weights
        cap, reused, first = prompt_tokens - 1, 0, True
        last, distance, same = -1, 0, 0
        for span in path:
            tokens = span.nbytes
            if span.last_index != last:
                last = span.last_index
                distance, same = weights.total - weights.prefix(last), 0
            same += tokens
            take = min(tokens, cap - reused)
            if take <= 0:
                break
            b = budget_bin(distance + same)
            self._tokens[b] += take
            if first:
                self._hits[b] += 1
                first = False
            reused += take
        moved = 0
        last = -1
        for span in path:  # every span of the path now weighs at now_index
            if span.last_index != last and moved:
                weights.add(last, -moved)
                moved = 0
            last = span.last_index
            moved += span.nbytes
        if moved:
            weights.add(last, -moved)
        total = sum(span.nbytes for span in path)
        if total:
            weights.add(now_index, total)

    def inserted(self, span: Weighted) -> None:
        self._weights.add(span.last_index, span.nbytes)

    def evicted(self, spans: Sequence[Weighted]) -> None:
        for span in spans:
            self._weights.add(span.last_index, -span.nbytes)

    def curve(self, *, flat: float = 0.001) -> list[SweepPoint]:
        if not self.prompt_tokens or not any(self._tokens):
            return []
        first = next(b for b, t in enumerate(self._tokens) if t)
        plateau = sum(self._tokens) / self.prompt_tokens
        points: list[SweepPoint] = []
        tokens = hits = 0
        for b in range(MAX_BIN + 1):
            tokens += self._tokens[b]
            hits += self._hits[b]
            if b < first:
                continue
            share = tokens / self.prompt_tokens
            points.append(SweepPoint(1 << b, share, hits / self.requests))
            if share >= plateau - flat:
                break
        return points

    def share_at(self, budget_tokens: int) -> float:
        """The token share at a budget (rounded down to a power of two)."""
        if not self.prompt_tokens or budget_tokens < 1:
            return 0.0
        top = min(MAX_BIN, budget_tokens.bit_length() - 1)
        return sum(self._tokens[: top + 1]) / self.prompt_tokens

    def with_disk(self, disk_tokens: int | None, points: Sequence[SweepPoint]) -> list[TieredPoint]:
        """The reuse at each of `points`' RAM budgets over a disk tier of `disk_tokens`
        (none: an empty list)."""
        out: list[TieredPoint] = []
        if not disk_tokens:
            return out
        for p in points:
            total = max(p.token_share, self.share_at(max(p.budget_tokens, disk_tokens)))
            out.append(TieredPoint(p.budget_tokens, disk_tokens, total, total - p.token_share))
        return out

    def knee(self, points: Sequence[SweepPoint]) -> SweepPoint | None:
        """The Kneedle knee of `points` (budgets on a log axis), or None under 3 points."""
        if len(points) < 3:
            return points[-1] if points else None
        x0 = points[0].budget_tokens.bit_length()
        x1 = points[-1].budget_tokens.bit_length()
        y0, y1 = points[0].token_share, points[-1].token_share
        if y1 <= y0:
            return points[0]

        def lift(p: SweepPoint) -> float:
            x = (p.budget_tokens.bit_length() - x0) / (x1 - x0)
            return (p.token_share - y0) / (y1 - y0) - x

        return max(points, key=lift)
