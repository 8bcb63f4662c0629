"""The exact layer end to end through `Cache.complete` (acceptance items 2–5, 8)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.errors import NotCachedError, UpstreamError
from infercache.settings import Settings
from tests.harness.upstreams import CountingUpstream
from tests.harness.vocabulary import chat

MakeCache = Callable[..., Cache]


@pytest.fixture(params=["memory", "sqlite", "redis"])
def make_cache(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> Iterator[MakeCache]:
    caches: list[Cache] = []

    def make(**overrides: Any) -> Cache:
        if request.param == "memory":
            url = "memory://"
        elif request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'cache.db'}"
        else:
            server = request.getfixturevalue("redis_server")
            url = f"{server.url()}?prefix={request.getfixturevalue('redis_prefix')}"
        settings = Settings(data_dir=tmp_path, store_url=url, default_ttl_s=60, **overrides)
        cache = Cache(settings, clock=clock)
        caches.append(cache)
        return cache

    yield make
    for c in caches:
        c.close()


def test_identical_requests_hit(make_cache: MakeCache, upstream: CountingUpstream) -> None:
    cache = make_cache()
    first = cache.complete(chat(), upstream)
    second = cache.complete(chat(), upstream)
    assert (first.layer, second.layer) == (Layer.MISS, Layer.EXACT)
    assert second.response == first.response
    assert upstream.calls == 1


def test_changing_model_tenant_context_or_params_misses(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    cache.complete(chat(infercache={"tenant": "a", "context": "v1"}), upstream)
    variants = [
        chat(infercache={"tenant": "b", "context": "v1"}),
        chat(infercache={"tenant": "a", "context": "v2"}),
        chat(infercache={"tenant": "a", "context": "v1"}, model="other"),
        chat(infercache={"tenant": "a", "context": "v1"}, max_tokens=5),
        chat("What is the capital of Spain?", infercache={"tenant": "a", "context": "v1"}),
    ]
    layers = [cache.complete(v, upstream).layer for v in variants]
    assert layers == [Layer.MISS] * len(variants)


def test_a_tenant_never_reads_another_tenants_entry(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    a = cache.complete(chat(infercache={"tenant": "a"}), upstream)
    b = cache.complete(chat(infercache={"tenant": "b"}), upstream)
    assert b.layer == Layer.MISS
    assert a.response["id"] != b.response["id"]
    assert cache.complete(chat(infercache={"tenant": "b"}), upstream).response == b.response


def test_model_version_swap_makes_every_old_entry_unreachable(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    upstream.latency_s = 0  # 1000 calls must not outlive the TTL
    cache.set_model_version("test-model", "v1")
    requests = [chat(f"question {i}") for i in range(1000)]
    for r in requests:
        cache.complete(r, upstream)
    assert cache.complete(requests[0], upstream).layer == Layer.EXACT
    assert cache.set_model_version("test-model", "v2") is True
    calls = upstream.calls
    layers = [cache.complete(r, upstream).layer for r in requests]
    assert layers.count(Layer.EXACT) == 0
    assert upstream.calls == calls + 1000
    # New entries are stored and hit under the new version.
    assert all(cache.complete(r, upstream).layer == Layer.EXACT for r in requests[:50])
    misses = cache.stats()["strategies"]["exact"]["misses"]
    assert misses["stale_model_version"] == 1000


def test_swapping_back_to_an_old_version_does_not_resurrect_its_entries(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    cache.set_model_version("test-model", "A")
    cache.complete(chat(), upstream)
    cache.set_model_version("test-model", "B")
    cache.set_model_version("test-model", "A")
    assert cache.complete(chat(), upstream).layer == Layer.MISS
    assert cache.model_version("test-model") == "A"
    assert cache.set_model_version("test-model", "A") is False


def test_an_answer_generated_across_a_swap_is_never_served(
    make_cache: MakeCache, clock: ManualClock
) -> None:
    cache = make_cache()
    cache.set_model_version("test-model", "v1")
    inner = CountingUpstream(clock)

    def swapping_upstream(body: dict[str, Any]) -> dict[str, Any]:
        cache.set_model_version("test-model", "v2")  # the swap lands mid-generation
        return inner(body)

    cache.complete(chat(), swapping_upstream)
    assert cache.complete(chat(), inner).layer == Layer.MISS


def test_tag_invalidation_hides_dependents_and_nothing_else(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    dependent = [chat(f"pricing {i}", infercache={"tags": ["kb:pricing"]}) for i in range(20)]
    mixed = [chat(f"mixed {i}", infercache={"tags": ["kb:faq", "kb:pricing"]}) for i in range(5)]
    others = [chat(f"faq {i}", infercache={"tags": ["kb:faq"]}) for i in range(20)]
    untagged = [chat(f"plain {i}") for i in range(20)]
    for r in dependent + mixed + others + untagged:
        cache.complete(r, upstream)
    assert cache.invalidate(["kb:pricing"]) == 1
    assert [cache.complete(r, upstream).layer for r in dependent + mixed].count(Layer.EXACT) == 0
    assert all(cache.complete(r, upstream).layer == Layer.EXACT for r in others + untagged)
    snap = cache.stats()["strategies"]["exact"]
    assert snap["misses"]["invalidated_tag"] == 25
    assert snap["counters"]["invalidated_tags"] == 1


def test_entries_expire_on_the_injected_clock(
    make_cache: MakeCache, upstream: CountingUpstream, clock: ManualClock
) -> None:
    cache = make_cache()
    cache.complete(chat(), upstream)
    clock.advance(59)
    hit = cache.complete(chat(), upstream)
    assert hit.layer == Layer.EXACT
    assert hit.age_s == pytest.approx(59.0)
    clock.advance(2)
    assert cache.complete(chat(), upstream).layer == Layer.MISS


def test_per_request_ttl_overrides_the_default_within_the_cap(
    make_cache: MakeCache, upstream: CountingUpstream, clock: ManualClock
) -> None:
    cache = make_cache(max_ttl_s=120)
    short = chat("short", infercache={"ttl_s": 5})
    long = chat("long", infercache={"ttl_s": 10_000})  # capped to 120
    cache.complete(short, upstream)
    cache.complete(long, upstream)
    clock.advance(6)
    assert cache.complete(short, upstream).layer == Layer.MISS
    assert cache.complete(long, upstream).layer == Layer.EXACT
    clock.advance(115)
    assert cache.complete(long, upstream).layer == Layer.MISS


def test_no_cache_skips_the_lookup_and_refreshes(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    first = cache.complete(chat(), upstream)
    fresh = cache.complete(chat(infercache={"cache_control": "no-cache"}), upstream)
    assert fresh.layer == Layer.BYPASS
    assert fresh.response["id"] != first.response["id"]
    again = cache.complete(chat(), upstream)
    assert again.layer == Layer.EXACT
    assert again.response["id"] == fresh.response["id"]


def test_no_store_answers_but_does_not_store(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    cache.complete(chat(infercache={"cache_control": "no-store"}), upstream)
    assert cache.complete(chat(), upstream).layer == Layer.MISS


def test_only_if_cached_serves_hits_and_refuses_misses(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    with pytest.raises(NotCachedError):
        cache.complete(chat(infercache={"cache_control": "only-if-cached"}), upstream)
    assert upstream.calls == 0
    cache.complete(chat(), upstream)
    hit = cache.complete(chat(infercache={"cache_control": "only-if-cached"}), upstream)
    assert hit.layer == Layer.EXACT
    assert upstream.calls == 1


def test_partial_and_filtered_answers_are_not_stored(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    for reason in (None, "content_filter"):
        upstream.finish_reason = reason
        assert cache.complete(chat(f"q {reason}"), upstream).layer == Layer.MISS
        assert cache.complete(chat(f"q {reason}"), upstream).layer == Layer.MISS


def test_upstream_errors_propagate_and_are_not_stored(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()

    def failing(body: dict[str, Any]) -> dict[str, Any]:
        raise UpstreamError("rate limited", status_code=429)

    with pytest.raises(UpstreamError):
        cache.complete(chat(), failing)
    assert cache.complete(chat(), upstream).layer == Layer.MISS


def test_temperature_policy_holds(make_cache: MakeCache, upstream: CountingUpstream) -> None:
    cache = make_cache()
    sampled = chat(temperature=0.8)
    assert cache.complete(sampled, upstream).layer == Layer.UNCACHEABLE
    assert cache.complete(sampled, upstream).layer == Layer.UNCACHEABLE
    seeded = chat(temperature=0.8, seed=3)
    cache.complete(seeded, upstream)
    assert cache.complete(seeded, upstream).layer == Layer.EXACT
    opted_in = make_cache(cache_sampled=True)
    opted_in.complete(chat("other", temperature=0.8), upstream)
    assert opted_in.complete(chat("other", temperature=0.8), upstream).layer == Layer.EXACT


def test_the_upstream_never_sees_the_directives(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    body = chat(infercache={"tenant": "t", "tags": ["x"]})
    original = copy.deepcopy(body)
    cache.complete(body, upstream)
    assert "infercache" not in upstream.bodies[0]
    assert body == original


@pytest.mark.anyio
async def test_acomplete_hits_and_misses_like_complete(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    first = await cache.acomplete(chat(), upstream.acall)
    second = await cache.acomplete(chat(), upstream.acall)
    assert (first.layer, second.layer) == (Layer.MISS, Layer.EXACT)
    assert upstream.calls == 1
