"""Non-blocking writes (stores.base.InlineWrites): what lets the gateway store a miss on its
event loop.

On entry the block takes its write lock at once or raises `StoreWouldBlockError` (the caller then
runs the block off the loop); inside, every write joins one transaction, committed at the end.
Checked against real SQLite files, a write lock held by a real second process, and the size of
the write-ahead log that the non-blocking connection never checkpoints itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infercache.clock import ManualClock
from infercache.errors import StoreWouldBlockError
from infercache.store_guard import BreakerSettings, GuardedBackend, inline_writes
from infercache.stores.base import Entry
from infercache.stores.memory import MemoryStore
from infercache.stores.sqlite import SQLiteStore
from tests.harness.processes import sqlite_lock_held
from tests.stores.test_contract import entry


def sqlite(path: Path, **settings: int) -> SQLiteStore:
    return SQLiteStore(path, max_bytes=1 << 30, clock=ManualClock(), **settings)


def test_a_blocks_writes_commit_together_at_its_end(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store, other = sqlite(path), sqlite(path)  # two stores: two connections on one file
    clock = ManualClock()
    other.put("seen-before", entry(clock, b"0"))
    with store.nonblocking_writes():
        store.put("a", entry(clock, b"1"))
        store.write_meta("model:m", "v1")
        assert store.get("a") is not None  # the block reads its own writes
        assert other.get("a") is None  # nobody else does until the commit
        assert other.read_meta(["model:m"]) == {}
        assert store.get("seen-before") is not None
    found = other.get("a")
    assert found is not None
    assert found.response == b"1"
    assert other.read_meta(["model:m"]) == {"model:m": "v1"}
    store.close()
    other.close()


def test_a_block_that_raises_writes_nothing(tmp_path: Path) -> None:
    store = sqlite(tmp_path / "c.db")

    def write_then_fail() -> None:
        with store.nonblocking_writes():
            store.put("a", entry(ManualClock(), b"1"))
            raise ValueError("the block failed after its write")

    with pytest.raises(ValueError, match="after its write"):
        write_then_fail()
    assert store.get("a") is None
    store.put("b", entry(ManualClock(), b"2"))  # and the connection is usable again
    assert store.get("b") is not None
    store.close()


def test_a_write_lock_held_by_another_process_makes_entry_give_way(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    store = sqlite(path)
    store.put("a", entry(ManualClock(), b"1"))  # the file exists, in WAL mode
    with store.nonblocking():
        assert store.get("a") is not None  # opens this thread's non-blocking connection
    reads_through = store._db._local.nonblocking_conn
    ran = False
    with sqlite_lock_held(path, "BEGIN IMMEDIATE"):
        with pytest.raises(StoreWouldBlockError), store.nonblocking_writes():
            ran = True
        # Giving way kept the connection: the next inline read needs no new one (setting one
        # up waits for any other thread's set-up, so it would give way too: bench/faults.py
        # saw hot hits' p99 go from 5 to 160 ms under this lock).
        assert store._db._local.nonblocking_conn is reads_through
        with store.nonblocking():
            assert store.get("a") is not None  # reads still go on under a write lock
    assert not ran  # the block never started: the caller runs it elsewhere
    with store.nonblocking_writes():
        store.put("b", entry(ManualClock(), b"2"))
    assert store.get("b") is not None
    store.close()


def big(clock: ManualClock, i: int) -> Entry:
    return entry(clock, f"{i:08d}".encode() * 512)  # 4 KB: a page or two of log a write


def wal_pages(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size // 4096 if wal.exists() else 0


@pytest.mark.parametrize("give_way_every", [8, 1_000_000])
def test_one_block_in_n_gives_way_so_that_a_blocking_write_checkpoints_the_log(
    tmp_path: Path, give_way_every: int
) -> None:
    """The non-blocking connection never checkpoints (that copies the log and syncs: it can
    take milliseconds). Without the blocks that give way, the log only grows."""
    path = tmp_path / "c.db"
    store = sqlite(path, inline_commits_per_checkpoint=give_way_every)
    clock = ManualClock()
    gave_way = 0
    for i in range(1_500):
        try:
            with store.nonblocking_writes():
                store.put(f"k{i}", big(clock, i))
        except StoreWouldBlockError:
            gave_way += 1
            store.put(f"k{i}", big(clock, i))  # what the caller does off the loop
    assert store.stats().entries == 1_500
    if give_way_every == 8:
        assert gave_way == 1_500 // 9
        assert wal_pages(path) < 1_300  # SQLite checkpoints at 1,000 pages, plus 8 writes
    else:
        assert gave_way == 0
        assert wal_pages(path) > 3_000  # every write still in the log
    store.close()


def test_memory_writes_are_writes_inside_the_block() -> None:
    store = MemoryStore(max_bytes=1 << 20, clock=ManualClock())
    with store.nonblocking_writes():
        store.put("a", entry(ManualClock(), b"1"))
    assert store.get("a") is not None


def test_the_guard_gives_way_while_its_breaker_is_open(tmp_path: Path) -> None:
    clock = ManualClock()
    guarded = GuardedBackend(
        sqlite(tmp_path / "c.db"),
        clock=clock,
        breaker=BreakerSettings(failures_to_open=1, backoff_s=1.0, max_backoff_s=1.0),
    )
    writes = inline_writes(guarded)
    assert writes is not None
    with writes():
        guarded.put("a", entry(clock, b"1"))
    assert guarded.get("a") is not None
    guarded.breaker.record(False)  # as a failed call would
    assert guarded.breaker.state == "open"
    with pytest.raises(StoreWouldBlockError), writes():
        pass
    guarded.close()
