"""The semantic change feed on real servers (one Redis, a Redis Cluster, and Valkey): order,
blocking reads across clients, loss made visible, and the consumer contract end to end."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from infercache.clock import ManualClock
from infercache.errors import StoreError
from infercache.stores import Entry, open_store
from infercache.stores.feed import (
    START,
    FeedBatch,
    FeedEvent,
    FeedFollower,
    FeedKind,
    RedisFeed,
    lost_events,
    open_feed,
    reached,
)
from tests.conftest import RedisClusterServers, RedisServer
from tests.harness.servers import free_port

SERVERS = {
    "redis": "redis_server",
    "redis-cluster": "redis_cluster",
    "valkey": "valkey_server",
    "valkey-cluster": "valkey_cluster",
}
MakeFeed = Callable[..., RedisFeed]


@pytest.fixture(params=list(SERVERS))
def server_url(request: pytest.FixtureRequest) -> str:
    server: RedisServer | RedisClusterServers = request.getfixturevalue(SERVERS[request.param])
    return server.url()


@pytest.fixture
def make_feed(server_url: str, redis_prefix: str) -> Iterator[MakeFeed]:
    """Feeds on one stream: each stands for another replica's client."""
    made: list[RedisFeed] = []

    def make(**options: int) -> RedisFeed:
        feed = open_feed(f"{server_url}?prefix={redis_prefix}", **options)
        made.append(feed)
        return feed

    yield make
    for feed in made:
        feed.close()


def add(key: str) -> FeedEvent:
    return FeedEvent(FeedKind.ADD, key)


def keys_of(batch: FeedBatch) -> list[str]:
    return [e.key for _, e in batch.events]


def test_events_come_back_in_order_after_a_position(make_feed: MakeFeed) -> None:
    a, b = make_feed(), make_feed()
    assert b.tail() == START
    positions = [a.publish(add(f"sem:{i}")) for i in range(5)]
    a.publish(FeedEvent(FeedKind.REMOVE, "sem:1"))
    a.publish(FeedEvent(FeedKind.INVALIDATE, "tag:kb", b"\x00raw"))
    batch = b.read_after(START)
    assert not batch.gap
    assert keys_of(batch) == ["sem:0", "sem:1", "sem:2", "sem:3", "sem:4", "sem:1", "tag:kb"]
    assert [p for p, _ in batch.events][:5] == positions
    assert batch.events[-1][1] == FeedEvent(FeedKind.INVALIDATE, "tag:kb", b"\x00raw")
    assert batch.position == b.tail()
    assert keys_of(b.read_after(positions[2], count=2)) == ["sem:3", "sem:4"]
    assert b.read_after(batch.position) == FeedBatch((), batch.position, False)


def test_a_blocked_reader_wakes_on_another_clients_publish(make_feed: MakeFeed) -> None:
    a, b = make_feed(), make_feed()
    start = b.tail()
    got: list[FeedBatch] = []
    reader = threading.Thread(target=lambda: got.append(b.read_after(start, block_ms=5000)))
    reader.start()
    a.publish(add("sem:new"))
    reader.join(10)
    assert not reader.is_alive()
    assert keys_of(got[0]) == ["sem:new"]


def test_a_read_with_nothing_new_returns_at_its_deadline(make_feed: MakeFeed) -> None:
    feed = make_feed()
    feed.publish(add("sem:x"))
    tail = feed.tail()
    assert feed.read_after(tail, block_ms=20) == FeedBatch((), tail, False)


def test_a_reader_left_behind_by_trimming_is_told_of_the_gap(make_feed: MakeFeed) -> None:
    a, b = make_feed(max_len=10), make_feed()
    first = a.publish(add("sem:0"))
    for i in range(1, 1000):
        a.publish(add(f"sem:{i}"))
    batch = b.read_after(first)
    assert batch.gap
    assert batch.events == ()
    assert batch.position == b.tail()  # rebuild from the store, then read from here
    recent = b.read_after(batch.position)
    assert recent == FeedBatch((), batch.position, False)


def test_a_stream_lost_with_its_server_is_a_gap_not_silence(make_feed: MakeFeed) -> None:
    feed = make_feed()
    position = feed.publish(add("sem:0"))
    feed.client.delete(feed.stream_key, f"{feed.stream_key}:epoch")  # as a restart does
    assert feed.read_after(position).gap
    feed.publish(add("sem:after-restart"))
    batch = feed.read_after(position)
    assert batch.gap  # new ids may be below the old position: never trust it
    assert keys_of(feed.read_after(START)) == ["sem:after-restart"]


def test_gap_rule() -> None:
    assert not lost_events(START, None, None)
    assert not lost_events(START, "5-3", "5-0")
    assert lost_events(START, "5-3", "5-2")
    assert not lost_events("5-3", "5-9", "5-4")
    assert not lost_events("5-3", "5-9", "5-2")
    assert lost_events("5-3", "5-9", "5-5")
    assert lost_events("5-3", None, None)
    assert lost_events("5-3", "6-0", "6-0")
    assert lost_events("5-3", "5-2", "5-0")
    assert lost_events("5-3", "5-9", None)
    assert not lost_events("5-9", "5-9", None)


def test_reached_orders_positions_of_one_stream_life() -> None:
    assert not reached(None, "5-0")
    assert reached("5-3", "5-3")
    assert reached("5-10", "5-9")  # numerically, not as text
    assert not reached("5-9", "5-10")
    assert reached("6-0", "5-9")


def test_a_follower_resumed_from_a_tail_reads_only_what_came_after_it(
    make_feed: MakeFeed,
) -> None:
    a, b = make_feed(), make_feed()
    a.publish(add("sem:before"))
    applied: list[str] = []
    rebuilds: list[int] = []
    follower = FeedFollower(
        b, rebuild=lambda: rebuilds.append(1), apply=lambda e: applied.append(e.key)
    )
    follower.resume(b.tail())  # taken before a rebuild the caller made itself
    a.publish(add("sem:after"))
    assert follower.poll(block_ms=1000) == 1
    assert applied == ["sem:after"]
    assert (rebuilds, follower.rebuilds) == ([], 0)


def test_a_replica_following_the_contract_sees_every_record_once_stored(
    server_url: str, redis_prefix: str, make_feed: MakeFeed
) -> None:
    """Replica B bootstraps from the store, then follows A's feed (FeedFollower): it ends up
    with exactly the records A stored (and not the one A removed); a gap rebuilds."""
    clock = ManualClock()
    url = f"{server_url}?prefix={redis_prefix}"
    store_a = open_store(url, clock=clock, max_bytes=1)
    store_b = open_store(url, clock=clock, max_bytes=1)
    feed_a, feed_b = make_feed(max_len=10), make_feed()

    def put(key: str) -> None:
        now = clock.now_s()
        store_a.put(key, Entry(key.encode(), "m", "0:", (), now, now + 60, 0.0, 0, 0))
        feed_a.publish(add(key))

    index: set[str] = set()

    def rebuild() -> None:
        index.clear()
        index.update(k for k, _ in store_b.scan("sem:"))

    def apply(event: FeedEvent) -> None:
        if event.kind is FeedKind.ADD and store_b.get(event.key) is not None:
            index.add(event.key)  # the store is the truth: a record gone since is skipped
        elif event.kind is FeedKind.REMOVE:
            index.discard(event.key)

    for i in range(5):
        put(f"sem:early{i}")
    follower = FeedFollower(feed_b, rebuild=rebuild, apply=apply)
    follower.start()
    assert index == {f"sem:early{i}" for i in range(5)}
    put("sem:later")
    put("sem:gone")
    store_a.delete("sem:early0")
    feed_a.publish(FeedEvent(FeedKind.REMOVE, "sem:early0"))
    store_a.delete("sem:gone")  # deleted before B applies its ADD
    assert follower.poll(block_ms=1000) == 3
    assert index == {f"sem:early{i}" for i in range(1, 5)} | {"sem:later"}
    assert follower.poll() == 0
    for i in range(300):  # B falls behind more than the stream keeps
        put(f"sem:burst{i}")
    assert follower.poll() == 0
    assert follower.rebuilds == 2
    assert len(index) == 305
    put("sem:after-gap")
    assert follower.poll(block_ms=1000) == 1
    assert "sem:after-gap" in index
    store_a.close()
    store_b.close()


def test_feed_errors_are_store_errors(redis_prefix: str) -> None:
    feed = open_feed(f"redis://127.0.0.1:{free_port()}/0?prefix={redis_prefix}")
    with pytest.raises(StoreError):
        feed.publish(add("sem:x"))
    with pytest.raises(StoreError):
        feed.read_after(START)
    feed.close()
