"""The Redis Cluster store on a real 3-master cluster: one-slot lookups, invalidation seen at
once by every client, meta that survives nodes restarted empty, and the start-up checks."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.errors import ConfigError
from infercache.settings import Settings
from infercache.stores import EPOCH_META
from infercache.stores.redis_cluster import RedisClusterStore
from infercache.versions import meta_names
from tests.conftest import RedisClusterServers, start_redis_cluster
from tests.harness.upstreams import CountingUpstream
from tests.harness.vocabulary import chat

MakeStore = Callable[..., RedisClusterStore]
QUESTIONS = [f"question number {i}?" for i in range(40)]


@pytest.fixture
def make_store(
    redis_cluster: RedisClusterServers, redis_prefix: str, clock: ManualClock
) -> Iterator[MakeStore]:
    """Clients of one cluster under one prefix: each stands for another gateway process."""
    made: list[RedisClusterStore] = []

    def make(**options: Any) -> RedisClusterStore:
        store = RedisClusterStore(redis_cluster.url(), clock=clock, prefix=redis_prefix, **options)
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


def cache_on(store: RedisClusterStore, tmp_path: Path, clock: ManualClock) -> Cache:
    return Cache(Settings(data_dir=tmp_path), backend=store, clock=clock)


def node_of(store: RedisClusterStore, key: str) -> redis.Redis:
    node = store.nodes.node_of(key)
    return redis.Redis(host=node.host, port=node.port)


def lose_node_data(store: RedisClusterStore, key: str) -> int:
    """What a node restarted empty does to this store: every key under the prefix on the node
    holding `key` is gone. Returns how many were dropped."""
    client = node_of(store, key)
    keys = list(client.scan_iter(match=f"{store.prefix}*", count=1000))
    for k in keys:
        client.delete(k)
    client.close()
    return len(keys)


def bucket_copies(store: RedisClusterStore, names: list[str]) -> list[dict[str, str]]:
    return [store.meta.read(names, bucket=b) for b in range(store.meta.buckets)]


def test_an_entry_and_its_meta_share_a_slot_and_a_lookup_is_one_command(
    make_store: MakeStore, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store()
    for key in (f"k{i}" for i in range(200)):
        bucket = store.meta.bucket_of(key)
        assert bucket == zlib.crc32(key.encode()) % 64
        assert key_slot(store._entry_key(key).encode()) == key_slot(
            f"{store.prefix}{{b{bucket}}}m".encode()
        )
    used_slots = {key_slot(f"{store.prefix}{{b{b}}}".encode()) for b in range(64)}
    nodes = {store.nodes.node_of(f"{store.prefix}{{b{b}}}").port for b in range(64)}
    assert len(used_slots) == 64
    assert len(nodes) == 3  # the buckets spread over every master
    store.get_with_meta("k0", ["model:m"])  # loads the script on its node
    calls: list[tuple[Any, ...]] = []
    real = redis.Redis.execute_command

    def counting(self: redis.Redis, *args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "execute_command", counting)
    store.get_with_meta("k1", ["model:m", "tag:a", "tag:b"])
    assert [c[0] for c in calls] == ["EVALSHA"]


def test_a_model_swap_through_one_client_retires_every_entry_for_another(
    make_store: MakeStore, tmp_path: Path, clock: ManualClock, upstream: CountingUpstream
) -> None:
    store = make_store()
    a, b = cache_on(store, tmp_path, clock), cache_on(make_store(), tmp_path, clock)
    for q in QUESTIONS:
        assert a.complete(chat(q), upstream).layer is Layer.MISS
    assert len({store.meta.bucket_of(k) for k, _ in store.scan("")}) >= 20  # spread out
    assert [b.complete(chat(q), upstream).layer for q in QUESTIONS] == [Layer.EXACT] * 40

    assert a.set_model_version("test-model", "v2")
    assert [b.complete(chat(q), upstream).layer for q in QUESTIONS] == [Layer.MISS] * 40
    assert b.stats()["strategies"]["exact"]["misses"] == {"stale_model_version": 40}
    # What B stored under v2 is served to A, and a swap back to v1 does not resurrect v1.
    assert [a.complete(chat(q), upstream).layer for q in QUESTIONS] == [Layer.EXACT] * 40
    assert b.set_model_version("test-model", "v1")
    assert [a.complete(chat(q), upstream).layer for q in QUESTIONS[:5]] == [Layer.MISS] * 5


def test_a_tag_invalidation_through_one_client_retires_dependants_for_another(
    make_store: MakeStore, tmp_path: Path, clock: ManualClock, upstream: CountingUpstream
) -> None:
    a, b = cache_on(make_store(), tmp_path, clock), cache_on(make_store(), tmp_path, clock)
    tagged = [chat(q, infercache={"tags": ["kb:pricing"]}) for q in QUESTIONS[:20]]
    untagged = [chat(q) for q in QUESTIONS[20:]]
    for body in tagged + untagged:
        a.complete(body, upstream)
    assert a.invalidate(["kb:pricing"]) == 1
    assert [b.complete(body, upstream).layer for body in tagged] == [Layer.MISS] * 20
    assert [b.complete(body, upstream).layer for body in untagged] == [Layer.EXACT] * 20
    assert b.stats()["strategies"]["exact"]["misses"] == {"invalidated_tag": 20}


def test_after_a_write_returns_every_bucket_holds_it(make_store: MakeStore) -> None:
    a, b = make_store(), make_store()
    a.write_meta("model:m", "1:v1")
    assert a.incr_meta("tag:kb") == 1
    names = meta_names("m", ["kb"])
    assert bucket_copies(b, names) == [{"model:m": "1:v1", "tag:kb": "1"}] * 64
    assert b.read_meta(names) == {"model:m": "1:v1", "tag:kb": "1"}


def test_concurrent_invalidations_from_two_clients_are_distinct_and_converge(
    make_store: MakeStore,
) -> None:
    clients = [make_store(), make_store()]
    got: list[int] = []
    lock = threading.Lock()

    def bump(store: RedisClusterStore, version: int) -> None:
        for _ in range(5):
            value = store.incr_meta("tag:hot")
            with lock:
                got.append(value)
        store.write_meta("model:m", f"{version}:v{version}")

    threads = [
        threading.Thread(target=bump, args=(clients[i % 2], i)) for i in range(6)
    ]  # 30 increments, 6 racing version writes
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(got) == list(range(1, 31))  # atomic: no increment lost or repeated
    copies = bucket_copies(clients[0], ["tag:hot", "model:m"])
    assert all(c == copies[0] for c in copies)  # one value everywhere: the last sequence
    assert copies[0]["tag:hot"] == "30"


def test_a_node_restarted_empty_gets_the_meta_back_from_the_others(
    make_store: MakeStore,
) -> None:
    a = make_store()
    for _ in range(3):
        a.incr_meta("tag:kb")
    a.write_meta("model:m", "2:v2")
    epoch = a.epoch()
    home = f"{a.prefix}{{b0}}m"
    assert lose_node_data(a, home) > 0  # the node holding home (and ~1/3 of the buckets)
    b = make_store()
    names = meta_names("m", ["kb"])
    assert bucket_copies(b, names) == [{"model:m": "2:v2", "tag:kb": "3"}] * 64
    assert b.epoch() == epoch  # the meta was not lost: no new epoch
    assert b.incr_meta("tag:kb") == 4  # the counter did not restart below what was handed out
    assert a.get_with_meta("any", names)[1] == {"model:m": "2:v2", "tag:kb": "4"}


def test_a_lookup_on_a_node_that_lost_its_data_repairs_before_it_answers(
    make_store: MakeStore, clock: ManualClock
) -> None:
    a = make_store()
    a.incr_meta("tag:kb")
    key = next(
        k
        for k in (f"k{i}" for i in range(1000))
        if a.nodes.node_of(a._entry_key(k)).port != a.nodes.node_of(f"{a.prefix}{{b0}}m").port
    )
    lose_node_data(a, a._entry_key(key))
    assert a.get_with_meta(key, ["tag:kb", EPOCH_META]) == (
        None,
        {"tag:kb": "1", EPOCH_META: a.epoch()},
    )


def test_when_every_node_lost_its_data_the_epoch_changes(make_store: MakeStore) -> None:
    a = make_store()
    a.incr_meta("tag:kb")
    before = a.epoch()
    for b in range(64):
        lose_node_data(a, f"{a.prefix}{{b{b}}}")
    assert a.read_meta(["tag:kb"]) == {}
    assert a.epoch() != before
    assert a.incr_meta("tag:kb") == 1


def test_clients_with_another_bucket_count_are_refused(make_store: MakeStore) -> None:
    make_store()
    with pytest.raises(ConfigError, match="buckets=64"):
        make_store(buckets=16)


def test_a_prefix_with_braces_is_refused(redis_cluster: RedisClusterServers) -> None:
    with pytest.raises(ConfigError, match="braces"):
        RedisClusterStore(redis_cluster.url(), clock=ManualClock(), prefix="x{1}:")


def test_allkeys_eviction_on_any_primary_is_refused_at_start(
    redis_cluster: RedisClusterServers, redis_prefix: str
) -> None:
    node = redis.Redis(port=redis_cluster.ports[1])
    node.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with pytest.raises(ConfigError, match="allkeys-lru") as refused:
            RedisClusterStore(redis_cluster.url(), clock=ManualClock(), prefix=redis_prefix)
        assert "evict the invalidation counters" in str(refused.value)
    finally:
        node.config_set("maxmemory-policy", "volatile-lru")
        node.close()


def test_a_node_really_restarted_empty_loses_entries_not_invalidations(
    tmp_path: Path, clock: ManualClock, upstream: CountingUpstream
) -> None:
    """A real restart (own cluster: the process stops and starts again with no data and no
    script cache): the client follows, the meta comes back from the other nodes, and nothing
    invalidated before the restart is served after it."""
    with start_redis_cluster(tmp_path / "cluster") as cluster:
        store = RedisClusterStore(cluster.url(), clock=clock, prefix="r:")
        cache = cache_on(store, tmp_path, clock)
        tagged = [chat(q, infercache={"tags": ["kb"]}) for q in QUESTIONS]
        for body in tagged:
            cache.complete(body, upstream)
        cache.invalidate(["kb"])
        cache.set_model_version("test-model", "v7")
        for body in tagged:  # stored again, under the new generation and version
            assert cache.complete(body, upstream).layer is Layer.MISS
        epoch = store.epoch()
        home = store.nodes.node_of("r:{b0}m")
        cluster.restart_empty(home.port)
        layers = [cache.complete(body, upstream).layer for body in tagged]
        on_home = sum(layer is Layer.MISS for layer in layers)
        assert 0 < on_home < 40  # the restarted node's entries are gone, the others' served
        assert store.read_meta(["tag:kb", "model:test-model"]) == {
            "tag:kb": "1",
            "model:test-model": "1:v7",
        }
        assert store.epoch() == epoch
        assert [cache.complete(body, upstream).layer for body in tagged] == [Layer.EXACT] * 40
        store.close()
