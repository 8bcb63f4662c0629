"""SQLite store: the embedded default. Persistent, shared by several processes on one file.

Layout: `entries` (one row per key, body as a BLOB), `meta` (name → value), and `usage`, a
one-row table of total bytes and entries kept exact by triggers, so the size bound is checked in
O(1) by any process in the same transaction as its write.

- WAL journal, `synchronous=NORMAL`, a busy timeout: readers never block the writer, and several
  processes can write one file; each write is its own `BEGIN IMMEDIATE` transaction.
- Bound: after an insert pushes `usage.bytes` over `max_bytes`, the same transaction deletes
  expired rows, then least-recently-used rows (about as many as the overflow needs, estimated
  from the mean entry size), so no write ever stalls on a large eviction.
- Recency without a write per hit: LRU at a granularity of `touch_granularity_s`. A hit on an
  entry last touched longer ago than that records (key, time) in memory; the pending touches
  are written with the next `put`, or once `touch_batch` of them have piled up. Rewriting a row
  costs ~20 µs, so a hot entry is rewritten at most once a granule, not on every hit.
- Every sqlite3 error (locked past the timeout, read-only file, "file is not a database") is
  translated into `StoreError` here; the connection is dropped so the next call retries.
  Opening is lazy, so a broken file never stops the cache from being built.

Thread-safety: one connection per thread (sqlite3 connections are not shared across threads).

Non-blocking reads (`nonblocking()`, the `InlineReads` seam in base.py): inside the block, the
calling thread reads through a second connection whose busy timeout is 0, and every write
raises `StoreWouldBlockError` at once. A WAL reader does not wait for writers, so a read from
the page cache takes tens of µs; a read that would have to wait for a lock (WAL recovery,
a checkpoint another process runs, an exclusive-mode connection) raises `StoreWouldBlockError`
instead, and the caller retries off its event loop. (A disk that stalls on a cold page is
outside what this bounds.)

Non-blocking writes (`nonblocking_writes()`, the `InlineWrites` seam): on entry the calling
thread's non-blocking connection begins `BEGIN IMMEDIATE` (the write lock, taken at once or
`StoreWouldBlockError`); every write in the block joins that one transaction, committed when the
block ends (rolled back if it raises). A commit in WAL mode appends to the log and does not sync
(`synchronous=NORMAL`). What can take milliseconds is a checkpoint, which copies the log into
the file and syncs it; the non-blocking connection never checkpoints (`wal_autocheckpoint=0`).
Instead, one entry in `inline_commits_per_checkpoint` raises `StoreWouldBlockError`, so that
block runs on a blocking connection, whose commit checkpoints once the log passes SQLite's
1,000 pages: the log stays bounded.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import orjson

from infercache.clock import Clock
from infercache.errors import InfercacheError, StoreError, StoreWouldBlockError
from infercache.stores.base import EPOCH_META, Entry, StoreStats

SCHEMA_VERSION = 1
_WAITED = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)  # primary result codes of a lock wait
_WAL_RETRY_S = 0.005
log = logging.getLogger(__name__)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    response BLOB NOT NULL,
    model TEXT NOT NULL,
    model_version TEXT NOT NULL,
    tags TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    upstream_s REAL NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    size INTEGER NOT NULL,
    last_access REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_last_access ON entries(last_access);
CREATE INDEX IF NOT EXISTS entries_expires_at ON entries(expires_at);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY CHECK (id = 1), bytes INTEGER NOT NULL, entries INTEGER NOT NULL
);
INSERT OR IGNORE INTO usage VALUES (1, 0, 0);
CREATE TRIGGER IF NOT EXISTS entries_ins AFTER INSERT ON entries BEGIN
    UPDATE usage SET bytes = bytes + NEW.size, entries = entries + 1 WHERE id = 1; END;
CREATE TRIGGER IF NOT EXISTS entries_del AFTER DELETE ON entries BEGIN
    UPDATE usage SET bytes = bytes - OLD.size, entries = entries - 1 WHERE id = 1; END;
CREATE TRIGGER IF NOT EXISTS entries_upd AFTER UPDATE OF size ON entries BEGIN
    UPDATE usage SET bytes = bytes - OLD.size + NEW.size WHERE id = 1; END;
"""
_COLUMNS = (
    "response, model, model_version, tags, created_at, expires_at, upstream_s,"
    " prompt_tokens, completion_tokens, last_access"
)
_UPSERT = """
INSERT INTO entries (key, response, model, model_version, tags, created_at, expires_at,
                     upstream_s, prompt_tokens, completion_tokens, size, last_access)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT(key) DO UPDATE SET
    response = excluded.response, model = excluded.model,
    model_version = excluded.model_version, tags = excluded.tags,
    created_at = excluded.created_at, expires_at = excluded.expires_at,
    upstream_s = excluded.upstream_s, prompt_tokens = excluded.prompt_tokens,
    completion_tokens = excluded.completion_tokens, size = excluded.size,
    last_access = excluded.last_access
"""


class SQLiteStore:
    def __init__(
        self,
        path: str | Path,
        *,
        max_bytes: int,
        clock: Clock,
        busy_timeout_s: float = 5.0,
        touch_batch: int = 1024,
        touch_granularity_s: float = 60.0,
        inline_commits_per_checkpoint: int = 256,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.max_bytes = max_bytes
        self._clock = clock
        self._busy_timeout_s = busy_timeout_s
        self._touch_batch = touch_batch
        self._touch_granularity_s = touch_granularity_s
        self._local = threading.local()
        self._touch_lock = threading.Lock()
        self._setup_lock = threading.Lock()
        self._touches: dict[str, float] = {}
        self._inline_commits_per_checkpoint = inline_commits_per_checkpoint
        self._inline_commits = 0
        self._nonblocking_block = _ThreadFlag(self._local, "nonblocking")

    # -- connection handling: the one place sqlite3 errors become StoreError --

    def _connect(self, *, timeout_s: float) -> sqlite3.Connection:
        # One thread at a time sets a connection up: switching a new file to WAL takes a lock
        # that SQLite does not wait for, so threads racing on a fresh file got "database is
        # locked". A non-blocking caller does not queue behind another's set-up.
        if not self._setup_lock.acquire(blocking=timeout_s > 0):
            raise StoreWouldBlockError(f"sqlite store {self.path}: another thread is connecting")
        try:
            return self._set_up(timeout_s)
        finally:
            self._setup_lock.release()

    def _set_up(self, timeout_s: float) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path, timeout=timeout_s, isolation_level=None, check_same_thread=True
        )
        try:
            _switch_to_wal(conn, timeout_s)
            conn.execute("PRAGMA synchronous=NORMAL")
            if timeout_s == 0:  # the non-blocking connection: checkpoints are left to others
                conn.execute("PRAGMA wal_autocheckpoint=0")
            if conn.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
                # Idempotent DDL in one transaction: processes racing to create it are safe.
                conn.executescript(
                    f"BEGIN IMMEDIATE; {_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
                )
        except BaseException:
            conn.close()
            raise
        return conn

    def nonblocking(self) -> AbstractContextManager[None]:
        """In this thread, for the block: reads never wait for a lock and writes are refused,
        both by raising `StoreWouldBlockError` (see the module docstring)."""
        return self._nonblocking_block

    @contextmanager
    def nonblocking_writes(self) -> Iterator[None]:
        """In this thread, for the block: reads as in `nonblocking()`, and every write joins
        one transaction whose lock is taken on entry, without waiting (the module docstring
        says when entry raises `StoreWouldBlockError`). Committed at the end of the block;
        a failed commit raises `StoreError`."""
        if getattr(self._local, "txn", None) is not None:
            raise RuntimeError("nonblocking_writes() blocks do not nest")
        self._inline_commits += 1
        if self._inline_commits > self._inline_commits_per_checkpoint:
            self._inline_commits = 0
            raise StoreWouldBlockError(f"sqlite store {self.path}: this write may checkpoint")
        with self.nonblocking():
            # On entry, so the caller retries where it may wait. A busy lock leaves the
            # connection as it was (dropping it, as `_conn` does on errors, would make the next
            # inline read reconnect, and give way while another thread sets up its own).
            try:
                conn = self._connection("nonblocking_conn")
                conn.execute("BEGIN IMMEDIATE")
            except (sqlite3.Error, OSError) as exc:
                raise StoreWouldBlockError(f"sqlite store {self.path}: {exc}") from exc
            self._local.txn = conn
            done = False
            try:
                yield
                done = True
            finally:
                self._local.txn = None
                self._end_transaction(conn, commit=done)

    def _end_transaction(self, conn: sqlite3.Connection, *, commit: bool) -> None:
        if getattr(self._local, "nonblocking_conn", None) is not conn:  # dropped on an error
            if commit:
                raise StoreError(f"sqlite store {self.path}: the transaction was rolled back")
            return
        try:
            conn.execute("COMMIT" if commit else "ROLLBACK")
        except sqlite3.Error as exc:
            self._drop_connection("nonblocking_conn")
            raise StoreError(f"sqlite store {self.path}: {exc}") from exc

    def _nonblocking(self) -> bool:
        return getattr(self._local, "nonblocking", False) is True

    def _conn(self) -> _Connection:
        """`with self._conn() as conn:` this thread's connection (the non-blocking one inside
        `nonblocking()`), opened on first use; a sqlite3 error in the block drops it and is
        raised as `StoreError` (`StoreWouldBlockError` for a lock a non-blocking read met)."""
        return _Connection(self, "nonblocking_conn" if self._nonblocking() else "conn")

    def _fetch_one(self, query: str, params: tuple[Any, ...]) -> Any:
        """One row of a read, as `with self._conn()` would run it (the hot read path: no
        context object)."""
        attr = "nonblocking_conn" if getattr(self._local, "nonblocking", False) else "conn"
        try:
            return self._connection(attr).execute(query, params).fetchone()
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(attr, exc) from exc

    def _connection(self, attr: str) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, attr, None)
        if conn is None:
            timeout_s = 0.0 if attr == "nonblocking_conn" else self._busy_timeout_s
            conn = self._connect(timeout_s=timeout_s)
            setattr(self._local, attr, conn)
        return conn

    def _failed(self, attr: str, exc: sqlite3.Error | OSError) -> InfercacheError:
        self._drop_connection(attr)
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if attr == "nonblocking_conn" and code in _WAITED:
            return StoreWouldBlockError(f"sqlite store {self.path}: {exc}")
        return StoreError(f"sqlite store {self.path}: {exc}")

    def _drop_connection(self, attr: str = "conn") -> None:
        conn = getattr(self._local, attr, None)
        setattr(self._local, attr, None)
        if conn is not None:
            conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        txn: sqlite3.Connection | None = getattr(self._local, "txn", None)
        if txn is not None:  # inside nonblocking_writes(): its transaction
            if getattr(self._local, "nonblocking_conn", None) is not txn:
                raise StoreError(f"sqlite store {self.path}: the transaction was rolled back")
            with self._conn() as conn:
                yield conn
            return
        if self._nonblocking():
            raise StoreWouldBlockError(f"sqlite store {self.path}: no writes in non-blocking mode")
        with self._conn() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    # -- Store --

    def get(self, key: str) -> Entry | None:
        return self.get_with_meta(key, ())[0]

    def get_with_meta(self, key: str, names: Sequence[str]) -> tuple[Entry | None, dict[str, str]]:
        row = self._fetch_one(_get_with_meta_query(len(names)), (*names, key))
        meta: dict[str, str] = orjson.loads(row[0]) if row[0] else {}
        if row[1] is None:
            return None, meta
        entry = self._entry(key, row[1:])
        now_s = self._clock.now_s()
        if now_s - row[-1] < self._touch_granularity_s:
            return entry, meta
        with self._touch_lock:
            self._touches[key] = now_s
            flush = len(self._touches) >= self._touch_batch
        if flush:
            with self._write() as conn:
                self._flush_touches(conn)
        return entry, meta

    def _entry(self, key: str, row: Sequence[Any]) -> Entry:
        try:
            tags = () if row[3] == "[]" else tuple((str(t), int(g)) for t, g in json.loads(row[3]))
        except (ValueError, TypeError) as exc:
            raise StoreError(f"sqlite store {self.path}: bad tags for {key}: {exc}") from exc
        return Entry(
            response=bytes(row[0]),
            model=row[1],
            model_version=row[2],
            tags=tags,
            created_at_s=row[4],
            expires_at_s=row[5],
            upstream_s=row[6],
            prompt_tokens=row[7],
            completion_tokens=row[8],
        )

    def put(self, key: str, entry: Entry) -> None:
        size = entry.size_bytes
        if size > self.max_bytes:
            self.delete(key)
            return
        now_s = self._clock.now_s()
        row = (
            key,
            entry.response,
            entry.model,
            entry.model_version,
            json.dumps([list(t) for t in entry.tags]),
            entry.created_at_s,
            entry.expires_at_s,
            entry.upstream_s,
            entry.prompt_tokens,
            entry.completion_tokens,
            size,
            now_s,
        )
        with self._write() as conn:
            self._flush_touches(conn)
            conn.execute(_UPSERT, row)
            used = conn.execute("SELECT bytes FROM usage WHERE id = 1").fetchone()[0]
            if used > self.max_bytes:
                self._evict(conn, now_s, keep=key)

    def delete(self, key: str) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM entries WHERE key = ?", (key,))

    def purge(self) -> int:
        with self._write() as conn:
            n: int = conn.execute("SELECT entries FROM usage WHERE id = 1").fetchone()[0]
            conn.execute("DELETE FROM entries")
        with self._touch_lock:
            self._touches.clear()
        return n

    def stats(self) -> StoreStats:
        with self._conn() as conn:
            used, entries = conn.execute("SELECT bytes, entries FROM usage WHERE id = 1").fetchone()
        return StoreStats(entries=entries, bytes=used, max_bytes=self.max_bytes)

    def scan(self, prefix: str) -> Iterator[tuple[str, Entry]]:
        # Keys are ASCII: every key with the prefix sorts in [prefix, prefix + U+FFFF).
        query = f"SELECT key, {_COLUMNS} FROM entries WHERE key >= ? AND key < ?"
        with self._conn() as conn:
            rows = conn.execute(query, (prefix, prefix + "\uffff")).fetchall()
        for row in rows:
            yield row[0], self._entry(row[0], row[1:])

    # -- MetaStore --

    def read_meta(self, names: Sequence[str]) -> dict[str, str]:
        if not names:
            return {}
        marks = ",".join("?" * len(names))
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT name, value FROM meta WHERE name IN ({marks})", tuple(names)
            ).fetchall()
        return dict(rows)

    def write_meta(self, name: str, value: str) -> None:
        with self._write() as conn:
            conn.execute(
                "INSERT INTO meta VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = ?",
                (name, value, value),
            )

    def incr_meta(self, name: str) -> int:
        with self._write() as conn:
            row = conn.execute(
                "INSERT INTO meta VALUES (?, '1') ON CONFLICT(name) DO UPDATE SET"
                " value = CAST(value AS INTEGER) + 1 RETURNING value",
                (name,),
            ).fetchone()
        return int(row[0])

    def epoch(self) -> str:
        found = self.read_meta([EPOCH_META]).get(EPOCH_META)
        if found is not None:
            return found  # no write (and no write lock) once minted
        with self._write() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO meta VALUES (?, ?)", (EPOCH_META, secrets.token_hex(8))
            )
            row = conn.execute("SELECT value FROM meta WHERE name = ?", (EPOCH_META,)).fetchone()
        return str(row[0])

    def close(self) -> None:
        try:
            with self._write() as conn:
                self._flush_touches(conn)
        except StoreError as exc:
            # Only recency hints are lost; entries are already committed.
            log.warning("could not save recency on close: %s", exc)
        self._drop_connection("conn")
        self._drop_connection("nonblocking_conn")

    # -- internals --

    def _flush_touches(self, conn: sqlite3.Connection) -> None:
        with self._touch_lock:
            touches, self._touches = self._touches, {}
        if touches:
            conn.executemany(
                "UPDATE entries SET last_access = ? WHERE key = ?",
                [(t, k) for k, t in touches.items()],
            )

    def _evict(self, conn: sqlite3.Connection, now_s: float, *, keep: str) -> None:
        conn.execute("DELETE FROM entries WHERE expires_at <= ? AND key != ?", (now_s, keep))
        while True:
            used, entries = conn.execute("SELECT bytes, entries FROM usage WHERE id = 1").fetchone()
            if used <= self.max_bytes or entries <= 1:
                return
            overflow_rows = math.ceil((used - self.max_bytes) / (used / entries))
            conn.execute(
                "DELETE FROM entries WHERE key IN (SELECT key FROM entries WHERE key != ?"
                " ORDER BY last_access LIMIT ?)",
                (keep, max(1, overflow_rows)),
            )


@functools.lru_cache(maxsize=64)
def _get_with_meta_query(n_names: int) -> str:
    """One statement, one row always: the meta values as a JSON object beside the entry's
    columns (NULLs when the key is absent)."""
    marks = ",".join("?" * n_names) or "NULL"
    return (
        "SELECT (SELECT json_group_object(name, value) FROM meta"
        f" WHERE name IN ({marks})), {_COLUMNS} FROM (SELECT 1)"
        " LEFT JOIN entries ON key = ?"
    )


def _switch_to_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """`PRAGMA journal_mode=WAL`, retried for up to `timeout_s`: on a fresh file the switch
    takes a lock that SQLite's busy handler does not wait for, so a process (or thread) racing
    another's switch reads "database is locked" at once. Real time, as SQLite's own busy
    timeout is; 5 ms between tries."""
    tries = max(1, math.ceil(timeout_s / _WAL_RETRY_S))
    for attempt in range(tries):
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF in _WAITED
            if not busy or attempt == tries - 1:
                raise
            time.sleep(_WAL_RETRY_S)


class _ThreadFlag:
    """`with flag:` sets `local.<name>` for the block, in the calling thread. Stateless, so
    one instance serves every thread (and costs less than a generator-based context)."""

    __slots__ = ("_local", "_name")

    def __init__(self, local: threading.local, name: str) -> None:
        self._local = local
        self._name = name

    def __enter__(self) -> None:
        setattr(self._local, self._name, True)

    def __exit__(self, *exc_info: object) -> None:
        setattr(self._local, self._name, False)


class _Connection:
    """The context `SQLiteStore._conn()` returns (a class: it runs on every store call)."""

    __slots__ = ("_attr", "_store")

    def __init__(self, store: SQLiteStore, attr: str) -> None:
        self._store = store
        self._attr = attr

    def __enter__(self) -> sqlite3.Connection:
        try:
            return self._store._connection(self._attr)
        except (sqlite3.Error, OSError) as exc:
            raise self._store._failed(self._attr, exc) from exc

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, (sqlite3.Error, OSError)):
            raise self._store._failed(self._attr, exc) from exc
