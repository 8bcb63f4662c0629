"""Radix tree over token ids: which prompt prefixes have cached KV, and which KV to evict.

Algorithm (SGLang's RadixAttention cache, for one worker):
- Each namespace (a tenant, or one shared namespace) has its own root, so KV is never matched
  across namespaces.
- A node holds a run of tokens (`key`) and the opaque KV payload for exactly those tokens.
  Children are keyed by their first token: a lookup is one dict probe per node plus a
  comparison of the tokens inside it.
- `match_prefix` walks down as far as the tokens agree. A match that ends inside a node splits
  it, so a match always ends on a node boundary: that node is what callers lock and insert under.
- `insert(node, tokens, payload)` appends tokens below a matched node. Tokens already present
  there (inserted meanwhile by someone else) are not duplicated: their share of the payload is
  handed back as `unused`, for the caller to free.
- `lock(node)` / `unlock(node)` count the users of a node and of every ancestor up to its root.
  Only unlocked leaves are evictable; evicting a leaf can make its parent an evictable leaf.
- `evict(nbytes)` removes evictable leaves, lowest `EvictionPolicy.priority` first (eviction.py;
  least recently used by a logical access counter, by default), until `nbytes` more fit under
  `max_kv_bytes`. The removed payloads are returned: the tree never frees memory itself.
- The evictable leaves are kept up to date as the tree changes (as SGLang's radix cache keeps
  `evictable_leaves`), never found by a walk: a node enters the set when it becomes an unlocked
  leaf (an insert, the last unlock, its last child evicted) and leaves it when it gains a child,
  is locked or is evicted. Beside the set, a heap orders them: an entry is pushed when a leaf
  enters the set or is accessed, and stale entries (a node since accessed, locked or gone) are
  skipped when popped, so an eviction costs O(log n) per evicted node, whatever the tree's size.
  The heap is rebuilt from the set when stale entries outnumber live ones. A policy's
  `priority` is read when a leaf enters the set or is accessed: it must depend only on what
  changes then (LRU's access counter does).

Invariants (checked by tests/engine/test_radix*.py):
- a non-root node's key is non-empty and its payload covers exactly its key's tokens;
  siblings start with distinct tokens;
- payload sizes are additive under `split` (`head.nbytes + tail.nbytes == whole.nbytes`);
- lock counts are >= 0, and a node's count >= each child's count;
- `evictable_bytes + locked_bytes == total_bytes <= max_kv_bytes`;
- the evictable set is exactly the non-root leaves whose lock count is 0;
- an empty, unlocked namespace root is dropped (at its next `unlock`, or the next `evict`).

Parameters: `max_kv_bytes` (the budget), `policy` (eviction order).
Pure: no torch here; payloads only need `nbytes` and `split`. Not thread-safe: one owner (the
engine's worker thread) calls it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, Self, TypeVar

from infercache.engine.eviction import EvictionPolicy, LRUPolicy


class KVPayload(Protocol):
    """The KV of a run of tokens, as the tree sees it: a size and a way to cut it in two."""

    @property
    def nbytes(self) -> int: ...

    def split(self, at_tokens: int) -> tuple[Self, Self]:
        """(the first `at_tokens` tokens, the rest)."""
        ...


P = TypeVar("P", bound=KVPayload)


class RadixNode(Generic[P]):
    """A run of tokens with its KV. Callers only hold nodes to pass them back to the tree."""

    __slots__ = (
        "attached",
        "children",
        "heap_entry",
        "key",
        "last_access",
        "lock_count",
        "namespace",
        "parent",
        "payload",
    )

    def __init__(
        self, key: tuple[int, ...], payload: P | None, parent: RadixNode[P] | None, namespace: str
    ) -> None:
        self.key = key
        self.payload = payload
        self.parent = parent
        self.namespace = namespace
        self.children: dict[int, RadixNode[P]] = {}
        self.lock_count = 0
        self.last_access = 0
        self.attached = True
        # The order number of this node's live heap entry while it is evictable, else None.
        self.heap_entry: int | None = None

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def nbytes(self) -> int:
        return 0 if self.payload is None else self.payload.nbytes

    def __repr__(self) -> str:
        return f"RadixNode(tokens={len(self.key)}, lock_count={self.lock_count})"


@dataclass(frozen=True, slots=True)
class PrefixMatch(Generic[P]):
    """`length` tokens matched; `node` ends exactly there (the namespace root when 0);
    `payloads` cover tokens[:length], root to node."""

    length: int
    node: RadixNode[P]
    payloads: tuple[P, ...]


@dataclass(frozen=True, slots=True)
class InsertResult(Generic[P]):
    """`node` ends where the inserted tokens end; `unused` is the part of the payload that
    duplicated tokens already present (the caller frees it), or None."""

    node: RadixNode[P]
    inserted_tokens: int
    unused: P | None


@dataclass(frozen=True, slots=True)
class Eviction(Generic[P]):
    payloads: tuple[P, ...]
    tokens: int
    nbytes: int


@dataclass(frozen=True, slots=True)
class RadixStats:
    total_bytes: int
    locked_bytes: int
    evictable_bytes: int
    total_tokens: int
    nodes: int
    namespaces: int


def _common_prefix_len(key: tuple[int, ...], tokens: tuple[int, ...], start: int) -> int:
    n = min(len(key), len(tokens) - start)
    if key[:n] == tokens[start : start + n]:
        return n
    i = 0
    while key[i] == tokens[start + i]:
        i += 1
    return i


def _is_evictable(node: RadixNode[Any]) -> bool:
    return node.attached and not node.is_root and not node.children and node.lock_count == 0


class RadixTree(Generic[P]):
    def __init__(self, *, max_kv_bytes: int, policy: EvictionPolicy | None = None) -> None:
        if max_kv_bytes < 0:
            raise ValueError(f"max_kv_bytes must be >= 0, got {max_kv_bytes}")
        self.max_kv_bytes = max_kv_bytes
        self._policy: EvictionPolicy = policy if policy is not None else LRUPolicy()
        self._roots: dict[str, RadixNode[P]] = {}
        self._total_bytes = 0
        self._locked_bytes = 0
        self._total_tokens = 0
        self._nodes = 0
        self._access = 0
        self._evictable: set[RadixNode[P]] = set()
        self._heap: list[tuple[float, int, RadixNode[P]]] = []
        self._order = itertools.count()  # heap ties break by push order, never by address
        self._new_roots: list[RadixNode[P]] = []

    # -- lookups and inserts --------------------------------------------------------------

    def match_prefix(self, namespace: str, tokens: Sequence[int]) -> PrefixMatch[P]:
        root = self._roots.get(namespace)
        if root is None:
            if len(self._new_roots) >= 64:
                self._drop_new_roots()
            root = self._roots[namespace] = RadixNode((), None, None, namespace)
            self._new_roots.append(root)  # dropped by the next evict if still idle
        node, length, payloads = self._walk(root, tuple(tokens))
        return PrefixMatch(length=length, node=node, payloads=tuple(payloads))

    def insert(self, node: RadixNode[P], tokens: Sequence[int], payload: P) -> InsertResult[P]:
        """Append `tokens` (with `payload`, their KV) below `node`, a node returned by
        `match_prefix` or `insert` that the caller kept locked."""
        if not node.attached:
            raise ValueError("cannot insert below an evicted node (lock it while in use)")
        key = tuple(tokens)
        end, present, _ = self._walk(node, key)
        if present == len(key):
            return InsertResult(node=end, inserted_tokens=0, unused=payload)
        unused, fresh = (None, payload) if present == 0 else payload.split(present)
        if self._total_bytes + fresh.nbytes > self.max_kv_bytes:
            raise ValueError(
                f"inserting {fresh.nbytes} bytes would exceed max_kv_bytes={self.max_kv_bytes} "
                f"({self._total_bytes} used): evict first"
            )
        leaf: RadixNode[P] = RadixNode(key[present:], fresh, end, end.namespace)
        leaf.last_access = self._tick()
        end.children[leaf.key[0]] = leaf
        self._not_evictable(end)
        self._update_evictable(leaf)
        self._nodes += 1
        self._total_bytes += fresh.nbytes
        self._total_tokens += len(leaf.key)
        return InsertResult(node=leaf, inserted_tokens=len(leaf.key), unused=unused)

    def _walk(
        self, start: RadixNode[P], tokens: tuple[int, ...]
    ) -> tuple[RadixNode[P], int, list[P]]:
        """Follow `tokens` down from `start`, splitting a node the walk ends inside."""
        tick = self._tick()
        node, i, payloads = start, 0, []
        node.last_access = tick
        while i < len(tokens):
            child = node.children.get(tokens[i])
            if child is None:
                break
            common = _common_prefix_len(child.key, tokens, i)
            if common < len(child.key):
                child = self._split(child, common)
            assert child.payload is not None
            child.last_access = tick
            payloads.append(child.payload)
            node, i = child, i + common
        if node.heap_entry is not None:  # an evictable leaf was used: re-queue it
            self._push(node)
        return node, i, payloads

    def _split(self, node: RadixNode[P], at: int) -> RadixNode[P]:
        """Cut `node` after `at` tokens; return the new head (the tail keeps `node`'s identity,
        children and payload tail). Both halves keep the lock count: locks propagate upward."""
        assert node.payload is not None
        assert node.parent is not None
        assert 0 < at < len(node.key)
        head_payload, tail_payload = node.payload.split(at)
        assert head_payload.nbytes + tail_payload.nbytes == node.payload.nbytes
        head: RadixNode[P] = RadixNode(node.key[:at], head_payload, node.parent, node.namespace)
        head.lock_count = node.lock_count
        head.last_access = node.last_access
        node.parent.children[head.key[0]] = head
        node.key, node.payload, node.parent = node.key[at:], tail_payload, head
        head.children[node.key[0]] = node
        self._nodes += 1
        return head

    # -- locks ----------------------------------------------------------------------------

    def lock(self, node: RadixNode[P]) -> None:
        if not node.attached:
            raise ValueError("cannot lock an evicted node")
        self._not_evictable(node)  # only the locked node itself can be a leaf
        cur: RadixNode[P] | None = node
        while cur is not None:
            if cur.lock_count == 0:
                self._locked_bytes += cur.nbytes
            cur.lock_count += 1
            cur = cur.parent

    def unlock(self, node: RadixNode[P]) -> None:
        if node.lock_count <= 0:
            raise ValueError(f"unlock of {node!r}, which is not locked")
        cur: RadixNode[P] | None = node
        root = node
        while cur is not None:
            cur.lock_count -= 1
            if cur.lock_count == 0:
                self._locked_bytes -= cur.nbytes
            root, cur = cur, cur.parent
        self._update_evictable(node)
        self._drop_if_idle(root)

    # -- eviction -------------------------------------------------------------------------

    def evict(self, nbytes: int) -> Eviction[P]:
        """Evict until `nbytes` more fit under the budget, or nothing evictable is left."""
        excess = self._total_bytes + nbytes - self.max_kv_bytes
        payloads: list[P] = []
        tokens = freed = 0
        while freed < excess and self._evictable:
            leaf = self._pop_evictable()
            parent = leaf.parent
            assert leaf.payload is not None
            assert parent is not None
            self._detach(leaf)
            payloads.append(leaf.payload)
            freed += leaf.nbytes
            tokens += len(leaf.key)
            self._update_evictable(parent)
            self._drop_if_idle(parent)
        self._drop_new_roots()
        return Eviction(payloads=tuple(payloads), tokens=tokens, nbytes=freed)

    def evictable_leaves(self) -> frozenset[RadixNode[P]]:
        """The nodes `evict` may take next: every unlocked non-root leaf."""
        return frozenset(self._evictable)

    # -- the evictable set and its heap ---------------------------------------------------

    def _update_evictable(self, node: RadixNode[P]) -> None:
        """Put `node` in the evictable set if it is an unlocked, attached non-root leaf."""
        if node.heap_entry is None and _is_evictable(node):
            self._evictable.add(node)
            self._push(node)

    def _not_evictable(self, node: RadixNode[P]) -> None:
        if node.heap_entry is not None:
            node.heap_entry = None  # its heap entries are stale from now on
            self._evictable.discard(node)

    def _push(self, node: RadixNode[P]) -> None:
        if len(self._heap) > 2 * len(self._evictable) + 64:
            self._rebuild_heap()
        order = next(self._order)
        node.heap_entry = order
        heapq.heappush(self._heap, (self._policy.priority(node), order, node))

    def _rebuild_heap(self) -> None:
        """Drop stale entries: one fresh entry per evictable leaf, in the old relative order."""
        live = [entry for entry in self._heap if entry[2].heap_entry == entry[1]]
        heapq.heapify(live)
        self._heap = live

    def _pop_evictable(self) -> RadixNode[P]:
        while True:
            _priority, order, node = heapq.heappop(self._heap)
            if node.heap_entry == order:
                self._not_evictable(node)
                return node

    def _detach(self, leaf: RadixNode[P]) -> None:
        assert leaf.parent is not None
        del leaf.parent.children[leaf.key[0]]
        leaf.attached = False
        self._nodes -= 1
        self._total_bytes -= leaf.nbytes
        self._total_tokens -= len(leaf.key)

    def _drop_new_roots(self) -> None:
        """Drop the roots created since the last call that were never used (a match with no
        lock); the others are dropped by `unlock` or `evict` once idle."""
        new_roots, self._new_roots = self._new_roots, []
        for root in new_roots:
            self._drop_if_idle(root)

    def _drop_if_idle(self, root: RadixNode[P]) -> None:
        if root.is_root and not root.children and root.lock_count == 0:
            if self._roots.get(root.namespace) is root:
                del self._roots[root.namespace]
            root.attached = False

    # -- introspection --------------------------------------------------------------------

    def nodes(self) -> Iterator[RadixNode[P]]:
        """Every non-root node, depth first."""
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def roots(self) -> dict[str, RadixNode[P]]:
        return dict(self._roots)

    @property
    def free_bytes(self) -> int:
        return self.max_kv_bytes - self._total_bytes

    def stats(self) -> RadixStats:
        return RadixStats(
            total_bytes=self._total_bytes,
            locked_bytes=self._locked_bytes,
            evictable_bytes=self._total_bytes - self._locked_bytes,
            total_tokens=self._total_tokens,
            nodes=self._nodes,
            namespaces=len(self._roots),
        )

    def _tick(self) -> int:
        self._access += 1
        return self._access
