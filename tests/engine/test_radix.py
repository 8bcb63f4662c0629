"""Scenario tests of the radix tree: exact match lengths, splits, locks, eviction order."""

from __future__ import annotations

import pytest

from infercache.engine.radix import RadixNode, RadixTree

from .payloads import BYTES_PER_TOKEN, TokenRun


def tree(max_tokens: int = 1000) -> RadixTree[TokenRun]:
    return RadixTree(max_kv_bytes=max_tokens * BYTES_PER_TOKEN)


def put(t: RadixTree[TokenRun], tokens: tuple[int, ...], namespace: str = "a") -> None:
    """Cache `tokens` the way the engine does: match, lock, insert the rest, unlock."""
    m = t.match_prefix(namespace, tokens)
    t.lock(m.node)
    try:
        if m.length < len(tokens):
            t.evict((len(tokens) - m.length) * BYTES_PER_TOKEN)
            t.insert(m.node, tokens[m.length :], TokenRun.of(tokens, m.length))
    finally:
        t.unlock(m.node)


def keys(t: RadixTree[TokenRun]) -> set[tuple[int, ...]]:
    return {n.key for n in t.nodes()}


def test_empty_tree_matches_nothing() -> None:
    m = tree().match_prefix("a", (1, 2, 3))
    assert m.length == 0
    assert m.payloads == ()
    assert m.node.is_root


def test_match_returns_longest_cached_prefix_and_its_payloads_in_order() -> None:
    t = tree()
    put(t, (1, 2, 3, 4))
    put(t, (1, 2, 3, 4, 5, 6))
    m = t.match_prefix("a", (1, 2, 3, 4, 5, 9))
    assert m.length == 5
    covered = tuple(tok for p in m.payloads for tok in p.tokens)
    assert covered == (1, 2, 3, 4, 5)


def test_partial_match_splits_the_node_at_the_divergence() -> None:
    t = tree()
    put(t, (1, 2, 3, 4, 5))
    m = t.match_prefix("a", (1, 2, 9))
    assert m.length == 2
    assert keys(t) == {(1, 2), (3, 4, 5)}
    assert m.node.key == (1, 2)
    assert t.stats().total_tokens == 5  # a split moves no KV


def test_insert_of_a_diverging_sequence_makes_siblings() -> None:
    t = tree()
    put(t, (1, 2, 3, 4))
    put(t, (1, 2, 7, 8))
    assert keys(t) == {(1, 2), (3, 4), (7, 8)}
    assert t.match_prefix("a", (1, 2, 7, 8, 9)).length == 4
    assert t.stats().total_tokens == 6


def test_insert_of_tokens_already_present_hands_the_payload_back() -> None:
    t = tree()
    put(t, (1, 2, 3, 4))
    root = t.match_prefix("a", ()).node
    t.lock(root)
    result = t.insert(root, (1, 2, 3, 4, 5), TokenRun.of((1, 2, 3, 4, 5)))
    t.unlock(root)
    assert result.inserted_tokens == 1
    assert result.unused is not None
    assert result.unused.tokens == (1, 2, 3, 4)
    assert t.stats().total_tokens == 5


def test_namespaces_never_share_prefixes() -> None:
    t = tree()
    put(t, (1, 2, 3, 4), namespace="tenant-a")
    assert t.match_prefix("tenant-b", (1, 2, 3, 4, 5)).length == 0
    assert t.match_prefix("tenant-a", (1, 2, 3, 4, 5)).length == 4


def test_lock_counts_propagate_to_the_root_and_protect_bytes() -> None:
    t = tree()
    put(t, (1, 2, 3, 4))
    m = t.match_prefix("a", (1, 2, 9))  # splits into (1, 2) -> (3, 4)
    t.lock(m.node)
    leaf = next(n for n in t.nodes() if n.key == (3, 4))
    assert m.node.lock_count == 1
    assert leaf.lock_count == 0
    assert t.stats().locked_bytes == 2 * BYTES_PER_TOKEN
    assert t.stats().evictable_bytes == 2 * BYTES_PER_TOKEN
    t.unlock(m.node)
    assert t.stats().locked_bytes == 0


def test_unlock_of_an_unlocked_node_raises() -> None:
    t = tree()
    put(t, (1, 2))
    node = t.match_prefix("a", (1, 2)).node
    with pytest.raises(ValueError, match="not locked"):
        t.unlock(node)


def test_evict_removes_least_recently_used_leaves_first() -> None:
    t = tree()
    put(t, (1, 1, 1))
    put(t, (2, 2, 2))
    put(t, (3, 3, 3))
    t.match_prefix("a", (1, 1, 1))  # touch: (2, 2, 2) is now the oldest
    ev = t.evict(t.free_bytes + 3 * BYTES_PER_TOKEN)
    assert [p.tokens for p in ev.payloads] == [(2, 2, 2)]
    ev = t.evict(t.free_bytes + 3 * BYTES_PER_TOKEN)
    assert [p.tokens for p in ev.payloads] == [(3, 3, 3)]
    assert keys(t) == {(1, 1, 1)}


def test_evict_takes_a_parent_once_its_children_are_gone() -> None:
    t = tree()
    put(t, (1, 2, 3))
    put(t, (1, 2, 4))
    put(t, (9,))
    ev = t.evict(t.max_kv_bytes)  # ask for everything
    assert ev.tokens == 5
    assert [p.tokens for p in ev.payloads][-1] in {(1, 2), (9,)}
    assert t.stats().total_bytes == 0
    assert t.roots() == {}  # idle namespaces cost nothing


def test_locked_leaves_are_never_evicted() -> None:
    t = tree()
    put(t, (1, 1))
    put(t, (2, 2))
    held = t.match_prefix("a", (1, 1))
    t.lock(held.node)
    ev = t.evict(t.max_kv_bytes)
    assert [p.tokens for p in ev.payloads] == [(2, 2)]
    assert keys(t) == {(1, 1)}
    t.unlock(held.node)


def test_insert_beyond_the_budget_raises_instead_of_exceeding_it() -> None:
    t = tree(max_tokens=4)
    root = t.match_prefix("a", ()).node
    t.lock(root)
    with pytest.raises(ValueError, match="max_kv_bytes"):
        t.insert(root, (1, 2, 3, 4, 5), TokenRun.of((1, 2, 3, 4, 5)))
    t.unlock(root)
    assert t.stats().total_bytes == 0


def test_insert_below_an_evicted_node_is_refused() -> None:
    t = tree()
    put(t, (1, 2))
    node: RadixNode[TokenRun] = t.match_prefix("a", (1, 2)).node
    t.evict(t.max_kv_bytes)
    with pytest.raises(ValueError, match="evicted"):
        t.insert(node, (3,), TokenRun.of((1, 2, 3), 2))


def test_split_of_a_locked_node_keeps_both_halves_locked() -> None:
    t = tree()
    put(t, (1, 2, 3, 4))
    held = t.match_prefix("a", (1, 2, 3, 4))
    t.lock(held.node)
    t.match_prefix("a", (1, 2, 9))  # splits the locked node
    head = next(n for n in t.nodes() if n.key == (1, 2))
    assert head.lock_count == 1
    assert t.stats().locked_bytes == 4 * BYTES_PER_TOKEN
    t.unlock(held.node)
    assert t.stats().locked_bytes == 0


def test_evict_never_walks_the_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    t = tree()
    for first in range(50):
        put(t, (first, 1, 2))
    t.match_prefix("a", (7, 1, 2))  # touch: (7, 1, 2) is now the newest

    def no_walk() -> None:
        raise AssertionError("evict walked the tree")

    monkeypatch.setattr(t, "nodes", no_walk)
    ev = t.evict(t.free_bytes + 49 * 3 * BYTES_PER_TOKEN)
    assert len(ev.payloads) == 49
    assert [p.tokens for p in ev.payloads][:2] == [(0, 1, 2), (1, 1, 2)]
    assert t.match_prefix("a", (7, 1, 2)).length == 3


def test_repeated_hits_on_a_leaf_keep_the_eviction_order_and_bound_the_heap() -> None:
    t = tree()
    put(t, (1, 1))
    put(t, (2, 2))
    put(t, (3, 3))
    for _ in range(1000):
        t.match_prefix("a", (1, 1))
        t.match_prefix("a", (2, 2))
    assert len(t._heap) <= 2 * len(t.evictable_leaves()) + 65
    ev = t.evict(t.max_kv_bytes)
    assert [p.tokens for p in ev.payloads] == [(3, 3), (1, 1), (2, 2)]


def test_the_evictable_set_follows_locks_inserts_and_evictions() -> None:
    t = tree()
    put(t, (1, 2, 3))
    leaf = t.match_prefix("a", (1, 2, 3)).node
    assert t.evictable_leaves() == {leaf}
    t.lock(leaf)
    assert t.evictable_leaves() == frozenset()
    t.unlock(leaf)
    put(t, (1, 2, 3, 4))  # the leaf gains a child and stops being one
    child = t.match_prefix("a", (1, 2, 3, 4)).node
    assert t.evictable_leaves() == {child}
    t.evict(t.free_bytes + BYTES_PER_TOKEN)
    assert t.evictable_leaves() == {leaf}  # its last child gone, the parent is a leaf again


def test_namespaces_matched_but_never_used_are_dropped() -> None:
    t = tree()
    for i in range(500):
        t.match_prefix(f"tenant-{i}", (1, 2))
    assert len(t.roots()) <= 65
    t.evict(0)
    assert t.roots() == {}
