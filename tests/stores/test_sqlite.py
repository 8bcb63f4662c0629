"""SQLite store: durability across processes, concurrent writers, and broken files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from infercache.clock import ManualClock
from infercache.errors import StoreError
from infercache.stores.sqlite import SQLiteStore
from tests.stores.test_contract import entry

WRITER = textwrap.dedent(
    """
    import sys
    from infercache.clock import SystemClock
    from infercache.stores.base import Entry
    from infercache.stores.sqlite import SQLiteStore

    path, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = SQLiteStore(path, max_bytes=1 << 30, clock=SystemClock())
    for i in range(n):
        store.put(f"{name}-{i}", Entry(f"{name} {i}".encode(), "m", "0:", (), 0.0, 1e12, 0.1, 1, 1))
    store.incr_meta("writes")
    print(store.get(f"{name}-0").response.decode())
    store.close()
    """
)


def run_writer(path: Path, name: str, n: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), name, str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_second_process_reads_what_the_first_stored(tmp_path: Path) -> None:
    db = tmp_path / "cache.db"
    first = run_writer(db, "first", 10)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert out.strip() == "first 0"
    reader = SQLiteStore(db, max_bytes=1 << 30, clock=ManualClock())
    got = reader.get("first-9")
    assert got is not None
    assert got.response == b"first 9"
    reader.close()


def test_two_processes_writing_one_file_lose_nothing(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    n = 400
    writers = [run_writer(db, name, n) for name in ("a", "b")]
    for w in writers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    store = SQLiteStore(db, max_bytes=1 << 30, clock=ManualClock())
    missing = [
        f"{name}-{i}" for name in ("a", "b") for i in range(n) if store.get(f"{name}-{i}") is None
    ]
    assert missing == []
    assert store.stats().entries == 2 * n
    assert store.read_meta(["writes"]) == {"writes": "2"}
    store.close()


def test_a_corrupted_file_raises_store_error_not_sqlite_errors(
    tmp_path: Path, clock: ManualClock
) -> None:
    db = tmp_path / "corrupt.db"
    db.write_bytes(b"this is not a database, " * 200)
    store = SQLiteStore(db, max_bytes=1 << 20, clock=clock)  # opening is lazy: never fails
    with pytest.raises(StoreError, match="not a database"):
        store.get("k")
    with pytest.raises(StoreError):
        store.put("k", entry(clock))
    with pytest.raises(StoreError):
        store.read_meta(["model:m"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write read-only files")
def test_an_unwritable_file_raises_store_error(tmp_path: Path, clock: ManualClock) -> None:
    db = tmp_path / "ro.db"
    SQLiteStore(db, max_bytes=1 << 20, clock=clock).put("k", entry(clock))
    db.chmod(0o444)
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(StoreError):
            SQLiteStore(db, max_bytes=1 << 20, clock=clock).put("k2", entry(clock))
    finally:
        tmp_path.chmod(0o755)


def test_a_directory_in_place_of_the_file_raises_store_error(
    tmp_path: Path, clock: ManualClock
) -> None:
    # Unwritable in a way root cannot bypass: the path is a directory.
    db = tmp_path / "dir.db"
    db.mkdir()
    store = SQLiteStore(db, max_bytes=1 << 20, clock=clock)
    with pytest.raises(StoreError):
        store.put("k", entry(clock))


def test_recency_from_hits_is_saved_without_a_write_per_hit(
    tmp_path: Path, clock: ManualClock
) -> None:
    body = b"z" * 1000
    size = entry(clock, body).size_bytes
    store = SQLiteStore(tmp_path / "lru.db", max_bytes=size * 3, clock=clock)
    for name in ("a", "b", "c"):
        store.put(name, entry(clock, body, ttl_s=1e6))
        clock.advance(100)
    store.get("a")  # only remembered in memory until the next write
    clock.advance(100)
    store.put("d", entry(clock, body, ttl_s=1e6))
    assert store.get("b") is None
    assert {k for k in "acd" if store.get(k) is not None} == {"a", "c", "d"}
    store.close()


def test_a_hit_within_the_granule_rewrites_nothing(tmp_path: Path, clock: ManualClock) -> None:
    body = b"z" * 1000
    size = entry(clock, body).size_bytes
    store = SQLiteStore(
        tmp_path / "granule.db", max_bytes=size * 2, clock=clock, touch_granularity_s=60
    )
    store.put("a", entry(clock, body, ttl_s=1e6))
    clock.advance(10)
    store.put("b", entry(clock, body, ttl_s=1e6))
    clock.advance(10)
    store.get("a")  # 20 s after its last touch: within the granule, not recorded
    store.put("c", entry(clock, body, ttl_s=1e6))
    assert store.get("a") is None  # so "a" was still the least recently used
    assert store.get("b") is not None
    store.close()


@pytest.mark.concurrency
def test_threads_racing_on_a_fresh_file_never_see_it_locked(tmp_path: Path) -> None:
    """Sixteen threads opening their connections to a new file at once: switching it to WAL
    takes a lock SQLite does not wait for, so before connection set-up was serialised about one
    race in a hundred got "database is locked" (measured: 2 of 200)."""
    failures: list[StoreError] = []
    for trial in range(150):
        store = SQLiteStore(
            tmp_path / f"{trial}.db", max_bytes=1 << 20, clock=ManualClock(), busy_timeout_s=0.05
        )

        def look(store: SQLiteStore = store) -> None:
            try:
                store.get_with_meta("k", ["model:m"])
            except StoreError as exc:
                failures.append(exc)

        threads = [threading.Thread(target=look) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        store.close()
    assert failures == []
