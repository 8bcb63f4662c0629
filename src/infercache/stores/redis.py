"""Redis store: entries and meta shared by every gateway process that points at one server.

Keys: `{prefix}e:{key}` holds `Entry.encode()` with a relative expiry (`PX`) of the entry's
remaining TTL on the injected clock, so Redis reclaims expired entries itself; `{prefix}m:{name}`
holds meta strings and counters with no expiry.

The byte bound is the server's job (`maxmemory`). Configure `maxmemory-policy volatile-lru`
(or `volatile-ttl`): only keys with an expiry, i.e. entries, may be evicted. With `allkeys-*` the
server could evict a tag generation and resurrect entries it invalidated.

Every `redis.RedisError` (connection refused, timeout, READONLY, OOM) becomes `StoreError` here.
Thread-safe: redis-py's connection pool is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import redis

from infercache.clock import Clock
from infercache.errors import StoreError
from infercache.stores.base import Entry, StoreStats


class RedisStore:
    def __init__(
        self,
        url: str,
        *,
        clock: Clock,
        prefix: str = "infercache:",
        socket_timeout_s: float = 1.0,
    ) -> None:
        self.url = url
        self._clock = clock
        self._prefix = prefix
        self._client = redis.Redis.from_url(
            url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s
        )

    def _entry_key(self, key: str) -> str:
        return f"{self._prefix}e:{key}"

    def _meta_key(self, name: str) -> str:
        return f"{self._prefix}m:{name}"

    def get(self, key: str) -> Entry | None:
        try:
            blob = self._client.get(self._entry_key(key))
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc
        if blob is None:
            return None
        assert isinstance(blob, bytes)
        return Entry.decode(blob)

    def get_with_meta(self, key: str, names: Sequence[str]) -> tuple[Entry | None, dict[str, str]]:
        try:
            pipe = self._client.pipeline(transaction=False)
            pipe.get(self._entry_key(key))
            pipe.mget([self._meta_key(n) for n in names])
            blob, values = pipe.execute()
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc
        meta = {
            n: v.decode() if isinstance(v, bytes) else str(v)
            for n, v in zip(names, values, strict=True)
            if v is not None
        }
        return (Entry.decode(blob) if isinstance(blob, bytes) else None), meta

    def put(self, key: str, entry: Entry) -> None:
        ttl_ms = int((entry.expires_at_s - self._clock.now_s()) * 1000)
        try:
            if ttl_ms <= 0:
                self._client.delete(self._entry_key(key))
            else:
                self._client.set(self._entry_key(key), entry.encode(), px=ttl_ms)
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc

    def delete(self, key: str) -> None:
        try:
            self._client.delete(self._entry_key(key))
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc

    def purge(self) -> int:
        n = 0
        try:
            batch: list[bytes] = []
            for k in self._client.scan_iter(match=f"{self._prefix}e:*", count=1000):
                batch.append(k)
                if len(batch) >= 1000:
                    n += int(self._client.unlink(*batch))
                    batch = []
            if batch:
                n += int(self._client.unlink(*batch))
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc
        return n

    def stats(self) -> StoreStats:
        """Entries under this prefix (a SCAN: O(entries)); bytes are the whole server's
        `used_memory`, since Redis cannot size one prefix without touching every key."""
        try:
            entries = sum(1 for _ in self._client.scan_iter(match=f"{self._prefix}e:*", count=1000))
            used = int(self._client.info("memory")["used_memory"])
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc
        return StoreStats(entries=entries, bytes=used, max_bytes=None)

    def scan(self, prefix: str) -> Iterator[tuple[str, Entry]]:
        head = len(self._entry_key(""))
        try:
            keys = list(self._client.scan_iter(match=f"{self._entry_key(prefix)}*", count=1000))
            for i in range(0, len(keys), 500):
                batch = keys[i : i + 500]
                for k, blob in zip(batch, self._client.mget(batch), strict=True):
                    if isinstance(blob, bytes):
                        yield k.decode()[head:], Entry.decode(blob)
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc

    def read_meta(self, names: Sequence[str]) -> dict[str, str]:
        if not names:
            return {}
        try:
            values = self._client.mget([self._meta_key(n) for n in names])
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc
        return {
            n: v.decode() if isinstance(v, bytes) else str(v)
            for n, v in zip(names, values, strict=True)
            if v is not None
        }

    def write_meta(self, name: str, value: str) -> None:
        try:
            self._client.set(self._meta_key(name), value)
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc

    def incr_meta(self, name: str) -> int:
        try:
            return int(self._client.incr(self._meta_key(name)))
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc

    def close(self) -> None:
        self._client.close()
