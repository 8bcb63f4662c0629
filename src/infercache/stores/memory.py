"""In-process store: an LRU bounded by bytes, with expired entries evicted first.

Algorithm: an `OrderedDict` in recency order (a `get` moves the key to the end) and a min-heap of
(expires_at_s, key) with lazy deletion. When a `put` would exceed `max_bytes`, expired entries
are popped from the heap first (their TTL has passed on the injected clock), then the least
recently used entries from the front of the dict, until the new entry fits.

Invariants: `bytes_used == sum(e.size_bytes)` over held entries and `bytes_used <= max_bytes`
after every call. Thread-safe: one lock around every method. Never raises `StoreError`.
Every call holds the lock for microseconds and never waits on anything else, so `nonblocking()`
and `nonblocking_writes()` (the `InlineReads` and `InlineWrites` seams) change nothing: it may
run on an event loop as it is.
"""

from __future__ import annotations

import heapq
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from infercache.clock import Clock
from infercache.stores.base import EPOCH_META, Entry, StoreStats


class MemoryStore:
    def __init__(self, *, max_bytes: int, clock: Clock, url: str = "memory://") -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be > 0, got {max_bytes}")
        self.url = url
        self.max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._expiry_heap: list[tuple[float, str]] = []
        self._bytes_used = 0
        self._meta: dict[str, str] = {EPOCH_META: secrets.token_hex(8)}
        self.evictions = 0

    @contextmanager
    def nonblocking(self) -> Iterator[None]:
        yield

    @contextmanager
    def nonblocking_writes(self) -> Iterator[None]:
        yield

    def get(self, key: str) -> Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def get_with_meta(self, key: str, names: Sequence[str]) -> tuple[Entry | None, dict[str, str]]:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry, {n: self._meta[n] for n in names if n in self._meta}

    def put(self, key: str, entry: Entry) -> None:
        size = entry.size_bytes
        with self._lock:
            self._remove(key)
            if size > self.max_bytes:
                return
            self._make_room(size)
            self._entries[key] = entry
            self._bytes_used += size
            heapq.heappush(self._expiry_heap, (entry.expires_at_s, key))

    def delete(self, key: str) -> None:
        with self._lock:
            self._remove(key)

    def purge(self) -> int:
        with self._lock:
            n = len(self._entries)
            self._entries.clear()
            self._expiry_heap.clear()
            self._bytes_used = 0
            return n

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(len(self._entries), self._bytes_used, self.max_bytes)

    def scan(self, prefix: str) -> Iterator[tuple[str, Entry]]:
        with self._lock:
            found = [(k, e) for k, e in self._entries.items() if k.startswith(prefix)]
        return iter(found)

    def read_meta(self, names: Sequence[str]) -> dict[str, str]:
        with self._lock:
            return {n: self._meta[n] for n in names if n in self._meta}

    def write_meta(self, name: str, value: str) -> None:
        with self._lock:
            self._meta[name] = value

    def incr_meta(self, name: str) -> int:
        with self._lock:
            value = int(self._meta.get(name, "0")) + 1
            self._meta[name] = str(value)
            return value

    def epoch(self) -> str:
        with self._lock:
            return self._meta[EPOCH_META]

    def close(self) -> None:
        return None

    # -- internals (lock held) --

    def _remove(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes_used -= entry.size_bytes
            # Its heap item is left behind and skipped when popped (lazy deletion).

    def _make_room(self, size: int) -> None:
        now_s = self._clock.now_s()
        heap = self._expiry_heap
        while self._bytes_used + size > self.max_bytes and heap and heap[0][0] <= now_s:
            expires_at_s, key = heapq.heappop(heap)
            entry = self._entries.get(key)
            if entry is not None and entry.expires_at_s == expires_at_s:
                self._remove(key)
                self.evictions += 1
        while self._bytes_used + size > self.max_bytes:
            key = next(iter(self._entries))
            self._remove(key)
            self.evictions += 1
        if len(heap) > 2 * len(self._entries) + 64:
            # Too many stale heap items: rebuild so the heap stays O(entries).
            self._expiry_heap = [(e.expires_at_s, k) for k, e in self._entries.items()]
            heapq.heapify(self._expiry_heap)
