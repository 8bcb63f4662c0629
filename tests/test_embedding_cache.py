"""EmbeddingCache: per-input entries, only missing inputs fetched, answers merged in order, the
model version and tags checked on read, TTLs, cache controls, and a failing store a miss."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from infercache import Cache, EmbeddingCache, Settings
from infercache.clock import ManualClock
from infercache.embeddings.embedding_request import apportion, parse_embedding_request
from infercache.errors import InvalidRequestError, NotCachedError, StoreError, UpstreamError
from infercache.stores.memory import MemoryStore
from tests.harness.flight_watch import FlightWatch


class Embedder:
    """Stands in for an embeddings upstream: counts calls and the inputs it was sent."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.sent: list[Any] = []

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.clock.advance(0.2)
        self.sent.append(body["input"])
        inputs = [body["input"]] if isinstance(body["input"], str) else body["input"]
        data = [
            {"object": "embedding", "index": i, "embedding": [float(len(str(t))), float(i)]}
            for i, t in enumerate(inputs)
        ]
        tokens = sum(len(t) for t in inputs)
        return {"data": data, "model": body["model"], "usage": {"prompt_tokens": tokens}}


@pytest.fixture
def cache(tmp_path: Path, clock: ManualClock) -> Cache:
    return Cache(Settings(data_dir=tmp_path, store_url="memory://", default_ttl_s=60), clock=clock)


@pytest.fixture
def embeddings(cache: Cache) -> EmbeddingCache:
    return EmbeddingCache.of(cache)


@pytest.fixture
def upstream(clock: ManualClock) -> Embedder:
    return Embedder(clock)


def body(inputs: Any, **fields: Any) -> dict[str, Any]:
    return {"model": "e", "input": inputs, **fields}


def test_only_new_inputs_go_upstream_once_each_and_the_answer_keeps_request_order(
    embeddings: EmbeddingCache, upstream: Embedder
) -> None:
    embeddings.create(body(["aa", "b"]), upstream)
    result = embeddings.create(body(["ccc", "aa", "ccc", "b"]), upstream)
    assert upstream.sent == [["aa", "b"], ["ccc"]]
    assert (result.hits, result.fetched, result.stored) == (2, 1, 1)
    data = result.response["data"]
    assert [d["index"] for d in data] == [0, 1, 2, 3]
    assert [d["embedding"][0] for d in data] == [3.0, 2.0, 3.0, 1.0]
    assert result.response["usage"] == {"prompt_tokens": 3 + 2 + 3 + 1, "total_tokens": 9}


def test_a_single_string_is_sent_as_a_single_string(
    embeddings: EmbeddingCache, upstream: Embedder
) -> None:
    embeddings.create(body("hello"), upstream)
    assert upstream.sent == ["hello"]
    assert embeddings.create(body("hello"), upstream).hits == 1
    assert len(upstream.sent) == 1


def test_hits_count_tokens_and_seconds_saved_under_the_embeddings_strategy(
    cache: Cache, embeddings: EmbeddingCache, upstream: Embedder
) -> None:
    embeddings.create(body(["aaaa", "b"]), upstream)  # 0.2 s shared 4:1
    embeddings.create(body(["aaaa"]), upstream)
    stats = cache.stats()["strategies"]["embeddings"]
    assert (stats["hits"], stats["misses"]) == (1, {"absent": 2})
    assert stats["prompt_tokens_saved"] == 4
    assert stats["upstream_s_saved"] == pytest.approx(0.16)


def test_a_model_swap_an_invalidated_tag_and_the_ttl_each_force_a_refetch(
    cache: Cache, clock: ManualClock, embeddings: EmbeddingCache, upstream: Embedder
) -> None:
    tagged = body(["x"], infercache={"tags": ["kb"]})
    embeddings.create(tagged, upstream)
    cache.invalidate(["kb"])
    assert embeddings.create(tagged, upstream).hits == 0
    cache.set_model_version("e", "v2")
    assert embeddings.create(tagged, upstream).hits == 0
    assert embeddings.create(tagged, upstream).hits == 1
    clock.advance(61)
    assert embeddings.create(tagged, upstream).hits == 0
    misses = cache.stats()["strategies"]["embeddings"]["misses"]
    assert misses == {"absent": 1, "invalidated_tag": 1, "stale_model_version": 1, "expired": 1}


def test_a_swap_during_the_upstream_call_leaves_its_answer_unreachable(
    cache: Cache, embeddings: EmbeddingCache, upstream: Embedder
) -> None:
    lookup = embeddings.begin(body(["x"]))
    cache.set_model_version("e", "v2")
    sent = lookup.upstream_body
    assert sent is not None
    embeddings.finish(lookup, upstream(sent), upstream_s=0.2)
    assert embeddings.begin(body(["x"])).hits == 0


def test_tenants_and_output_fields_scope_the_key(
    embeddings: EmbeddingCache, upstream: Embedder
) -> None:
    embeddings.create(body(["x"], infercache={"tenant": "a"}), upstream)
    assert embeddings.begin(body(["x"], infercache={"tenant": "b"})).hits == 0
    assert embeddings.begin(body(["x"], infercache={"tenant": "a"}, dimensions=8)).hits == 0
    assert embeddings.begin(body(["x"], infercache={"tenant": "a"}, user="u")).hits == 1
    explicit = body(["x"], infercache={"tenant": "a"}, encoding_format="float")
    assert embeddings.begin(explicit).hits == 1  # float is the default format


def test_token_arrays_are_inputs_too_and_never_collide_with_strings() -> None:
    strings = parse_embedding_request(body(["1"]))
    tokens = parse_embedding_request(body([[1]]))
    assert strings.keys != tokens.keys
    assert parse_embedding_request(body([1, 2, 3])).inputs == ((1, 2, 3),)


@pytest.mark.parametrize(
    "bad",
    [body([]), body(["a", 1]), body(None), {"input": "a"}, body("a", dimensions=0),
     body("a", encoding_format="hex"), body("a", infercache={"ttl_s": -1})],
)  # fmt: skip
def test_bad_bodies_are_invalid_requests(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError):
        parse_embedding_request(bad)


def test_cache_controls(embeddings: EmbeddingCache, upstream: Embedder) -> None:
    with pytest.raises(NotCachedError):
        embeddings.begin(body(["x"], infercache={"cache_control": "only-if-cached"}))
    embeddings.create(body(["x"], infercache={"cache_control": "no-store"}), upstream)
    assert embeddings.begin(body(["x"])).hits == 0
    embeddings.create(body(["x"]), upstream)
    refreshed = embeddings.create(body(["x"], infercache={"cache_control": "no-cache"}), upstream)
    assert (refreshed.hits, refreshed.stored) == (0, 1)
    assert len(upstream.sent) == 3


def test_a_malformed_upstream_answer_is_an_upstream_error_and_nothing_is_stored(
    embeddings: EmbeddingCache,
) -> None:
    with pytest.raises(UpstreamError):
        embeddings.create(body(["x", "y"]), lambda sent: {"data": [{"index": 0}]})
    assert embeddings.begin(body(["x"])).hits == 0


class FailingStore(MemoryStore):
    def get(self, key: str) -> Any:
        raise StoreError("disk on fire")


def test_a_failing_store_is_a_counted_miss_never_an_error(
    tmp_path: Path, clock: ManualClock, upstream: Embedder
) -> None:
    backend = FailingStore(max_bytes=1 << 20, clock=clock)
    cache = Cache(Settings(data_dir=tmp_path), backend=backend, clock=clock)
    result = EmbeddingCache.of(cache).create(body(["x"]), upstream)
    assert result.response["data"][0]["embedding"] == [1.0, 0.0]
    assert result.stored == 0
    stats = cache.stats()["strategies"]["embeddings"]
    assert stats["misses"] == {"store_error": 1}


def test_identical_batches_in_flight_make_one_upstream_call(
    cache: Cache, embeddings: EmbeddingCache, upstream: Embedder
) -> None:
    gate = threading.Event()

    def gated(sent: dict[str, Any]) -> dict[str, Any]:
        assert gate.wait(30)
        return upstream(sent)

    embeddings.create(body(["cached"]), upstream)
    results: list[Any] = []
    batches = [["new", "cached", "other"], ["cached", "new", "other", "new"]]  # same missing
    threads = [
        threading.Thread(target=lambda b=b: results.append(embeddings.create(body(b), gated)))
        for b in batches
    ]
    for t in threads:
        t.start()
    assert FlightWatch(embeddings.flights).flights(1, waiting=1)
    gate.set()
    for t in threads:
        t.join(30)
    assert upstream.sent == [["cached"], ["new", "other"]]
    by_hits = sorted(results, key=lambda r: len(r.response["data"]))
    assert [[d["embedding"][0] for d in r.response["data"]] for r in by_hits] == [
        [3.0, 6.0, 5.0],
        [6.0, 3.0, 5.0, 3.0],
    ]
    assert sorted(r.stored for r in results) == [0, 2]  # the leader stored both, once
    stats = cache.stats()["strategies"]["embeddings"]
    assert stats["counters"]["coalesced"] == 2


@pytest.mark.anyio
async def test_acreate_merges_like_create(embeddings: EmbeddingCache, upstream: Embedder) -> None:
    async def fetch(sent: dict[str, Any]) -> dict[str, Any]:
        return upstream(sent)

    await embeddings.acreate(body(["a"]), fetch)
    result = await embeddings.acreate(body(["b", "a"]), fetch)
    assert upstream.sent == [["a"], ["b"]]
    assert result.hits == 1


@pytest.mark.parametrize(
    ("total", "weights", "parts"),
    [(10, [1, 1], [5, 5]), (10, [1, 2, 2], [2, 4, 4]), (7, [1, 1, 1], [3, 2, 2]), (0, [3], [0]),
     (5, [0, 0], [3, 2])],
)  # fmt: skip
def test_apportion_splits_a_total_by_weight_and_sums_to_it(
    total: int, weights: list[int], parts: list[int]
) -> None:
    assert apportion(total, weights) == parts
    assert sum(parts) == total
