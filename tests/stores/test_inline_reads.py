"""Non-blocking reads (stores.base.InlineReads): what lets the gateway look up on its event loop.

Inside `nonblocking()` a store call that would wait raises `StoreWouldBlockError` at once, and
the caller retries it off the loop. Checked against a real SQLite file locked by a real second
process, and the breaker of the guard around it (the gateway that relies on it: tests/gateway/
test_inline_lookups.py).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from infercache.clock import ManualClock
from infercache.errors import StoreError, StoreUnavailableError, StoreWouldBlockError
from infercache.store_guard import BreakerSettings, GuardedBackend, inline_reads
from infercache.stores.memory import MemoryStore
from infercache.stores.redis import RedisStore
from infercache.stores.sqlite import SQLiteStore
from tests.harness.processes import sqlite_lock_held
from tests.stores.test_contract import entry


def exclusively_locked(path: Path) -> AbstractContextManager[None]:
    """Another process holds the file in exclusive locking mode: no other connection may even
    read it until that process lets go (the one kind of lock a WAL reader waits for). It can
    take that lock only while no other connection is open on the file."""
    return sqlite_lock_held(
        path,
        "PRAGMA locking_mode=EXCLUSIVE",
        "CREATE TABLE IF NOT EXISTS holder (x)",
        "INSERT INTO holder VALUES (1)",
    )


def sqlite(path: Path, *, busy_timeout_s: float = 5.0) -> SQLiteStore:
    clock = ManualClock()
    store = SQLiteStore(path, max_bytes=1 << 20, clock=clock, busy_timeout_s=busy_timeout_s)
    store.put("k", entry(clock, b"kept"))
    store.close()  # this thread's connections: the lock below needs the file to itself
    return store


def test_sqlite_reads_in_nonblocking_mode_and_refuses_writes(tmp_path: Path) -> None:
    store = sqlite(tmp_path / "c.db")
    with store.nonblocking():
        found = store.get("k")
        assert found is not None
        assert found.response == b"kept"
        entry_, meta = store.get_with_meta("absent", ["model:m"])
        assert entry_ is None
        assert meta == {}
        with pytest.raises(StoreWouldBlockError):
            store.put("k2", entry(ManualClock(), b"new"))
        with pytest.raises(StoreWouldBlockError):
            store.delete("k")
    store.put("k2", entry(ManualClock(), b"new"))  # outside the block, writes are writes again
    assert store.get("k") is not None
    assert store.get("k2") is not None
    store.close()


def test_a_locked_sqlite_file_makes_a_nonblocking_read_give_way_not_wait(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = sqlite(path, busy_timeout_s=0.05)
    with exclusively_locked(path):
        with store.nonblocking(), pytest.raises(StoreWouldBlockError):
            store.get("k")
        # The same read made normally waits out its busy timeout and fails as a store error:
        # the difference is what tells the gateway to retry off the loop.
        with pytest.raises(StoreError) as waited:
            store.get("k")
        assert not isinstance(waited.value, StoreWouldBlockError)
    with store.nonblocking():
        assert store.get("k") is not None  # the lock is gone: inline again
    store.close()


def test_the_guard_gives_way_while_its_breaker_is_not_closed(tmp_path: Path) -> None:
    clock = ManualClock()
    inner = sqlite(tmp_path / "c.db", busy_timeout_s=0.05)
    guarded = GuardedBackend(
        inner, clock=clock, breaker=BreakerSettings(failures_to_open=1, backoff_s=1.0)
    )
    with exclusively_locked(tmp_path / "c.db"), pytest.raises(StoreError):
        guarded.get("k")  # a real failure opens the breaker
    assert guarded.breaker.state == "open"
    with pytest.raises(StoreWouldBlockError), guarded.nonblocking():
        guarded.get("k")
    assert guarded.skipped == 0  # giving way is not a skip: the retry off the loop counts it
    with pytest.raises(StoreUnavailableError):
        guarded.get("k")
    clock.advance(1.0)
    with pytest.raises(StoreWouldBlockError), guarded.nonblocking():
        guarded.get("k")  # a probe is not taken on the loop either...
    assert guarded.get("k") is not None  # ...but off it, and it closes the breaker
    with guarded.nonblocking():
        assert guarded.get("k") is not None
    guarded.close()


def test_a_breaker_opened_inside_a_nonblocking_block_skips_the_next_call(tmp_path: Path) -> None:
    guarded = GuardedBackend(
        sqlite(tmp_path / "c.db"),
        clock=ManualClock(),
        breaker=BreakerSettings(failures_to_open=1, backoff_s=1.0),
    )
    with guarded.nonblocking():
        assert guarded.get("k") is not None
        guarded.breaker.record(False)  # another thread's call failed meanwhile
        with pytest.raises(StoreUnavailableError):
            guarded.get("k")  # skipped and counted, as off the loop: nothing waits
    assert guarded.skipped == 1
    guarded.close()


def test_which_stores_read_inline(tmp_path: Path) -> None:
    clock = ManualClock()
    memory = MemoryStore(max_bytes=1 << 20, clock=clock)
    assert inline_reads(memory) is not None
    assert inline_reads(GuardedBackend(memory, clock=clock)) is not None
    on_file = sqlite(tmp_path / "c.db")
    assert inline_reads(GuardedBackend(on_file, clock=clock)) is not None
    redis = RedisStore("redis://127.0.0.1:1/0", clock=clock)  # never connected: lazy
    assert inline_reads(redis) is None
    assert inline_reads(GuardedBackend(redis, clock=clock)) is None
    on_file.close()
