from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from infercache.analyze.simulated_prefix_cache import SimulatedPrefixCache

prompts = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.lists(st.integers(0, 3), min_size=1, max_size=12)),
    max_size=40,
)


def lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@settings(max_examples=150, deadline=None)
@given(prompts)
def test_unbounded_reuse_is_the_longest_common_prefix_with_any_earlier_prompt(
    requests: list[tuple[str, list[int]]],
) -> None:
    accounting = SimulatedPrefixCache()
    earlier: list[tuple[str, tuple[int, ...]]] = []
    for t, (namespace, raw) in enumerate(requests):
        units = tuple(raw)
        reuse = accounting.observe(
            namespace, units, unit_tokens=1, prompt_tokens=len(units), now_s=float(t)
        )
        expected = max((lcp(units, u) for ns, u in earlier if ns == namespace), default=0)
        assert reuse.matched_tokens == expected
        assert reuse.reused_tokens == min(expected, len(units) - 1)  # the last token is recomputed
        assert (reuse.last_seen_s is None) == (expected == 0)
        earlier.append((namespace, units))


@settings(max_examples=100, deadline=None)
@given(prompts, st.integers(1, 30))
def test_a_bounded_cache_stays_in_budget_and_never_reuses_more_than_unbounded(
    requests: list[tuple[str, list[int]]], capacity: int
) -> None:
    bounded = SimulatedPrefixCache(capacity_tokens=capacity)
    unbounded = SimulatedPrefixCache()
    for t, (namespace, raw) in enumerate(requests):
        units = tuple(raw)
        kwargs = {"unit_tokens": 1, "prompt_tokens": len(units), "now_s": float(t)}
        small = bounded.observe(namespace, units, **kwargs)  # type: ignore[arg-type]
        big = unbounded.observe(namespace, units, **kwargs)  # type: ignore[arg-type]
        assert small.matched_tokens <= big.matched_tokens
        assert bounded.stats().cached_tokens <= capacity


def test_the_least_recently_used_prefix_is_evicted_first() -> None:
    cache = SimulatedPrefixCache(capacity_tokens=8)
    observe = cache.observe
    observe("", (1, 1, 1, 1), unit_tokens=1, prompt_tokens=4, now_s=0)
    observe("", (2, 2, 2, 2), unit_tokens=1, prompt_tokens=4, now_s=1)
    observe("", (1, 1, 1, 1), unit_tokens=1, prompt_tokens=4, now_s=2)  # 1s used again
    observe("", (3, 3, 3, 3), unit_tokens=1, prompt_tokens=4, now_s=3)  # evicts the 2s
    assert observe("", (1, 1, 1, 1), unit_tokens=1, prompt_tokens=4, now_s=4).matched_tokens == 4
    assert observe("", (2, 2, 2, 2), unit_tokens=1, prompt_tokens=4, now_s=5).matched_tokens == 0
    assert cache.evicted


def test_block_units_count_their_tokens_and_the_partial_last_block() -> None:
    cache = SimulatedPrefixCache()
    cache.observe("", (10, 11, 12), unit_tokens=512, prompt_tokens=1100, now_s=0)
    reuse = cache.observe("", (10, 11, 99), unit_tokens=512, prompt_tokens=1500, now_s=7)
    assert (reuse.matched_tokens, reuse.reused_tokens, reuse.last_seen_s) == (1024, 1024, 0)
    again = cache.observe("", (10, 11, 12), unit_tokens=512, prompt_tokens=1100, now_s=9)
    assert (again.matched_tokens, again.reused_tokens) == (1100, 1099)


def test_eviction_frees_exactly_what_the_insert_needs() -> None:
    # 100 prompts of 10 tokens fill 1,000; a 1-token prompt then evicts one leaf, not more:
    # the tree keeps its evictable leaves up to date, so no batch of extra room is taken.
    cache = SimulatedPrefixCache(capacity_tokens=1000)
    for i in range(100):
        units = tuple(range(10 * i + 1, 10 * i + 11))
        cache.observe("", units, unit_tokens=1, prompt_tokens=10, now_s=float(i))
    assert cache.stats().cached_tokens == 1000
    cache.observe("", (0,), unit_tokens=1, prompt_tokens=1, now_s=100.0)
    assert cache.stats().cached_tokens == 991
    assert cache.stats().evicted_tokens == 10
    first, second = tuple(range(1, 11)), tuple(range(11, 21))
    again = cache.observe("", second, unit_tokens=1, prompt_tokens=10, now_s=101)
    assert again.matched_tokens == 10
    gone = cache.observe("", first, unit_tokens=1, prompt_tokens=10, now_s=102)
    assert gone.matched_tokens == 0


def test_units_of_their_own_sizes_count_their_tokens() -> None:
    """Redacted logs: each prefix hash stands for its chunk's tokens."""
    cache = SimulatedPrefixCache()
    cache.observe("", (7, 8, 9), unit_tokens=(4, 1, 3), prompt_tokens=8, now_s=0)
    reuse = cache.observe("", (7, 8, 5), unit_tokens=(4, 1, 2), prompt_tokens=7, now_s=1)
    assert (reuse.matched_tokens, reuse.reused_tokens) == (5, 5)
    assert cache.stats().cached_tokens == 10  # 4 + 1 + 3, then the new 2-token chunk
    bounded = SimulatedPrefixCache(capacity_tokens=6)
    bounded.observe("", (1, 2, 3), unit_tokens=(3, 2, 4), prompt_tokens=9, now_s=0)
    assert bounded.stats().cached_tokens == 5  # only the head that fits: 3 + 2 of 9
