"""A feed of semantic-index changes shared by every gateway on one Redis (or Redis Cluster): a
Redis Stream that replicas publish adds, removals and invalidations to, and read in order.

The store stays the source of truth; the feed only says *what changed*, so a replica learns of
an entry another replica stored within one blocking read instead of at its next restart.

Stream: `{prefix}{feed}{name}` (one hash slot, so it works unchanged on a cluster). Event ids
are `E-n`: `E` is fixed for the stream's life (the server's time in µs when it was first
written, kept at `{prefix}{feed}{name}:epoch`; a new life cannot start in the same µs) and
`n` counts up by one per event (`XADD E-*`, Redis ≥ 7). Contiguous ids make loss visible:
`publish` trims the stream to about `max_len` events (`XADD MAXLEN ~`), and a reader whose
next event was trimmed, or whose stream vanished (a server restarted empty), is told so
(`FeedBatch.gap`) instead of silently skipping.
`read_after` reads its events and the stream's bounds in one Lua call, so the gap check and the
events describe the same instant.

Consumer contract (the semantic layer's replica sync; `FeedFollower` below drives it):
1. Start: `position = feed.tail()`, *then* rebuild the index from the store
   (`Store.scan(RECORD_PREFIX)`), then loop on `feed.read_after(position, block_ms=...)`.
   Taking the tail before the scan means events published during the scan are read again
   afterwards: delivery is at least once, so applying an event must be idempotent.
2. Apply each batch's events in order, then `position = batch.position`.
   - `ADD key`: read the record under `key` from the store (the feed holds no vectors); absent
     or expired means it was removed meanwhile: skip it. Otherwise index it.
   - `REMOVE key`: drop it from the index.
   - `INVALIDATE name` (`model:{m}` or `tag:{t}`, versions.py): optional early cleanup.
3. `batch.gap`: events were lost; rebuild from the store as in 1, continuing from
   `batch.position` (the tail when the gap was seen).
4. A lagging replica stays correct: every candidate is checked against the store on read
   (`ExactCache.live_entry`, the entry's recorded version and tag generations against the
   current ones), so an invalidated or removed entry is never served, only looked at.
5. Publishing is best effort after the store write succeeded: a `StoreError` from `publish`
   is counted and logged, and the entry still reaches other replicas at their next rebuild.
Every redis-py error becomes `StoreError` here. Thread-safe (redis-py's pool is); a
blocking read holds one connection for up to `block_ms`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from enum import StrEnum
from typing import Protocol

from redis.commands.core import Script

from infercache.errors import StoreError
from infercache.stores.redis_connect import (
    REDIS_ERRORS,
    SyncClient,
    split_store_url,
    sync_client,
)

START = "0-0"  # the position before any event

# KEYS: stream, epoch; ARGV: max_len, kind, key, payload. Returns the new event's id.
_PUBLISH = """
local e = redis.call('GET', KEYS[2])
if not e then
  local t = redis.call('TIME')
  e = t[1] .. string.format('%06d', tonumber(t[2]))
  redis.call('SET', KEYS[2], e)
end
return redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], e .. '-*',
                  'kind', ARGV[2], 'key', ARGV[3], 'payload', ARGV[4])
"""
# KEYS: stream; ARGV: after, count (0: bounds only). Returns {last generated id, first id,
# up to count events after}.
_SNAPSHOT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {false, false, {}} end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local last, first = false, false
for i = 1, #info, 2 do
  if info[i] == 'last-generated-id' then last = info[i + 1] end
  if info[i] == 'first-entry' and info[i + 1] then first = info[i + 1][1] end
end
if tonumber(ARGV[2]) == 0 then return {last, first, {}} end
return {last, first, redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])}
"""


class FeedKind(StrEnum):
    ADD = "add"  # a record was stored under `key`
    REMOVE = "remove"  # the record under `key` was deleted
    INVALIDATE = "invalidate"  # meta `key` changed (a model version or a tag generation)


@dataclass(frozen=True, slots=True)
class FeedEvent:
    kind: FeedKind
    key: str
    payload: bytes = b""  # small optional extra (the feed is not the store: no vectors here)


@dataclass(frozen=True, slots=True)
class FeedBatch:
    events: tuple[tuple[str, FeedEvent], ...]  # (position, event), oldest first
    position: str  # where the next read continues
    gap: bool  # events after the position asked for were lost: rebuild from the store


class Feed(Protocol):
    def publish(self, event: FeedEvent) -> str: ...

    def tail(self) -> str: ...

    def read_after(self, position: str, *, block_ms: int = 0, count: int = 1000) -> FeedBatch: ...

    def close(self) -> None: ...


def _split(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


def reached(position: str | None, target: str) -> bool:
    """Has a reader at `position` (None: not started) read up to `target`, a position of the
    same stream life? Pure."""
    return position is not None and _split(position) >= _split(target)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def lost_events(position: str, last: str | None, first: str | None) -> bool:
    """Were events after `position` lost, given the stream's last generated id and its first
    present id (None: no stream / empty stream)? Pure."""
    if position == START:
        return first is not None and _split(first)[1] > 0  # trimmed before we ever read
    if last is None:
        return True  # the stream is gone: the server was emptied
    p_ms, p_seq = _split(position)
    l_ms, l_seq = _split(last)
    if p_ms != l_ms or p_seq > l_seq:
        return True  # another stream life than the one the position belongs to
    if first is None:
        return p_seq < l_seq  # everything after the position was trimmed
    return _split(first)[1] > p_seq + 1


@dataclass(eq=False, repr=False, slots=True)
class RedisFeed:
    client: SyncClient
    _: KW_ONLY
    stream_key: str
    max_len: int = 100_000
    max_block_ms: int = 5_000
    _epoch_key: str = field(init=False)
    _publish: Script = field(init=False)
    _snapshot: Script = field(init=False)

    def __post_init__(self) -> None:
        if self.max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {self.max_len}")
        self._epoch_key = f"{self.stream_key}:epoch"
        self._publish = Script(self.client, _PUBLISH)
        self._snapshot = Script(self.client, _SNAPSHOT)

    def publish(self, event: FeedEvent) -> str:
        """Append `event`; return its position."""
        args = [self.max_len, event.kind.value, event.key, event.payload]
        try:
            return _text(self._publish(keys=[self.stream_key, self._epoch_key], args=args))
        except REDIS_ERRORS as exc:
            raise StoreError(f"feed publish: {exc}") from exc

    def tail(self) -> str:
        """The position of the last event published (START if none): read after it to get
        only what comes next."""
        try:
            last, _, _ = self._snapshot(keys=[self.stream_key], args=[START, 0])
        except REDIS_ERRORS as exc:
            raise StoreError(f"feed tail: {exc}") from exc
        return START if not last else _text(last)

    def read_after(self, position: str, *, block_ms: int = 0, count: int = 1000) -> FeedBatch:
        """Up to `count` events after `position`; waits up to `block_ms` for one if none."""
        if not 0 <= block_ms <= self.max_block_ms:
            raise ValueError(f"block_ms must be in [0, {self.max_block_ms}], got {block_ms}")
        try:
            batch = self._read(position, count)
            if batch.events or batch.gap or block_ms == 0:
                return batch
            woke = self.client.xread({self.stream_key: position}, count=1, block=block_ms)
            return self._read(position, count) if woke else batch
        except REDIS_ERRORS as exc:
            raise StoreError(f"feed read: {exc}") from exc

    def _read(self, position: str, count: int) -> FeedBatch:
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        last, first, raw = self._snapshot(keys=[self.stream_key], args=[position, count])
        last_id = _text(last) if last else None
        if lost_events(position, last_id, _text(first) if first else None):
            return FeedBatch((), last_id or START, True)
        events = tuple((_text(event_id), _event(fields)) for event_id, fields in raw)
        return FeedBatch(events, events[-1][0] if events else position, False)

    def close(self) -> None:
        self.client.close()


class FeedFollower:
    """The consumer contract above as a driver: `start()` once, then `poll()` in a loop (a
    background thread; `poll` blocks up to `block_ms`). `rebuild` reloads the whole index from
    the store; `apply` takes one event and must be idempotent. Not thread-safe: one thread
    polls. Raises `StoreError` (the caller logs it, counts it and polls again later)."""

    def __init__(
        self,
        feed: Feed,
        *,
        rebuild: Callable[[], object],
        apply: Callable[[FeedEvent], object],
    ) -> None:
        self._feed = feed
        self._rebuild = rebuild
        self._apply = apply
        self.position: str | None = None  # None until started
        self.rebuilds = 0

    def start(self) -> None:
        """The tail first, then the store: what lands in between is read again by `poll`."""
        position = self._feed.tail()
        self._rebuild()
        self.position = position
        self.rebuilds += 1

    def resume(self, position: str) -> None:
        """Start from a `tail()` taken before a rebuild the caller already made (a replica's
        start-up scan), instead of scanning the store a second time."""
        self.position = position

    def poll(self, *, block_ms: int = 0, count: int = 1000) -> int:
        """Apply what is new (waiting up to `block_ms` for it); return how many events."""
        if self.position is None:
            raise RuntimeError("FeedFollower.poll before start")
        batch = self._feed.read_after(self.position, block_ms=block_ms, count=count)
        if batch.gap:
            self._rebuild()
            self.position = batch.position
            self.rebuilds += 1
            return 0
        for position, event in batch.events:
            self._apply(event)
            self.position = position  # an `apply` that raises is retried from here
        return len(batch.events)


def _event(fields: Sequence[bytes]) -> FeedEvent:
    values = dict(zip(fields[::2], fields[1::2], strict=True))
    return FeedEvent(FeedKind(_text(values[b"kind"])), _text(values[b"key"]), values[b"payload"])


def open_feed(
    store_url: str,
    *,
    name: str = "semantic",
    max_len: int = 100_000,
    max_block_ms: int = 5_000,
    socket_timeout_s: float | None = None,
) -> RedisFeed:
    """The feed `name` beside the Redis store `store_url` names (`redis://…?prefix=P` or
    `redis+cluster://…?prefix=P`, exactly as given to `open_store`). Its client has its own
    pool, with a socket timeout above the longest blocking read (`socket_timeout_s`, when
    given, must be: a publisher that never blocks can take a short one)."""
    url, prefix = split_store_url(store_url)
    timeout_s = max_block_ms / 1000 + 2.0 if socket_timeout_s is None else socket_timeout_s
    client = sync_client(url, socket_timeout_s=timeout_s)
    return RedisFeed(
        client,
        stream_key=f"{prefix}{{feed}}{name}",
        max_len=max_len,
        max_block_ms=max_block_ms,
    )
