"""The one-server Redis store against real servers: the eviction-policy check at start (and on
first contact when the server was down), a restart that empties the server, and URLs."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from infercache.clock import ManualClock
from infercache.errors import ConfigError, StoreError
from infercache.stores import EPOCH_META, Entry, open_store
from infercache.stores.redis import RedisStore
from infercache.stores.redis_connect import parse_cluster_url
from tests.conftest import start_redis
from tests.harness.servers import free_port


def an_entry(clock: ManualClock) -> Entry:
    now = clock.now_s()
    return Entry(b"{}", "m", "1:v1", (), now, now + 60, 0.1, 1, 1)


def test_allkeys_eviction_is_refused_at_start_and_says_why(tmp_path: Path) -> None:
    with start_redis(tmp_path) as server:
        redis.Redis(port=server.port).config_set("maxmemory-policy", "allkeys-lru")
        with pytest.raises(ConfigError, match="allkeys-lru") as refused:
            open_store(server.url(), clock=ManualClock(), max_bytes=1)
        assert "brings invalidated entries back" in str(refused.value)


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-ttl", "noeviction"])
def test_policies_that_only_evict_entries_are_accepted(tmp_path: Path, policy: str) -> None:
    with start_redis(tmp_path) as server:
        redis.Redis(port=server.port).config_set("maxmemory-policy", policy)
        open_store(server.url(), clock=ManualClock(), max_bytes=1).close()


def test_a_server_down_at_start_is_checked_on_first_contact(tmp_path: Path) -> None:
    clock = ManualClock()
    port = free_port()
    store = RedisStore(f"redis://127.0.0.1:{port}/0", clock=clock)  # nothing listens yet
    with pytest.raises(StoreError):
        store.get("k")
    with start_redis(tmp_path, port=port) as server:
        redis.Redis(port=server.port).config_set("maxmemory-policy", "allkeys-lfu")
        with pytest.raises(StoreError, match="allkeys-lfu"):
            store.put("k", an_entry(clock))  # a counted miss, never an eviction-prone cache
        redis.Redis(port=server.port).config_set("maxmemory-policy", "volatile-lfu")
        store.put("k", an_entry(clock))
        assert store.get("k") == an_entry(clock)
    store.close()


def test_a_server_restarted_empty_shows_as_a_new_epoch(tmp_path: Path) -> None:
    clock = ManualClock()
    port = free_port()
    with start_redis(tmp_path, port=port):
        store = RedisStore(f"redis://127.0.0.1:{port}/0", clock=clock)
        before = store.epoch()
        store.put("k", an_entry(clock))
        store.incr_meta("tag:kb")
        assert store.get_with_meta("k", [EPOCH_META])[1] == {EPOCH_META: before}
    with start_redis(tmp_path, port=port):
        # Entries and meta went together: nothing invalidated can come back.
        assert store.get_with_meta("k", ["tag:kb", EPOCH_META]) == (None, {})
        after = store.epoch()
        assert after != before
        assert store.get_with_meta("k", [EPOCH_META])[1] == {EPOCH_META: after}
        store.close()


def test_cluster_urls_name_seeds_and_credentials() -> None:
    got = parse_cluster_url("rediss+cluster://u:p%40ss@h1:7000,[::1]:7001")
    assert got.nodes == (("h1", 7000), ("::1", 7001))
    assert (got.username, got.password, got.tls) == ("u", "p@ss", True)
    assert parse_cluster_url("redis+cluster://h:1/").nodes == (("h", 1),)
    with pytest.raises(ConfigError, match="no databases"):
        parse_cluster_url("redis+cluster://h:1/2")
    with pytest.raises(ConfigError, match="host:port"):
        parse_cluster_url("redis+cluster://:secret@h:1,h2")
    with pytest.raises(ConfigError) as bad:
        parse_cluster_url("redis+cluster://:secret@h:1,h2")
    assert "secret" not in str(bad.value)


def test_a_refusal_and_a_store_never_show_the_password(tmp_path: Path) -> None:
    with start_redis(tmp_path) as server:
        admin = redis.Redis(port=server.port)
        admin.config_set("maxmemory-policy", "allkeys-lru")
        admin.config_set("requirepass", "pl4nted-pw")
        url = f"redis://:pl4nted-pw@127.0.0.1:{server.port}/0"
        with pytest.raises(ConfigError) as refused:
            open_store(url, clock=ManualClock(), max_bytes=1)
        assert "pl4nted-pw" not in str(refused.value)
        assert ":***@" in str(refused.value)
        redis.Redis(port=server.port, password="pl4nted-pw").config_set(
            "maxmemory-policy", "noeviction"
        )
        store = open_store(url, clock=ManualClock(), max_bytes=1)
        assert "pl4nted-pw" not in repr(store)
        store.close()
