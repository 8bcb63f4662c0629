"""Per-request metrics: the tenant and model labels stay bounded, counters only grow, and the
duration histogram splits hits from misses."""

from __future__ import annotations

import random

from prometheus_client.parser import text_string_to_metric_families

from infercache.gateway.traffic import OTHER, RequestMetrics, TopLabels
from infercache.metrics import Metrics


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(metrics.to_prometheus().decode())
        for s in fam.samples
    }


def test_the_first_n_values_get_their_own_label_and_the_rest_share_other() -> None:
    top = TopLabels(2)
    assert [top.label(v)[0] for v in ("a", "b", "c", "a", "c")] == ["a", "b", OTHER, "a", OTHER]


def test_a_value_with_more_than_twice_the_weakest_ones_requests_replaces_it() -> None:
    top = TopLabels(2)
    for v in ("a", "a", "a", "b"):
        top.label(v)
    assert top.label("c") == (OTHER, None)  # 1 request against b's 1
    assert top.label("c") == (OTHER, None)  # 2: not more than twice b's
    assert top.label("c") == ("c", "b")  # 3 > 2 * 1: c in, b out
    assert top.label("b") == (OTHER, None)


def test_memory_stays_bounded_and_counts_never_under_count() -> None:
    """Space-Saving's invariants: at most `8 n` values tracked, their counts summing to the
    requests seen, each at least the value's true count; a heavy value keeps its label."""
    top = TopLabels(3)
    rng = random.Random(4)
    true: dict[str, int] = {}
    for i in range(20_000):
        value = "heavy" if i % 3 == 0 else f"user-{rng.randrange(40 if i % 2 else 10**9)}"
        true[value] = true.get(value, 0) + 1
        top.label(value)
        assert len(top._counts) <= 24
    assert sum(top._counts.values()) == 20_000
    assert all(n >= true[v] for v, n in top._counts.items())
    assert top.label("heavy")[0] == "heavy"


def test_requests_are_counted_per_bounded_tenant_and_model_and_timed_by_layer() -> None:
    metrics = Metrics()
    traffic = RequestMetrics(top_tenants=1, top_models=5)
    metrics.export(traffic)
    usage = {"usage": {"prompt_tokens": 10, "completion_tokens": 2}}
    for tenant, layer, seconds in (
        ("a", "miss", 0.8),
        ("a", "exact-hit", 0.002),
        ("b", "miss", 1.5),
    ):
        traffic.record("chat", tenant, "m", 200, layer, usage, seconds)
    traffic.record("chat", "a", "m", 502, "miss", None, 0.01)
    got = samples(metrics)

    def req(layer: str, tenant: str) -> float:
        labels = (("endpoint", "chat"), ("layer", layer), ("model", "m"), ("tenant", tenant))
        return got.get(("infercache_requests_total", labels), 0.0)

    assert (req("miss", "a"), req("exact-hit", "a"), req("miss", OTHER), req("error", "a")) == (
        1,
        1,
        1,
        1,
    )
    assert got[("infercache_prompt_tokens_total", (("model", "m"), ("tenant", "a")))] == 20
    # a hit's prompt tokens were all served from the cache
    assert got[("infercache_cached_prompt_tokens_total", (("model", "m"), ("tenant", "a")))] == 10

    def bucket(layer: str, le: str) -> float:
        labels = (("endpoint", "chat"), ("layer", layer), ("le", le), ("model", "m"))
        return got[("infercache_request_duration_seconds_bucket", labels)]

    assert bucket("exact-hit", "0.0025") == 1
    assert bucket("miss", "0.5") == 0
    assert bucket("miss", "1.0") == 1
    assert bucket("miss", "2.5") == 2
    assert bucket("miss", "+Inf") == 2


def test_a_demoted_tenants_series_end_and_other_never_decreases() -> None:
    metrics = Metrics()
    traffic = RequestMetrics(top_tenants=1)
    metrics.export(traffic)
    last_other = 0.0
    for tenant in ["small"] * 2 + ["big"] * 10:
        traffic.record("chat", tenant, "m", 200, "miss", None, 0.01)
        got = samples(metrics)
        tenants = {
            dict(k[1])["tenant"]: v for k, v in got.items() if k[0] == "infercache_requests_total"
        }
        assert tenants.get(OTHER, 0.0) >= last_other
        last_other = tenants.get(OTHER, 0.0)
    assert set(tenants) == {"big", OTHER}  # small was demoted: its series ended
    assert tenants[OTHER] == 4  # big's requests before its promotion (its 5th: 5 > 2 * 2)
    assert tenants["big"] == 6
