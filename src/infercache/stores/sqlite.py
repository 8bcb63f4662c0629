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
- Connections (sqlite_connections.py): one per thread, opened lazily in WAL with this schema;
  every sqlite3 error becomes `StoreError` there, and the non-blocking regime the gateway's
  event loop reads and writes through (`nonblocking()`, `nonblocking_writes()`) lives there.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import secrets
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import orjson

from infercache.clock import Clock
from infercache.errors import StoreError
from infercache.stores.base import EPOCH_META, Entry, StoreStats
from infercache.stores.sqlite_connections import SQLiteConnections

SCHEMA_VERSION = 1
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
        self._touch_batch = touch_batch
        self._touch_granularity_s = touch_granularity_s
        self._touch_lock = threading.Lock()
        self._touches: dict[str, float] = {}
        self._db = SQLiteConnections(
            self.path,
            schema=_SCHEMA,
            schema_version=SCHEMA_VERSION,
            busy_timeout_s=busy_timeout_s,
            inline_commits_per_checkpoint=inline_commits_per_checkpoint,
        )
        self._fetch_one = self._db.fetch_one  # the hot read path: one call fewer

    # -- InlineReads, InlineWrites (base.py): the connections' non-blocking regime --

    def nonblocking(self) -> AbstractContextManager[None]:
        """In this thread, for the block: reads never wait for a lock, writes are refused."""
        return self._db.nonblocking()

    def nonblocking_writes(self) -> AbstractContextManager[None]:
        """In this thread, for the block: writes join one transaction taken without waiting."""
        return self._db.nonblocking_writes()

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
            with self._db.write() as conn:
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
        with self._db.write() as conn:
            self._flush_touches(conn)
            conn.execute(_UPSERT, row)
            used = conn.execute("SELECT bytes FROM usage WHERE id = 1").fetchone()[0]
            if used > self.max_bytes:
                self._evict(conn, now_s, keep=key)

    def delete(self, key: str) -> None:
        with self._db.write() as conn:
            conn.execute("DELETE FROM entries WHERE key = ?", (key,))

    def purge(self) -> int:
        with self._db.write() as conn:
            n: int = conn.execute("SELECT entries FROM usage WHERE id = 1").fetchone()[0]
            conn.execute("DELETE FROM entries")
        with self._touch_lock:
            self._touches.clear()
        return n

    def stats(self) -> StoreStats:
        with self._db.conn() as conn:
            used, entries = conn.execute("SELECT bytes, entries FROM usage WHERE id = 1").fetchone()
        return StoreStats(entries=entries, bytes=used, max_bytes=self.max_bytes)

    def scan(self, prefix: str) -> Iterator[tuple[str, Entry]]:
        # Keys are ASCII: every key with the prefix sorts in [prefix, prefix + U+FFFF).
        query = f"SELECT key, {_COLUMNS} FROM entries WHERE key >= ? AND key < ?"
        with self._db.conn() as conn:
            rows = conn.execute(query, (prefix, prefix + "\uffff")).fetchall()
        for row in rows:
            yield row[0], self._entry(row[0], row[1:])

    # -- MetaStore --

    def read_meta(self, names: Sequence[str]) -> dict[str, str]:
        if not names:
            return {}
        marks = ",".join("?" * len(names))
        with self._db.conn() as conn:
            rows = conn.execute(
                f"SELECT name, value FROM meta WHERE name IN ({marks})", tuple(names)
            ).fetchall()
        return dict(rows)

    def write_meta(self, name: str, value: str) -> None:
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO meta VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = ?",
                (name, value, value),
            )

    def incr_meta(self, name: str) -> int:
        with self._db.write() as conn:
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
        with self._db.write() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO meta VALUES (?, ?)", (EPOCH_META, secrets.token_hex(8))
            )
            row = conn.execute("SELECT value FROM meta WHERE name = ?", (EPOCH_META,)).fetchone()
        return str(row[0])

    def release_thread(self) -> None:
        """Close the calling thread's connections (stores.base.ThreadResources)."""
        self._db.close()

    def close(self) -> None:
        try:
            with self._db.write() as conn:
                self._flush_touches(conn)
        except StoreError as exc:
            # Only recency hints are lost; entries are already committed.
            log.warning("could not save recency on close: %s", exc)
        self._db.close()

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
