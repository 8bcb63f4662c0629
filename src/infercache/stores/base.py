"""The seam between the cache and its storage: two small Protocols and the entry they carry.

`Store` holds entries by key; `MetaStore` holds the few shared counters and strings that make
invalidation O(1) (model versions, tag generations; see versions.py). Every backend implements
both, so processes sharing a backend share both. Backends translate their own exceptions into
`StoreError` at their boundary; the cache turns a `StoreError` into a counted miss.

Contract (tests/stores/test_contract.py runs it against every backend):
- `get` returns the entry last `put` under the key, expired or not (the cache decides freshness
  and counts `expired` misses), or None.
- A backend bounded by bytes (memory, SQLite) never holds more than `max_bytes` after a `put`
  returns: it drops expired entries first, then the least recently used. An entry larger than
  the bound is not stored.
- `incr_meta` is atomic across every process sharing the backend.
- `epoch()` names the store's life: it stays the same while the store keeps its meta, and
  changes when the meta was lost (a Redis restarted empty or flushed, a new SQLite file). The
  first call after a loss mints a new token. The token is also the meta value `EPOCH_META`, so
  a caller can read it in the same round trip as a lookup (`get_with_meta(key, [...,
  EPOCH_META])`): absent or different from the token it remembers means every model version
  and tag generation it holds in memory is void; it then calls `epoch()` and re-records them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import orjson

from infercache.errors import StoreError

EPOCH_META = "store:epoch"  # the meta name that holds `Backend.epoch()`


@dataclass(frozen=True, slots=True)
class Entry:
    response: bytes  # the response body as JSON bytes
    model: str
    model_version: str  # version token current when the request was looked up (versions.py)
    tags: tuple[tuple[str, int], ...]  # (tag, its generation when the request was looked up)
    created_at_s: float  # wall clock
    expires_at_s: float
    upstream_s: float  # how long the upstream took to produce the response
    prompt_tokens: int
    completion_tokens: int

    @property
    def size_bytes(self) -> int:
        # The body dominates; the constant covers the fixed fields and bookkeeping.
        return len(self.response) + 64 * (len(self.tags) + 1) + 128

    def header(self) -> dict[str, object]:
        """Every field but the body, as JSON-able values."""
        return {
            "model": self.model,
            "model_version": self.model_version,
            "tags": [list(t) for t in self.tags],
            "created_at_s": self.created_at_s,
            "expires_at_s": self.expires_at_s,
            "upstream_s": self.upstream_s,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }

    def encode(self) -> bytes:
        """One self-describing blob: a JSON header line, then the body."""
        return orjson.dumps(self.header()) + b"\n" + self.response

    @classmethod
    def decode(cls, blob: bytes) -> Entry:
        try:
            head, _, response = blob.partition(b"\n")
            h = orjson.loads(head)
            return cls(
                response=response,
                model=h["model"],
                model_version=h["model_version"],
                tags=tuple((str(t), int(g)) for t, g in h["tags"]),
                created_at_s=float(h["created_at_s"]),
                expires_at_s=float(h["expires_at_s"]),
                upstream_s=float(h["upstream_s"]),
                prompt_tokens=int(h["prompt_tokens"]),
                completion_tokens=int(h["completion_tokens"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"undecodable cache entry: {exc}") from exc


@dataclass(frozen=True, slots=True)
class StoreStats:
    entries: int
    bytes: int
    max_bytes: int | None  # None: bounded by the server (Redis maxmemory)


class Store(Protocol):
    def get(self, key: str) -> Entry | None: ...

    def put(self, key: str, entry: Entry) -> None: ...

    def delete(self, key: str) -> None: ...

    def purge(self) -> int:
        """Drop every entry (meta is kept); return how many were dropped."""
        ...

    def stats(self) -> StoreStats: ...

    def scan(self, prefix: str) -> Iterator[tuple[str, Entry]]:
        """Every entry whose key starts with `prefix` (to rebuild in-process indexes)."""
        ...


class MetaStore(Protocol):
    def read_meta(self, names: Sequence[str]) -> dict[str, str]:
        """Values of the names that exist."""
        ...

    def write_meta(self, name: str, value: str) -> None: ...

    def incr_meta(self, name: str) -> int:
        """Atomically add 1 to an integer (absent = 0) and return the new value."""
        ...


@runtime_checkable
class InlineReads(Protocol):
    """A backend whose reads may run on an event loop. Inside `nonblocking()`, in the calling
    thread, a call that would wait (a lock held elsewhere, a write that must sync) raises
    `StoreWouldBlockError` at once instead, and the caller retries it off the loop. Memory and
    SQLite implement it; Redis does not (every call crosses the network)."""

    def nonblocking(self) -> AbstractContextManager[None]: ...


@runtime_checkable
class InlineWrites(Protocol):
    """A backend whose writes may run on an event loop. `nonblocking_writes()` takes what the
    block's writes need without waiting, or raises `StoreWouldBlockError` on entry (before the
    block runs: the caller then runs the block off the loop); inside, in the calling thread,
    reads are non-blocking and writes never wait. Memory and SQLite implement it."""

    def nonblocking_writes(self) -> AbstractContextManager[None]: ...


@runtime_checkable
class ThreadResources(Protocol):
    """A backend that opens something per thread (SQLite's connection). `release_thread()`
    closes what the calling thread opened, before that thread ends: a short-lived thread (the
    start-up check) leaves nothing open behind it, whenever its thread state is reclaimed."""

    def release_thread(self) -> None: ...


class Backend(Store, MetaStore, Protocol):
    """What the cache needs from one backend: entries and meta, sharing one lifetime."""

    url: str

    def get_with_meta(self, key: str, names: Sequence[str]) -> tuple[Entry | None, dict[str, str]]:
        """`get(key)` and `read_meta(names)` in one round trip: the exact layer's hot path."""
        ...

    def epoch(self) -> str:
        """The token of the store's current life (minted now if the meta was lost)."""
        ...

    def close(self) -> None: ...
