"""Semantic entries shared by replicas on one real redis-server (and a real 3-master Redis
Cluster): an entry stored through one replica is a candidate on the other through the feed, a
complaint retires it everywhere, a lagging replica never serves an invalidated or removed
entry, a new replica bootstraps from the store, a lost stretch of the feed rebuilds the index,
and closing stops the thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.semantic.records import record_key
from infercache.semantic.replica_sync import ReplicaSync, attach, tail_before_rebuild
from infercache.stores.feed import FeedEvent, FeedKind, open_feed
from tests.conftest import RedisClusterServers, RedisServer
from tests.harness.servers import free_port
from tests.harness.upstreams import CountingUpstream
from tests.semantic.test_layer import ORIGINAL, REPHRASED, ask, make_cache

Replica = tuple[Cache, ReplicaSync]
MakeReplica = Callable[[], Replica]
SYNC_THREAD = "infercache-replica-sync"
BLOCK_MS = 50  # each sync's blocking read: how long closing it may take


@pytest.fixture
def store_url(redis_server: RedisServer, redis_prefix: str) -> str:
    return f"{redis_server.url()}?prefix={redis_prefix}"


@pytest.fixture
def make_replica(tmp_path: Path, clock: ManualClock, store_url: str) -> Iterator[MakeReplica]:
    """A replica as `gateway/semantic_setup.py` assembles one on Redis: the feed's tail, the layer's
    start-up rebuild, then the sync attached (all replicas share the injected clock)."""
    made: list[Cache] = []

    def make() -> Replica:
        position = tail_before_rebuild(store_url)
        cache = make_cache(tmp_path / str(len(made)), clock, store_url=store_url)
        made.append(cache)
        assert cache.semantic is not None
        return cache, attach(cache.semantic, store_url, position, block_ms=BLOCK_MS)

    yield make
    for cache in made:
        assert cache.semantic is not None
        cache.semantic.close()
        cache.close()


def published(cache: Cache) -> str:
    assert cache.semantic is not None
    assert cache.semantic.published is not None
    return cache.semantic.published


def test_an_entry_stored_through_one_replica_is_a_semantic_hit_on_the_other(
    make_replica: MakeReplica, upstream: CountingUpstream
) -> None:
    (a, _), (b, b_sync) = make_replica(), make_replica()
    first = a.complete(ask(ORIGINAL), upstream)
    assert first.layer == Layer.MISS
    assert b_sync.caught_up(published(a), timeout_s=1.0)
    again = b.complete(ask(REPHRASED), upstream)
    assert again.layer == Layer.SEMANTIC
    assert again.response == first.response
    assert upstream.calls == 1
    assert b.stats()["strategies"]["semantic"]["counters"]["feed_applied"] == 1
    # a's own add came back to it through the feed too, and changed nothing there
    assert a.semantic is not None
    assert len(a.semantic.indexes) == 1


def test_a_complaint_on_one_replica_retires_the_entry_on_the_other(
    make_replica: MakeReplica, upstream: CountingUpstream
) -> None:
    (a, _), (b, b_sync) = make_replica(), make_replica()
    a.complete(ask(ORIGINAL), upstream)
    assert b_sync.caught_up(published(a), timeout_s=1.0)
    hit = b.complete(ask(REPHRASED), upstream)
    assert hit.layer == Layer.SEMANTIC
    assert hit.key is not None
    assert a.semantic is not None
    assert b.semantic is not None
    assert a.semantic.report_wrong(hit.key, score=hit.similarity or 0.0)
    assert b_sync.caught_up(published(a), timeout_s=1.0)
    assert b.semantic.indexes.item_of_key(hit.key) is None
    assert b.complete(ask(REPHRASED), upstream).layer == Layer.MISS


@pytest.mark.parametrize("change", ["model-swap", "tag-invalidated", "complaint"])
def test_a_lagging_replica_never_serves_an_invalidated_or_removed_entry(
    make_replica: MakeReplica, upstream: CountingUpstream, change: str
) -> None:
    (a, _), (b, b_sync) = make_replica(), make_replica()
    tagged = {"tags": ["kb"]}
    a.complete(ask(ORIGINAL, infercache=tagged), upstream)
    assert b_sync.caught_up(published(a), timeout_s=1.0)
    b_sync.close()  # b follows no more: it still holds the vector and learns nothing
    assert a.semantic is not None
    assert b.semantic is not None
    key = next(iter(b.semantic.indexes._vid_of_key))
    if change == "model-swap":
        a.set_model_version("test-model", "v2")
    elif change == "tag-invalidated":
        a.invalidate("kb")
    else:
        a.semantic.report_wrong(key, score=1.0)
    assert b.semantic.indexes.item_of_key(key) is not None  # lagging
    calls = upstream.calls
    assert b.complete(ask(REPHRASED, infercache=tagged), upstream).layer == Layer.MISS
    assert upstream.calls == calls + 1


def test_a_new_replica_bootstraps_from_the_store_with_one_scan(
    make_replica: MakeReplica, upstream: CountingUpstream
) -> None:
    a, _ = make_replica()
    questions = [ORIGINAL, "Where is my parcel?", "What are your opening hours?"]
    for question in questions:
        a.complete(ask(question), upstream)
    c, c_sync = make_replica()
    assert c.semantic is not None
    assert len(c.semantic.indexes) == 3
    assert (c.semantic.rebuilds, c_sync.follower.rebuilds) == (1, 0)  # resumed, no rescan
    assert c.complete(ask(REPHRASED), upstream).layer == Layer.SEMANTIC
    a.complete(ask("Can I pay by card?"), upstream)  # after the start: through the feed
    assert c_sync.caught_up(published(a), timeout_s=1.0)
    assert len(c.semantic.indexes) == 4


def test_a_lost_stretch_of_the_feed_rebuilds_the_index_from_the_store(
    make_replica: MakeReplica,
    upstream: CountingUpstream,
    redis_server: RedisServer,
    redis_prefix: str,
) -> None:
    (a, _), (b, b_sync) = make_replica(), make_replica()
    a.complete(ask(ORIGINAL), upstream)
    a.complete(ask("Where is my parcel?"), upstream)
    assert b_sync.caught_up(published(a), timeout_s=1.0)
    assert b.semantic is not None
    assert len(b.semantic.indexes) == 2
    gone = next(k for k, item in _items(b) if item == "Where is my parcel?")
    raw = redis.Redis.from_url(redis_server.url())
    try:  # the server loses the feed (emptied, say)
        stream = f"{redis_prefix}{{feed}}semantic"
        assert raw.delete(stream, f"{stream}:epoch") == 2
    finally:
        raw.close()
    a.backend.delete(record_key(gone))  # and an entry goes behind the feed's back
    a.backend.delete(gone)
    a.complete(ask("What are your opening hours?"), upstream)
    assert b_sync.caught_up(published(a), timeout_s=1.0)
    assert b_sync.follower.rebuilds == 1
    assert sorted(text for _, text in _items(b)) == [ORIGINAL, "What are your opening hours?"]


def _items(cache: Cache) -> list[tuple[str, str]]:
    assert cache.semantic is not None
    indexes = cache.semantic.indexes
    return [
        (key, item.text) for key in list(indexes._vid_of_key) if (item := indexes.item_of_key(key))
    ]


def test_applying_an_event_twice_or_for_a_removed_entry_is_harmless(
    make_replica: MakeReplica, upstream: CountingUpstream, store_url: str
) -> None:
    a, _ = make_replica()
    a.complete(ask(ORIGINAL), upstream)
    assert a.semantic is not None
    (key,) = list(a.semantic.indexes._vid_of_key)
    before = a.semantic.indexes.item_of_key(key)
    sync = ReplicaSync(a.semantic, open_feed(store_url))  # never started: applied by hand
    try:
        for _ in range(2):
            sync.apply(FeedEvent(FeedKind.ADD, key))
        assert len(a.semantic.indexes) == 1
        assert a.semantic.indexes._vid_of_key[key] is not None
        assert a.semantic.indexes.item_of_key(key) == before
        a.backend.delete(record_key(key))
        sync.apply(FeedEvent(FeedKind.ADD, key))  # its record is gone: it goes too
        assert len(a.semantic.indexes) == 0
        sync.apply(FeedEvent(FeedKind.REMOVE, key))
        assert len(a.semantic.indexes) == 0
    finally:
        sync.close()


def test_a_failed_publish_is_counted_and_the_entry_still_serves_locally(
    make_replica: MakeReplica, upstream: CountingUpstream
) -> None:
    a, _ = make_replica()
    assert a.semantic is not None
    assert a.semantic.feed is not None
    a.semantic.feed.close()
    a.semantic.feed = open_feed(f"redis://127.0.0.1:{free_port()}", max_block_ms=0)  # nobody
    try:
        a.complete(ask(ORIGINAL), upstream)
        assert a.complete(ask(REPHRASED), upstream).layer == Layer.SEMANTIC
        counters = a.stats()["strategies"]["semantic"]["counters"]
        assert counters["feed_errors"] == 1
        assert "feed_published" not in counters
    finally:
        a.semantic.feed.close()


def test_closing_the_layer_stops_its_sync_thread(
    tmp_path: Path, clock: ManualClock, store_url: str
) -> None:
    position = tail_before_rebuild(store_url)
    cache = make_cache(tmp_path, clock, store_url=store_url)
    assert cache.semantic is not None
    sync = attach(cache.semantic, store_url, position, block_ms=BLOCK_MS)
    assert any(t.name == SYNC_THREAD for t in threading.enumerate())
    cache.semantic.close()
    cache.close()
    assert not sync._thread.is_alive()
    assert not any(t.name == SYNC_THREAD for t in threading.enumerate())


def test_a_replica_whose_start_up_scan_failed_scans_the_store_from_its_sync_thread(
    make_replica: MakeReplica,
    upstream: CountingUpstream,
    tmp_path: Path,
    clock: ManualClock,
    store_url: str,
) -> None:
    a, _ = make_replica()
    a.complete(ask(ORIGINAL), upstream)
    position = tail_before_rebuild(store_url)
    late = make_cache(tmp_path / "late", clock, store_url=store_url)
    assert late.semantic is not None
    late.semantic.indexes = late.semantic._new_indexes()  # as if the store had been down
    late.semantic.rebuilds = 0  # (Cache.enable_semantic logs that and starts empty)
    sync = attach(late.semantic, store_url, position, block_ms=BLOCK_MS)
    try:
        a.complete(ask("Where is my parcel?"), upstream)
        assert sync.caught_up(published(a), timeout_s=1.0)
        assert sync.follower.rebuilds == 1  # the thread took the tail, then scanned
        assert len(late.semantic.indexes) == 2
        assert late.complete(ask(REPHRASED), upstream).layer == Layer.SEMANTIC
    finally:
        late.semantic.close()
        late.close()


def test_replicas_on_a_redis_cluster_share_semantic_entries(
    tmp_path: Path,
    clock: ManualClock,
    redis_cluster: RedisClusterServers,
    redis_prefix: str,
    upstream: CountingUpstream,
) -> None:
    url = f"{redis_cluster.url()}?prefix={redis_prefix}"
    replicas: list[tuple[Cache, ReplicaSync]] = []
    try:
        for name in ("a", "b"):
            position = tail_before_rebuild(url)
            cache = make_cache(tmp_path / name, clock, store_url=url)
            assert cache.semantic is not None
            replicas.append((cache, attach(cache.semantic, url, position, block_ms=BLOCK_MS)))
        (a, _), (b, b_sync) = replicas
        first = a.complete(ask(ORIGINAL), upstream)
        assert b_sync.caught_up(published(a), timeout_s=1.0)
        again = b.complete(ask(REPHRASED), upstream)
        assert again.layer == Layer.SEMANTIC
        assert again.response == first.response
    finally:
        for cache, _ in replicas:
            assert cache.semantic is not None
            cache.semantic.close()
            cache.close()
