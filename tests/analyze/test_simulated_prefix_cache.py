from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from infercache.analyze.simulated_prefix_cache import SimulatedPrefixCache, kv_namespace

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
    bounded = SimulatedPrefixCache(capacity_tokens=capacity, evict_batch_tokens=0)
    unbounded = SimulatedPrefixCache()
    for t, (namespace, raw) in enumerate(requests):
        units = tuple(raw)
        kwargs = {"unit_tokens": 1, "prompt_tokens": len(units), "now_s": float(t)}
        small = bounded.observe(namespace, units, **kwargs)  # type: ignore[arg-type]
        big = unbounded.observe(namespace, units, **kwargs)  # type: ignore[arg-type]
        assert small.matched_tokens <= big.matched_tokens
        assert bounded.stats().cached_tokens <= capacity


def test_the_least_recently_used_prefix_is_evicted_first() -> None:
    cache = SimulatedPrefixCache(capacity_tokens=8, evict_batch_tokens=0)
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


def test_kv_namespaces_separate_tenants_unless_sharing_is_on() -> None:
    assert kv_namespace("a", "m", share_across_tenants=False) != kv_namespace(
        "b", "m", share_across_tenants=False
    )
    assert kv_namespace("a", "m", share_across_tenants=True) == kv_namespace(
        "b", "m", share_across_tenants=True
    )
    assert kv_namespace("a", "m1", share_across_tenants=True) != kv_namespace(
        "a", "m2", share_across_tenants=True
    )
