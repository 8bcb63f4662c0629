"""The shared KV tier (engine/kv_shared.py) on a real redis-server: replicas load what another
computed, within a byte budget and a TTL, and a fault or a stopped server costs only
recomputation. Fake KV as in test_kv_tiers.py; each test its own key prefix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import RedisServer, start_redis
from tests.engine.kv_fakes import BLOCK, Replica

PROMPT = tuple(range(300, 350))  # 6 whole blocks of 8 before the last token
TTL_MS = 3600 * 1000


@pytest.fixture
def replicas(
    tmp_path: Path, redis_server: RedisServer, redis_prefix: str
) -> Iterator[tuple[Replica, Replica]]:
    """Two replicas sharing one Redis, each with its own RAM and no disk tier."""
    a, b = (
        Replica(tmp_path / name, disk_bytes=0, shared_url=redis_server.url(), prefix=redis_prefix)
        for name in ("a", "b")
    )
    yield a, b
    a.close()
    b.close()


def client(server: RedisServer) -> redis.Redis:
    return redis.Redis.from_url(server.url())


def test_a_prefix_computed_on_one_replica_is_loaded_by_another(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    assert a.ask(PROMPT).reused_tokens == 0
    assert a.counters()["kv_blocks_written:shared"] == 6
    lease = b.ask(PROMPT)  # checks every loaded position against the prefix's KV
    assert lease.tiers is not None
    assert (lease.tiers.shared_tokens, lease.reused_tokens) == (48, 48)
    assert b.ask(PROMPT).ram_tokens == 49  # inserted into B's tree at admission
    assert "kv_blocks_written:shared" not in b.counters()  # present already: not sent again


def test_blocks_carry_the_ttl_and_a_load_refreshes_it(
    replicas: tuple[Replica, Replica], redis_server: RedisServer, redis_prefix: str
) -> None:
    a, b = replicas
    a.ask(PROMPT)
    r = client(redis_server)
    keys = sorted(r.scan_iter(match=f"{redis_prefix}b:*"))
    assert len(keys) == 6
    for key in keys:
        assert TTL_MS - 60_000 < r.pttl(key) <= TTL_MS
        r.pexpire(key, 5_000)  # as if unused for almost an hour
    b.ask(PROMPT)
    assert all(TTL_MS - 60_000 < r.pttl(key) <= TTL_MS for key in keys)


def test_the_shared_tier_keeps_within_its_byte_budget(
    tmp_path: Path, redis_server: RedisServer, redis_prefix: str
) -> None:
    budget = 10 * 1120  # ten blocks 0
    replica = Replica(
        tmp_path,
        disk_bytes=0,
        shared_url=redis_server.url(),
        shared_bytes=budget,
        prefix=redis_prefix,
    )
    for i in range(60):
        replica.ask((i, *range(2000 + i, 2008 + i)))  # 9 tokens: one whole block each
    r = client(redis_server)
    sizes = {k: int(v) for k, v in r.hgetall(f"{redis_prefix}sizes").items()}
    stored = [r.strlen(key) for key in r.scan_iter(match=f"{redis_prefix}b:*")]
    assert int(r.get(f"{redis_prefix}bytes") or 0) == sum(sizes.values()) == sum(stored)
    assert sum(stored) <= budget
    assert len(stored) == 10
    assert replica.counters()["kv_blocks_evicted:shared"] == 50
    # The most recent are kept: a fresh replica loads the last prompt's block.
    fresh = replica.restart()
    assert fresh.ask((59, *range(2059, 2067))).reused_tokens == BLOCK


def test_a_corrupt_shared_block_is_rejected_counted_and_replaced(
    replicas: tuple[Replica, Replica], redis_server: RedisServer, redis_prefix: str
) -> None:
    a, b = replicas
    a.ask(PROMPT)
    assert a.tiers is not None
    name = a.tiers.names.blocks("ns", PROMPT, 3).name(2)
    r = client(redis_server)
    key = f"{redis_prefix}b:{name}"
    value = bytearray(r.get(key) or b"")
    value[-3] ^= 0x01
    r.set(key, bytes(value), px=TTL_MS)
    lease = b.ask(PROMPT)
    assert lease.reused_tokens == 2 * BLOCK
    assert b.counters()["kv_blocks_corrupt:shared"] == 1
    assert r.get(key) != bytes(value)  # discarded, then written again from B's recomputation
    c = b.restart(shared_url=redis_server.url())
    assert c.ask(PROMPT).reused_tokens == 6 * BLOCK


def test_a_tenant_never_loads_another_tenants_shared_blocks_even_when_planted(
    replicas: tuple[Replica, Replica], redis_server: RedisServer, redis_prefix: str
) -> None:
    a, b = replicas
    a.ask(PROMPT, namespace="victim")
    assert b.ask(PROMPT, namespace="intruder").reused_tokens == 0
    assert a.tiers is not None
    victim = a.tiers.names.blocks("victim", PROMPT, 6)
    intruder = a.tiers.names.blocks("other-intruder", PROMPT, 6)
    r = client(redis_server)
    for i in range(6):  # the victim's blocks copied under the names another tenant asks for
        r.set(f"{redis_prefix}b:{intruder.name(i)}", r.get(f"{redis_prefix}b:{victim.name(i)}"))
    assert b.ask(PROMPT, namespace="other-intruder").reused_tokens == 0
    assert b.counters()["kv_blocks_corrupt:shared"] == 1


def test_a_stopped_redis_costs_a_recompute_and_is_skipped_until_its_backoff_ends(
    tmp_path: Path,
) -> None:
    (tmp_path / "redis").mkdir()
    with start_redis(tmp_path / "redis") as server:
        a = Replica(tmp_path / "a", disk_bytes=0, shared_url=server.url())
        b = Replica(tmp_path / "b", disk_bytes=0, shared_url=server.url(), clock=a.clock)
        a.ask(PROMPT)
    # The server is stopped.
    assert b.ask(PROMPT).reused_tokens == 0
    assert b.counters()["kv_tier_errors:shared"] == 1  # one failure, then the tier is skipped
    assert b.ask((*PROMPT, 1)).ram_tokens == 50
    assert a.ask(tuple(range(900, 950))).reused_tokens == 0
    assert b.counters()["kv_tier_errors:shared"] == 1
    assert b.tiers is not None
    assert b.tiers.stats()["shared"]["state"] == "failing"  # type: ignore[index]
    b.clock.advance(1.0)  # the backoff ends: the next request tries again, and fails again
    b.ask(tuple(range(600, 650)))
    assert b.counters()["kv_tier_errors:shared"] == 2


def test_disk_and_shared_together_a_shared_load_is_kept_on_local_disk(
    tmp_path: Path, redis_server: RedisServer, redis_prefix: str
) -> None:
    a = Replica(tmp_path / "a", shared_url=redis_server.url(), prefix=redis_prefix)
    b = Replica(tmp_path / "b", shared_url=redis_server.url(), prefix=redis_prefix)
    a.ask(PROMPT)
    assert a.counters()["kv_blocks_written:disk"] == 6
    lease = b.ask(PROMPT)
    assert lease.tiers is not None
    assert lease.tiers.shared_tokens == 48
    assert b.counters()["kv_blocks_written:disk"] == 6
    restarted = b.restart()
    again = restarted.ask(PROMPT)
    assert again.tiers is not None
    assert again.tiers.disk_tokens == 48
