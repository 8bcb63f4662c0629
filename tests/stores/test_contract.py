"""One contract suite, run against every store backend: memory, SQLite file, and real servers on
loopback — one Redis, a 3-master Redis Cluster, and the same two on Valkey."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infercache.clock import ManualClock
from infercache.stores import EPOCH_META, Backend, Entry, open_store
from infercache.stores.redis_cluster import RedisClusterStore
from tests.conftest import RedisClusterServers, RedisServer

MakeBackend = Callable[..., Backend]
SERVERS = {
    "redis": "redis_server",
    "redis-cluster": "redis_cluster",
    "valkey": "valkey_server",
    "valkey-cluster": "valkey_cluster",
}


def entry(clock: ManualClock, body: bytes = b'{"x":1}', *, ttl_s: float = 60.0) -> Entry:
    now = clock.now_s()
    return Entry(
        response=body,
        model="m",
        model_version="1:v1",
        tags=(("kb", 2),),
        created_at_s=now,
        expires_at_s=now + ttl_s,
        upstream_s=0.25,
        prompt_tokens=10,
        completion_tokens=5,
    )


def pttl_ms(store: Backend, key: str) -> int:
    """The remaining expiry Redis holds for an entry (one server, or the node of a cluster)."""
    redis_key = store._entry_key(key)  # type: ignore[attr-defined]
    if isinstance(store, RedisClusterStore):
        return int(store.nodes.call(redis_key, lambda node: node.pttl(redis_key)))
    return int(store._client.pttl(redis_key))  # type: ignore[attr-defined]


@pytest.fixture(params=["memory", "sqlite", *SERVERS])
def make_backend(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> Iterator[MakeBackend]:
    made: list[Backend] = []

    def make(max_bytes: int = 1 << 20) -> Backend:
        if request.param == "memory":
            url = "memory://"
        elif request.param == "sqlite":
            url = f"sqlite:///{tmp_path / f'c{len(made)}.db'}"
        else:
            server: RedisServer | RedisClusterServers
            server = request.getfixturevalue(SERVERS[request.param])
            prefix = request.getfixturevalue("redis_prefix")
            url = f"{server.url()}?prefix={prefix}"
        backend = open_store(url, clock=clock, max_bytes=max_bytes)
        made.append(backend)
        return backend

    # Every server kind behaves as "redis" where the contract differs by backend.
    make.kind = "redis" if request.param in SERVERS else request.param  # type: ignore[attr-defined]
    yield make
    for b in made:
        b.close()


def test_get_returns_what_put_stored(make_backend: MakeBackend, clock: ManualClock) -> None:
    store = make_backend()
    e = entry(clock)
    store.put("k", e)
    assert store.get("k") == e
    assert store.get("other") is None


def test_put_overwrites_and_delete_removes(make_backend: MakeBackend, clock: ManualClock) -> None:
    store = make_backend()
    store.put("k", entry(clock, b"1"))
    store.put("k", entry(clock, b"2"))
    got = store.get("k")
    assert got is not None
    assert got.response == b"2"
    assert store.stats().entries == 1
    store.delete("k")
    assert store.get("k") is None
    store.delete("k")  # deleting what is absent is fine


def test_purge_drops_entries_but_keeps_meta(make_backend: MakeBackend, clock: ManualClock) -> None:
    store = make_backend()
    for i in range(5):
        store.put(f"k{i}", entry(clock))
    store.write_meta("model:m", "3:v3")
    assert store.purge() == 5
    assert store.get("k0") is None
    assert store.stats().entries == 0
    assert store.read_meta(["model:m"]) == {"model:m": "3:v3"}


def test_meta_reads_writes_and_increments(make_backend: MakeBackend) -> None:
    store = make_backend()
    assert store.read_meta(["a", "b"]) == {}
    store.write_meta("a", "x")
    assert store.read_meta(["a", "b"]) == {"a": "x"}
    assert [store.incr_meta("n") for _ in range(3)] == [1, 2, 3]
    assert store.read_meta(["n"]) == {"n": "3"}


def test_expired_entry_is_returned_for_the_cache_to_judge(
    make_backend: MakeBackend, clock: ManualClock
) -> None:
    store = make_backend()
    store.put("k", entry(clock, ttl_s=10))
    if make_backend.kind == "redis":  # type: ignore[attr-defined]
        # Redis expires by itself after the remaining TTL: check it was handed over, in ms.
        ttl_ms = pttl_ms(store, "k")
        assert 9_000 < ttl_ms <= 10_000
        return
    clock.advance(11)
    got = store.get("k")
    assert got is not None
    assert got.expires_at_s < clock.now_s()


def test_byte_bound_is_never_exceeded_and_lru_goes_first(
    make_backend: MakeBackend, clock: ManualClock
) -> None:
    if make_backend.kind == "redis":  # type: ignore[attr-defined]
        pytest.skip("Redis is bounded by the server's maxmemory, not by the client")
    body = b"x" * 1000
    size = entry(clock, body).size_bytes
    store = make_backend(max_bytes=size * 5)
    step_s = 100  # recency is kept at a granularity of up to a minute (SQLite)
    for i in range(5):
        store.put(f"k{i}", entry(clock, body, ttl_s=1e6))
        clock.advance(step_s)
    store.get("k0")  # k0 is now the most recently used; k1 the least
    clock.advance(step_s)
    for i in range(5, 8):
        store.put(f"k{i}", entry(clock, body, ttl_s=1e6))
        clock.advance(step_s)
        assert store.stats().bytes <= size * 5
    present = {f"k{i}" for i in range(8) if store.get(f"k{i}") is not None}
    assert present == {"k0", "k4", "k5", "k6", "k7"}


def test_expired_entries_are_evicted_before_recent_ones(
    make_backend: MakeBackend, clock: ManualClock
) -> None:
    if make_backend.kind == "redis":  # type: ignore[attr-defined]
        pytest.skip("Redis drops expired keys itself")
    body = b"y" * 1000
    size = entry(clock, body).size_bytes
    store = make_backend(max_bytes=size * 3)
    store.put("old-but-long", entry(clock, body, ttl_s=1000))
    store.put("short", entry(clock, body, ttl_s=5))
    store.put("fresh", entry(clock, body, ttl_s=1000))
    store.get("old-but-long")
    clock.advance(10)  # "short" has expired; by recency it is not the oldest
    store.put("new", entry(clock, body, ttl_s=1000))
    assert store.get("short") is None
    assert store.get("old-but-long") is not None
    assert store.get("fresh") is not None


def test_an_entry_larger_than_the_bound_is_not_stored(
    make_backend: MakeBackend, clock: ManualClock
) -> None:
    if make_backend.kind == "redis":  # type: ignore[attr-defined]
        pytest.skip("Redis is bounded by the server's maxmemory")
    store = make_backend(max_bytes=2000)
    store.put("small", entry(clock, b"s"))
    store.put("huge", entry(clock, b"h" * 5000))
    assert store.get("huge") is None
    assert store.get("small") is not None


def test_scan_finds_exactly_the_entries_under_a_prefix(
    make_backend: MakeBackend, clock: ManualClock
) -> None:
    store = make_backend()
    for key in ("sem:a", "sem:b", "sem:c", "ic1:a", "se"):
        store.put(key, entry(clock, key.encode()))
    found = {k: e.response for k, e in store.scan("sem:")}
    assert found == {"sem:a": b"sem:a", "sem:b": b"sem:b", "sem:c": b"sem:c"}
    assert list(store.scan("nothing:")) == []


def test_get_with_meta_reads_both_in_one_call(
    make_backend: MakeBackend, clock: ManualClock
) -> None:
    store = make_backend()
    store.write_meta("model:m", "2:v2")
    store.incr_meta("tag:kb")
    assert store.get_with_meta("absent", ["model:m", "tag:kb", "tag:none"]) == (
        None,
        {"model:m": "2:v2", "tag:kb": "1"},
    )
    e = entry(clock)
    store.put("k", e)
    assert store.get_with_meta("k", []) == (e, {})
    assert store.get_with_meta("k", ["model:m"]) == (e, {"model:m": "2:v2"})


def test_epoch_is_stable_and_readable_with_a_lookup(make_backend: MakeBackend) -> None:
    store = make_backend()
    token = store.epoch()
    assert token
    assert store.epoch() == token
    assert store.read_meta([EPOCH_META]) == {EPOCH_META: token}
    assert store.get_with_meta("absent", [EPOCH_META]) == (None, {EPOCH_META: token})
    store.purge()  # entries go, meta (and so the epoch) stays
    assert store.epoch() == token
