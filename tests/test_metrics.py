"""Per-strategy metrics agree with a scripted sequence of requests."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.metrics import Metrics, MissReason, Price, PriceTable
from infercache.settings import Settings
from tests.harness.upstreams import CountingUpstream
from tests.harness.vocabulary import chat

PRICES = PriceTable(by_model={"test-model": Price(1.0, 2.0)})


def test_stats_follow_a_scripted_sequence(tmp_path: Path, clock: ManualClock) -> None:
    settings = Settings(data_dir=tmp_path, store_url="memory://", default_ttl_s=100, prices=PRICES)
    cache = Cache(settings, clock=clock)
    upstream = CountingUpstream(clock, latency_s=0.5, prompt_tokens=20, completion_tokens=8)
    cache.complete(chat("a"), upstream)  # miss: absent
    cache.complete(chat("a"), upstream)  # hit
    cache.complete(chat("a"), upstream)  # hit
    cache.complete(chat("b"), upstream)  # miss: absent
    cache.complete(chat("c", temperature=1.0), upstream)  # uncacheable
    cache.complete(chat("a", infercache={"cache_control": "no-cache"}), upstream)  # bypassed
    clock.advance(101)
    cache.complete(chat("b"), upstream)  # miss: expired
    s = cache.stats()["strategies"]["exact"]
    assert s["lookups"] == 7
    assert s["hits"] == 2
    assert s["misses"] == {"absent": 2, "bypassed": 1, "expired": 1, "uncacheable": 1}
    assert s["hit_rate"] == pytest.approx(2 / 7)
    assert s["prompt_tokens_saved"] == 40
    assert s["completion_tokens_saved"] == 16
    assert s["upstream_s_saved"] == pytest.approx(1.0)
    assert s["money_saved_usd"] == pytest.approx(2 * (20 * 1.0 + 8 * 2.0) / 1e6)
    assert s["prompt_tokens_seen"] == 20 * 7  # every answered request's prompt, hits too
    assert s["token_hit_rate"] == pytest.approx(40 / 140)
    assert s["lookup_overhead_s"] == 0.0  # the manual clock does not move during lookups
    assert s["net_s_saved"] == pytest.approx(1.0)

    prom = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for fam in text_string_to_metric_families(cache.metrics.to_prometheus().decode())
        for sample in fam.samples
    }
    assert prom[("infercache_hits_total", (("strategy", "exact"),))] == 2
    assert prom[("infercache_misses_total", (("reason", "absent"), ("strategy", "exact")))] == 2
    assert prom[("infercache_saved_upstream_seconds_total", (("strategy", "exact"),))] == 1.0
    assert prom[("infercache_lookup_prompt_tokens_total", (("strategy", "exact"),))] == 140
    assert '"hits": 2' in cache.metrics.to_json()


def test_lookup_overhead_is_measured_on_the_monotonic_clock() -> None:
    metrics = Metrics()
    s = metrics.strategy("exact")
    s.overhead(0.25)
    s.hit(prompt_tokens=1, completion_tokens=1, upstream_s=1.0, money_usd=0.0)
    assert metrics.snapshot()["strategies"]["exact"]["net_s_saved"] == pytest.approx(0.75)


def test_lookups_equal_hits_plus_misses_and_histograms_export() -> None:
    metrics = Metrics()
    s = metrics.strategy("semantic")
    s.miss(MissReason.BELOW_THRESHOLD)
    s.hit(prompt_tokens=0, completion_tokens=0, upstream_s=0.0, money_usd=0.0)
    for v in (0.1, 0.85, 0.95):
        s.observe("nn_similarity", v, [0.5, 0.9])
    snap = metrics.snapshot()["strategies"]["semantic"]
    assert snap["lookups"] == snap["hits"] + sum(snap["misses"].values())
    assert snap["histograms"]["nn_similarity"]["counts"] == [1, 1, 1]
    text = metrics.to_prometheus().decode()
    assert 'infercache_semantic_nearest_similarity_bucket{le="0.9",strategy="semantic"} 2.0' in text


def test_prefix_savings_use_the_cached_input_discount() -> None:
    table = PriceTable(by_model={"m": Price(2.0, 8.0, cached_input_usd_per_mtok=0.5)})
    assert table.prefix_savings_usd("m", 1_000_000) == pytest.approx(1.5)
    assert table.cost_usd("m", 1_000_000, 1_000_000) == pytest.approx(10.0)
    assert table.cost_usd("unknown", 10, 10) == 0.0
