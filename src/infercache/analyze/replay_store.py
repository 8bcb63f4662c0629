"""The replay's store: the memory store as a day's replay (replay.py) can afford it.

`CompactMemoryStore` keeps a compact copy of each answer's bytes (the buffer `orjson.dumps`
returns holds ~8 KB whatever the answer's size: bench/README.md, Analyzer) and drops an entry
once it expires, remembering its key as an 8-byte digest, so a later lookup of that key counts
the same `expired` miss the memory store would have.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Sequence
from dataclasses import replace

from infercache.clock import Clock
from infercache.stores.base import Entry
from infercache.stores.memory import MemoryStore

EXPIRED = Entry(  # what the replay store answers for a key whose entry expired and was dropped
    response=b"",
    model="",
    model_version="",
    tags=(),
    created_at_s=0.0,
    expires_at_s=0.0,
    upstream_s=0.0,
    prompt_tokens=0,
    completion_tokens=0,
)


def _digest(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class CompactMemoryStore(MemoryStore):
    """The memory store as a day's replay can afford it: each answer's bytes in an object of
    their size, and an entry dropped once it expires, its key remembered (8 bytes of digest):
    a later lookup of that key gets `EXPIRED`, an entry long expired, so the exact layer counts
    the same miss it would have. Dropping expired entries early changes no live entry, hence no
    hit: the memory store evicts every expired entry before any live one
    (tests/analyze/test_replay.py checks this against it). Under pressure the memory store may
    have evicted an expired entry already: its later miss reads `expired` here, `absent` there."""

    def __init__(self, *, max_bytes: int, clock: Clock) -> None:
        super().__init__(max_bytes=max_bytes, clock=clock)
        self._expiring: list[tuple[float, str]] = []  # (expires_at_s, key) of live entries
        self._latest: dict[str, float] = {}  # each live key's expiry, as last put
        self._expired: set[int] = set()  # digests of keys whose entry expired and was dropped
        self._clock_now = clock.now_s

    def put(self, key: str, entry: Entry) -> None:
        self._drop_expired()
        super().put(key, replace(entry, response=bytes(memoryview(entry.response))))
        heapq.heappush(self._expiring, (entry.expires_at_s, key))
        self._latest[key] = entry.expires_at_s
        self._expired.discard(_digest(key))

    def delete(self, key: str) -> None:
        super().delete(key)
        self._latest.pop(key, None)
        self._expired.discard(_digest(key))

    def get(self, key: str) -> Entry | None:
        found = super().get(key)
        return EXPIRED if found is None and _digest(key) in self._expired else found

    def get_with_meta(self, key: str, names: Sequence[str]) -> tuple[Entry | None, dict[str, str]]:
        found, meta = super().get_with_meta(key, names)
        if found is None and _digest(key) in self._expired:
            found = EXPIRED
        return found, meta

    def _drop_expired(self) -> None:
        now_s = self._clock_now()
        while self._expiring and self._expiring[0][0] <= now_s:
            expires_at_s, key = heapq.heappop(self._expiring)
            if self._latest.get(key) != expires_at_s:
                continue  # put again since, or deleted: not this entry
            del self._latest[key]
            super().delete(key)
            self._expired.add(_digest(key))
