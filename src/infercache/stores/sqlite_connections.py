"""SQLite connections, one per thread, and the store's non-blocking regime (`SQLiteConnections`).

sqlite3 connections are not shared across threads, so each thread opens its own on first use
(lazily, so a broken file never stops the cache from being built), in WAL mode with
`synchronous=NORMAL` and a busy timeout; the schema is created on the first connection that
finds the file without it (idempotent DDL in one `BEGIN IMMEDIATE`). Every sqlite3 error
(locked past the timeout, read-only file, "file is not a database") is translated into
`StoreError` here, and the connection is dropped so the next call retries.

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

import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from infercache.errors import InfercacheError, StoreError, StoreWouldBlockError

_WAITED = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)  # primary result codes of a lock wait
_WAL_RETRY_S = 0.005
_BLOCKING, _NONBLOCKING = "conn", "nonblocking_conn"  # this thread's two connections


@dataclass(eq=False, repr=False, slots=True)
class SQLiteConnections:
    """This thread's connection to one SQLite file, blocking or not: the one place sqlite3
    errors become `StoreError`. `schema` is idempotent DDL, run (with `user_version` set to
    `schema_version`) by the first connection that finds the file at another version."""

    path: Path
    _: KW_ONLY
    schema: str
    schema_version: int
    busy_timeout_s: float
    inline_commits_per_checkpoint: int
    _local: threading.local = field(init=False, default_factory=threading.local)
    _setup_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _inline_commits: int = field(init=False, default=0)
    _nonblocking_block: _ThreadFlag = field(init=False)

    def __post_init__(self) -> None:
        self._nonblocking_block = _ThreadFlag(self._local, "nonblocking")

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
            if conn.execute("PRAGMA user_version").fetchone()[0] != self.schema_version:
                # Idempotent DDL in one transaction: processes racing to create it are safe.
                conn.executescript(
                    f"BEGIN IMMEDIATE; {self.schema}"
                    f" PRAGMA user_version = {self.schema_version}; COMMIT;"
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
        if self._inline_commits > self.inline_commits_per_checkpoint:
            self._inline_commits = 0
            raise StoreWouldBlockError(f"sqlite store {self.path}: this write may checkpoint")
        with self.nonblocking():
            # On entry, so the caller retries where it may wait. A busy lock leaves the
            # connection as it was (dropping it, as `conn` does on errors, would make the next
            # inline read reconnect, and give way while another thread sets up its own).
            try:
                conn = self._connection(_NONBLOCKING)
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
        if getattr(self._local, _NONBLOCKING, None) is not conn:  # dropped on an error
            if commit:
                raise StoreError(f"sqlite store {self.path}: the transaction was rolled back")
            return
        try:
            conn.execute("COMMIT" if commit else "ROLLBACK")
        except sqlite3.Error as exc:
            self._drop(_NONBLOCKING)
            raise StoreError(f"sqlite store {self.path}: {exc}") from exc

    def _nonblocking(self) -> bool:
        return getattr(self._local, "nonblocking", False) is True

    def conn(self) -> _Connection:
        """`with connections.conn() as conn:` this thread's connection (the non-blocking one
        inside `nonblocking()`), opened on first use; a sqlite3 error in the block drops it and
        is raised as `StoreError` (`StoreWouldBlockError` for a lock a non-blocking read met)."""
        return _Connection(self, _NONBLOCKING if self._nonblocking() else _BLOCKING)

    def fetch_one(self, query: str, params: tuple[Any, ...]) -> Any:
        """One row of a read, as `with self.conn()` would run it (the hot read path: no
        context object)."""
        attr = _NONBLOCKING if getattr(self._local, "nonblocking", False) else _BLOCKING
        try:
            return self._connection(attr).execute(query, params).fetchone()
        except (sqlite3.Error, OSError) as exc:
            raise self._failed(attr, exc) from exc

    def _connection(self, attr: str) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, attr, None)
        if conn is None:
            timeout_s = 0.0 if attr == _NONBLOCKING else self.busy_timeout_s
            conn = self._connect(timeout_s=timeout_s)
            setattr(self._local, attr, conn)
        return conn

    def _failed(self, attr: str, exc: sqlite3.Error | OSError) -> InfercacheError:
        self._drop(attr)
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if attr == _NONBLOCKING and code in _WAITED:
            return StoreWouldBlockError(f"sqlite store {self.path}: {exc}")
        return StoreError(f"sqlite store {self.path}: {exc}")

    def _drop(self, attr: str) -> None:
        conn = getattr(self._local, attr, None)
        setattr(self._local, attr, None)
        if conn is not None:
            conn.close()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """`with connections.write() as conn:` one write transaction (`BEGIN IMMEDIATE`), or
        the open one of `nonblocking_writes()`; refused inside `nonblocking()`."""
        txn: sqlite3.Connection | None = getattr(self._local, "txn", None)
        if txn is not None:  # inside nonblocking_writes(): its transaction
            if getattr(self._local, _NONBLOCKING, None) is not txn:
                raise StoreError(f"sqlite store {self.path}: the transaction was rolled back")
            with self.conn() as conn:
                yield conn
            return
        if self._nonblocking():
            raise StoreWouldBlockError(f"sqlite store {self.path}: no writes in non-blocking mode")
        with self.conn() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def close(self) -> None:
        """Close this thread's connections (a later call opens new ones)."""
        self._drop(_BLOCKING)
        self._drop(_NONBLOCKING)


def _switch_to_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """`PRAGMA journal_mode=WAL`, retried for up to `timeout_s`: on a fresh file the switch
    takes a lock that SQLite's busy handler does not wait for, so a process (or thread) racing
    another's switch reads "database is locked" at once. Real time, as SQLite's own busy
    timeout is: until `timeout_s` has passed in all (a try may itself wait the busy timeout, so
    counting tries would multiply it); 5 ms between tries."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorcode", 0) & 0xFF in _WAITED
            if not busy or time.monotonic() >= deadline_s:
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
    """The context `SQLiteConnections.conn()` returns (a class: it runs on every store call)."""

    __slots__ = ("_attr", "_connections")

    def __init__(self, connections: SQLiteConnections, attr: str) -> None:
        self._connections = connections
        self._attr = attr

    def __enter__(self) -> sqlite3.Connection:
        try:
            return self._connections._connection(self._attr)
        except (sqlite3.Error, OSError) as exc:
            raise self._connections._failed(self._attr, exc) from exc

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, (sqlite3.Error, OSError)):
            raise self._connections._failed(self._attr, exc) from exc
