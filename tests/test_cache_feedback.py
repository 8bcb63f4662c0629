"""`Cache.report_wrong(response_id)`: a complaint retires the entry that served the answer, at
once, is charged to the layer that answered, and reaches only answers served to the reporting
tenant, recently (issue 11, build item 4)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.errors import ConfigError
from infercache.semantic.embedder import HashingEmbedder
from infercache.semantic.guards import default_guards
from infercache.semantic.layer import SemanticConfig
from infercache.settings import Settings
from tests.harness.upstreams import CountingUpstream
from tests.harness.vocabulary import chat

MakeCache = Callable[..., Cache]


@pytest.fixture(params=["memory", "sqlite"])
def make_cache(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> Iterator[MakeCache]:
    caches: list[Cache] = []

    def make(**overrides: Any) -> Cache:
        url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'c.db'}"
        cache = Cache(
            Settings(data_dir=tmp_path, store_url=url, default_ttl_s=600, **overrides),
            clock=clock,
        )
        caches.append(cache)
        return cache

    yield make
    for c in caches:
        c.close()


def counters(cache: Cache, strategy: str) -> dict[str, float]:
    out: dict[str, float] = cache.stats()["strategies"][strategy]["counters"]
    return out


def test_an_exact_hit_reported_wrong_is_retired_and_never_served_again(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    fetched = cache.complete(chat(), upstream)
    hit = cache.complete(chat(), upstream)
    assert hit.layer is Layer.EXACT
    assert hit.key is not None
    wrong_id = hit.response["id"]
    assert wrong_id == fetched.response["id"]  # a replay keeps the upstream's id

    assert cache.report_wrong(wrong_id) is True
    assert cache.backend.get(hit.key) is None  # retired at once
    assert counters(cache, "exact")["complaints"] == 1
    again = cache.complete(chat(), upstream)
    assert again.layer is Layer.MISS
    assert again.response["id"] != wrong_id
    assert upstream.calls == 2


def test_an_answer_fetched_upstream_can_be_reported_and_is_counted_apart(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    fetched = cache.complete(chat(), upstream)
    assert cache.report_wrong(fetched.response["id"]) is True
    assert counters(cache, "exact")["complaints_on_fetched"] == 1
    assert "complaints" not in counters(cache, "exact")
    assert cache.complete(chat(), upstream).layer is Layer.MISS


def test_unknown_ids_and_other_tenants_reports_change_nothing(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    acme = chat(infercache={"tenant": "acme"})
    served = cache.complete(acme, upstream)
    assert cache.report_wrong("chatcmpl-unknown", tenant="acme") is False
    assert cache.report_wrong(served.response["id"], tenant="globex") is False
    assert cache.report_wrong(served.response["id"]) is False  # the default tenant is "" only
    assert cache.complete(acme, upstream).layer is Layer.EXACT  # the entry stays
    assert "complaints_on_fetched" not in counters(cache, "exact")
    assert cache.report_wrong(served.response["id"], tenant="acme") is True


def test_a_repeated_report_is_accepted_and_counted_once(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    cache.complete(chat(), upstream)
    hit = cache.complete(chat(), upstream)
    assert cache.report_wrong(hit.response["id"]) is True
    assert cache.report_wrong(hit.response["id"]) is True
    assert counters(cache, "exact")["complaints"] == 1


def test_a_refreshed_entry_is_not_retired_by_a_report_on_the_answer_it_replaced(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache()
    old = cache.complete(chat(), upstream)
    refreshed = cache.complete(chat(infercache={"cache_control": "no-cache"}), upstream)
    assert refreshed.response["id"] != old.response["id"]
    assert cache.report_wrong(old.response["id"]) is True
    hit = cache.complete(chat(), upstream)
    assert (hit.layer, hit.response["id"]) == (Layer.EXACT, refreshed.response["id"])


def test_only_recent_answers_are_remembered_by_count_and_by_age(
    make_cache: MakeCache, upstream: CountingUpstream, clock: ManualClock
) -> None:
    cache = make_cache(feedback_max_answers=2, feedback_ttl_s=100)
    ids = [cache.complete(chat(f"question {i}"), upstream).response["id"] for i in range(3)]
    assert len(cache.served) == 2
    assert cache.report_wrong(ids[0]) is False  # the least recently served, dropped
    clock.advance(101)
    assert cache.report_wrong(ids[2]) is False  # served over 100 s ago
    assert cache.complete(chat("question 2"), upstream).layer is Layer.EXACT  # it stays


def test_expired_answers_leave_memory_as_new_ones_are_remembered(
    make_cache: MakeCache, upstream: CountingUpstream, clock: ManualClock
) -> None:
    cache = make_cache(feedback_max_answers=100, feedback_ttl_s=100)
    for i in range(3):
        cache.complete(chat(f"old question {i}"), upstream)
    clock.advance(101)
    fresh = [cache.complete(chat(f"new question {i}"), upstream) for i in range(3)]
    assert len(cache.served) == 3
    assert all(cache.report_wrong(c.response["id"]) for c in fresh)


def test_serving_an_answer_again_keeps_it_reportable(
    make_cache: MakeCache, upstream: CountingUpstream, clock: ManualClock
) -> None:
    cache = make_cache(feedback_ttl_s=100)
    cache.complete(chat(), upstream)
    clock.advance(60)
    hit = cache.complete(chat(), upstream)
    clock.advance(60)  # 120 s after the fetch, 60 s after the hit
    assert cache.report_wrong(hit.response["id"]) is True


@pytest.mark.parametrize(("report_at_s", "reportable"), [(101.4, True), (101.7, False)])
def test_a_hot_answer_is_refreshed_at_most_once_a_second(
    make_cache: MakeCache,
    upstream: CountingUpstream,
    clock: ManualClock,
    report_at_s: float,
    reportable: bool,
) -> None:
    """Repeats within a second of a refresh change nothing (they take no lock): the record
    lives `ttl_s` from its last refresh, here the hit at 1.5 s, not the one at 2.0 s."""
    cache = make_cache(feedback_ttl_s=100)
    answer_id = cache.complete(chat(), upstream).response["id"]
    clock.advance(1.5)
    cache.complete(chat(), upstream)  # refreshed: lives until 101.5
    clock.advance(0.5)
    cache.complete(chat(), upstream)  # 0.5 s after the refresh: unchanged
    clock.advance(report_at_s - 2.0)
    assert cache.report_wrong(answer_id) is reportable


def test_no_answer_is_remembered_when_feedback_is_off(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = make_cache(feedback_max_answers=0)
    served = cache.complete(chat(), upstream)
    assert cache.report_wrong(served.response["id"]) is False
    assert len(cache.served) == 0


def semantic_cache(make_cache: MakeCache, *, store_hits_as_exact: bool = False) -> Cache:
    cache = make_cache()
    cache.enable_semantic(
        HashingEmbedder(dim=512),
        config=SemanticConfig(threshold=0.75, store_hits_as_exact=store_hits_as_exact),
        guards=default_guards(),
    )
    return cache


@pytest.mark.parametrize("store_hits_as_exact", [False, True])
def test_a_semantic_hit_reported_wrong_feeds_the_layer_and_is_never_served_again(
    make_cache: MakeCache, upstream: CountingUpstream, store_hits_as_exact: bool
) -> None:
    cache = semantic_cache(make_cache, store_hits_as_exact=store_hits_as_exact)
    original = "hi, how do I reset my password"
    rephrased = "how do I reset my password please"
    fetched = cache.complete(chat(original), upstream)
    hit = cache.complete(chat(rephrased), upstream)
    assert hit.layer is Layer.SEMANTIC
    assert hit.response["id"] == fetched.response["id"]

    assert cache.report_wrong(hit.response["id"]) is True
    assert counters(cache, "semantic")["complaints"] == 1
    assert "complaints" not in counters(cache, "exact")
    assert hit.key is not None
    assert cache.backend.get(hit.key) is None
    assert cache.stats()["strategies"]["semantic"]["gauges"]["vectors"] == 0
    calls = upstream.calls
    again = cache.complete(chat(rephrased), upstream)
    assert again.layer is Layer.MISS
    assert upstream.calls == calls + 1
    for text in (rephrased, original, "how do I reset my password?"):
        assert cache.complete(chat(text), upstream).response["id"] != hit.response["id"]


def test_an_exact_complaint_also_drops_the_semantic_record_of_its_entry(
    make_cache: MakeCache, upstream: CountingUpstream
) -> None:
    cache = semantic_cache(make_cache)
    fetched = cache.complete(chat("hi, how do I reset my password"), upstream)
    hit = cache.complete(chat("hi, how do I reset my password"), upstream)
    assert hit.layer is Layer.EXACT
    assert cache.report_wrong(fetched.response["id"]) is True
    assert counters(cache, "exact")["complaints"] == 1
    assert "complaints" not in counters(cache, "semantic")  # no cache decision was wrong
    paraphrase = cache.complete(chat("how do I reset my password please"), upstream)
    assert paraphrase.layer is Layer.MISS  # no paraphrase is served the reported answer


def test_the_remembered_answers_are_sized_in_the_settings(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[cache]\nfeedback_max_answers = 7\nfeedback_ttl_s = 60\n")
    settings = Settings.load(environ={"INFERCACHE_FEEDBACK_TTL_S": "30"}, config_file=config)
    assert (settings.feedback_max_answers, settings.feedback_ttl_s) == (7, 30.0)
    with pytest.raises(ConfigError, match="feedback_ttl_s"):
        Settings.load(environ={"INFERCACHE_FEEDBACK_TTL_S": "0"})
