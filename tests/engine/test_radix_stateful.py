"""Hypothesis stateful test: the radix tree against a naive model of what is cached.

The model is a set of cached (namespace, token prefix) pairs. Inserting a sequence adds its
prefixes; an eviction removes exactly the prefixes its payloads stand for, and must only take
prefixes nothing cached extends and no held lock covers, least recently used first (replayed
naively: each evicted node had the oldest access among the leaves evictable at that moment).
After every step the tree must agree with the model (the same cached prefixes, the longest
common prefix as match length) and keep its invariants: lock counts equal to the locks held
through each node (never negative), evictable + locked bytes == total bytes <= max_kv_bytes,
payloads matching node keys, and the tree's evictable set equal to the unlocked leaves found
by a walk.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from infercache.engine.radix import RadixNode, RadixTree

from .payloads import BYTES_PER_TOKEN, TokenRun

MAX_TOKENS = 12
namespaces = st.sampled_from(["a", "b"])
sequences = st.lists(st.integers(0, 3), max_size=8).map(tuple)


def prefixes(
    ns: str, seq: tuple[int, ...], start: int, end: int
) -> set[tuple[str, tuple[int, ...]]]:
    return {(ns, seq[:k]) for k in range(start + 1, end + 1)}


class RadixMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tree: RadixTree[TokenRun] = RadixTree(max_kv_bytes=MAX_TOKENS * BYTES_PER_TOKEN)
        self.cached: set[tuple[str, tuple[int, ...]]] = set()
        self.held: list[tuple[RadixNode[TokenRun], str, tuple[int, ...]]] = []

    def naive_match(self, ns: str, seq: tuple[int, ...]) -> int:
        return max(k for k in range(len(seq) + 1) if k == 0 or (ns, seq[:k]) in self.cached)

    def apply_eviction(self, payloads: tuple[TokenRun, ...], ns_of: dict[int, str]) -> None:
        for p in payloads:
            ns = ns_of[id(p)]
            gone = prefixes(ns, p.sequence, p.start, p.end)
            assert gone <= self.cached
            self.cached -= gone
            deepest = p.sequence[: p.end]
            assert not any(n == ns and s[: len(deepest)] == deepest for n, s in self.cached)
            assert not any(
                n == ns and held[: len(deepest)] == deepest for _, n, held in self.held
            ), "evicted KV under a held lock"

    def evict(self, nbytes: int) -> None:
        nodes = list(self.tree.nodes())
        ns_of = {id(n.payload): n.namespace for n in nodes}
        node_of = {id(n.payload): n for n in nodes}
        children = {id(n): set(map(id, n.children.values())) for n in nodes}
        evictable = {n for n in nodes if not n.children and n.lock_count == 0}
        ev = self.tree.evict(nbytes)
        assert ev.nbytes == sum(p.nbytes for p in ev.payloads)
        for payload in ev.payloads:  # replay: always the least recently used evictable leaf
            node = node_of[id(payload)]
            assert node in evictable
            assert node.last_access == min(n.last_access for n in evictable)
            evictable.discard(node)
            parent = node.parent
            assert parent is not None
            if id(parent) in children:
                children[id(parent)].discard(id(node))
                if not children[id(parent)] and parent.lock_count == 0:
                    evictable.add(parent)
        self.apply_eviction(ev.payloads, ns_of)

    @rule(ns=namespaces, seq=sequences)
    def insert(self, ns: str, seq: tuple[int, ...]) -> None:
        m = self.tree.match_prefix(ns, seq)
        assert m.length == self.naive_match(ns, seq)
        self.tree.lock(m.node)
        new = len(seq) - m.length
        self.held.append((m.node, ns, seq[: m.length]))
        self.evict(new * BYTES_PER_TOKEN)
        fits = min(new, self.tree.free_bytes // BYTES_PER_TOKEN)
        if fits:
            run = TokenRun(seq, m.length, m.length + fits)
            result = self.tree.insert(m.node, seq[m.length : m.length + fits], run)
            assert result.unused is None
            self.cached |= prefixes(ns, seq, m.length, m.length + fits)
        self.held.pop()
        self.tree.unlock(m.node)

    @rule(ns=namespaces, seq=sequences)
    def match(self, ns: str, seq: tuple[int, ...]) -> None:
        m = self.tree.match_prefix(ns, seq)
        assert m.length == self.naive_match(ns, seq)
        assert tuple(t for p in m.payloads for t in p.tokens) == seq[: m.length]

    @rule(ns=namespaces, seq=sequences)
    def lock(self, ns: str, seq: tuple[int, ...]) -> None:
        m = self.tree.match_prefix(ns, seq)
        self.tree.lock(m.node)
        self.held.append((m.node, ns, seq[: m.length]))

    @precondition(lambda self: bool(self.held))
    @rule(index=st.integers(0, 100))
    def unlock(self, index: int) -> None:
        node, _, _ = self.held.pop(index % len(self.held))
        self.tree.unlock(node)

    @rule(tokens=st.integers(0, MAX_TOKENS + 2))
    def evict_for(self, tokens: int) -> None:
        self.evict(tokens * BYTES_PER_TOKEN)

    @invariant()
    def tree_agrees_with_model(self) -> None:
        derived: set[tuple[str, tuple[int, ...]]] = set()
        for node in self.tree.nodes():
            path = self.path(node)
            assert node.key
            assert node.payload is not None
            assert node.payload.tokens == node.key
            assert node.payload.sequence[: node.payload.start] == path[: -len(node.key)]
            assert node.parent is not None
            assert node.parent.children[node.key[0]] is node
            derived |= prefixes(node.namespace, path, len(path) - len(node.key), len(path))
        assert derived == self.cached

    @invariant()
    def evictable_set_is_the_unlocked_leaves(self) -> None:
        walked = {n for n in self.tree.nodes() if not n.children and n.lock_count == 0}
        assert self.tree.evictable_leaves() == walked

    @invariant()
    def locks_and_bytes_are_consistent(self) -> None:
        stats = self.tree.stats()
        total = locked = 0
        for node in self.tree.nodes():
            expected = sum(1 for held, _, _ in self.held if self.is_on_path(node, held))
            assert node.lock_count == expected >= 0
            total += node.nbytes
            locked += node.nbytes if node.lock_count else 0
        assert stats.total_bytes == total <= self.tree.max_kv_bytes
        assert stats.locked_bytes == locked
        assert stats.evictable_bytes + stats.locked_bytes == stats.total_bytes

    @staticmethod
    def path(node: RadixNode[TokenRun]) -> tuple[int, ...]:
        keys: list[tuple[int, ...]] = []
        cur: RadixNode[TokenRun] | None = node
        while cur is not None:
            keys.append(cur.key)
            cur = cur.parent
        return tuple(t for key in reversed(keys) for t in key)

    @staticmethod
    def is_on_path(node: RadixNode[TokenRun], held: RadixNode[TokenRun]) -> bool:
        cur: RadixNode[TokenRun] | None = held
        while cur is not None:
            if cur is node:
                return True
            cur = cur.parent
        return False


RadixMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestRadixTreeAgainstNaiveModel = RadixMachine.TestCase
