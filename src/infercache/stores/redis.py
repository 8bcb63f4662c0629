"""Redis store (one server): entries and meta shared by every gateway process that points at it.

Keys: `{prefix}e:{key}` holds `Entry.encode()` with a relative expiry (`PX`) of the entry's
remaining TTL on the injected clock, so Redis reclaims expired entries itself; `{prefix}m:{name}`
holds meta strings and counters with no expiry. The lookup (`get_with_meta`) is one pipelined
round trip: GET and MGET.

The byte bound is the server's job (`maxmemory`). The server's `maxmemory-policy` must not be
`allkeys-*`, and the server must not be a node of a Redis Cluster (redis_connect.py says why;
a cluster is `redis+cluster://`, redis_cluster.py): both are checked when the store opens, which
then raises `ConfigError` (so `serve` exits with the message). A server that cannot be reached
at open is checked on the first call that reaches it; a failed check found then turns every
call into a `StoreError` (a counted miss), never an eviction-prone or MOVED-answering cache.

A server restarted empty (or flushed) loses entries and meta together, so nothing invalidated
comes back; the epoch (`EPOCH_META`, minted by `epoch()`) is lost with them, which is how a
process that keeps versions in memory notices (base.py).

Every `redis.RedisError` (connection refused, timeout, READONLY, OOM) becomes `StoreError` here.
Thread-safe: redis-py's connection pool is. For a Redis Cluster see redis_cluster.py.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterator, Sequence

import redis

from infercache.clock import Clock
from infercache.errors import ConfigError, StoreError
from infercache.stores.base import EPOCH_META, Entry, StoreStats
from infercache.stores.redis_connect import check_server
from infercache.urls import mask_credentials

log = logging.getLogger(__name__)


def _mint_token() -> str:
    return secrets.token_hex(8)


def glob_escape(text: str) -> str:
    """`text` as a literal inside a Redis SCAN MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class RedisStore:
    def __init__(
        self,
        url: str,
        *,
        clock: Clock,
        prefix: str = "infercache:",
        socket_timeout_s: float = 1.0,
        mint_token: Callable[[], str] = _mint_token,
    ) -> None:
        self.url = url
        self._clock = clock
        self._prefix = prefix
        self._mint_token = mint_token
        self._client = redis.Redis.from_url(
            url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s
        )
        self._checked = False
        try:
            self._check_server()
        except redis.RedisError as exc:
            log.warning(
                "redis store %s unreachable at start, checked later: %s", mask_credentials(url), exc
            )

    def _check_server(self) -> None:
        check_server(self._client, self.url)
        self._checked = True

    def _ready(self) -> None:
        """The deferred start-up check, on the first call that reaches the server."""
        if self._checked:
            return
        try:
            self._check_server()
        except ConfigError as exc:
            raise StoreError(str(exc)) from exc

    def _entry_key(self, key: str) -> str:
        return f"{self._prefix}e:{key}"

    def _meta_key(self, name: str) -> str:
        return f"{self._prefix}m:{name}"

    def get(self, key: str) -> Entry | None:
        try:
            self._ready()
            blob = self._client.get(self._entry_key(key))
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc
        if blob is None:
            return None
        assert isinstance(blob, bytes)
        return Entry.decode(blob)

    def get_with_meta(self, key: str, names: Sequence[str]) -> tuple[Entry | None, dict[str, str]]:
        try:
            self._ready()
            pipe = self._client.pipeline(transaction=False)
            pipe.get(self._entry_key(key))
            pipe.mget([self._meta_key(n) for n in names])
            blob, values = pipe.execute()
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc
        return (Entry.decode(blob) if isinstance(blob, bytes) else None), _meta(names, values)

    def put(self, key: str, entry: Entry) -> None:
        ttl_ms = int((entry.expires_at_s - self._clock.now_s()) * 1000)
        try:
            self._ready()
            if ttl_ms <= 0:
                self._client.delete(self._entry_key(key))
            else:
                self._client.set(self._entry_key(key), entry.encode(), px=ttl_ms)
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc

    def delete(self, key: str) -> None:
        try:
            self._ready()
            self._client.delete(self._entry_key(key))
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc

    def purge(self) -> int:
        n = 0
        try:
            self._ready()
            batch: list[bytes] = []
            for k in self._client.scan_iter(match=self._entry_pattern(""), count=1000):
                batch.append(k)
                if len(batch) >= 1000:
                    n += int(self._client.unlink(*batch))
                    batch = []
            if batch:
                n += int(self._client.unlink(*batch))
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc
        return n

    def _entry_pattern(self, key_prefix: str) -> str:
        return glob_escape(self._entry_key(key_prefix)) + "*"

    def stats(self) -> StoreStats:
        """Entries under this prefix (a SCAN: O(entries)); bytes are the whole server's
        `used_memory`, since Redis cannot size one prefix without touching every key."""
        try:
            self._ready()
            entries = sum(1 for _ in self._client.scan_iter(self._entry_pattern(""), count=1000))
            used = int(self._client.info("memory")["used_memory"])
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc
        return StoreStats(entries=entries, bytes=used, max_bytes=None)

    def scan(self, prefix: str) -> Iterator[tuple[str, Entry]]:
        head = len(self._entry_key(""))
        try:
            self._ready()
            keys = list(self._client.scan_iter(match=self._entry_pattern(prefix), count=1000))
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
            self._ready()
            values = self._client.mget([self._meta_key(n) for n in names])
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc
        return _meta(names, values)

    def write_meta(self, name: str, value: str) -> None:
        try:
            self._ready()
            self._client.set(self._meta_key(name), value)
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc

    def incr_meta(self, name: str) -> int:
        try:
            self._ready()
            return int(self._client.incr(self._meta_key(name)))
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc

    def epoch(self) -> str:
        try:
            self._ready()
            pipe = self._client.pipeline(transaction=False)
            pipe.set(self._meta_key(EPOCH_META), self._mint_token(), nx=True)
            pipe.get(self._meta_key(EPOCH_META))
            _, token = pipe.execute()
        except redis.RedisError as exc:
            raise StoreError(f"redis store: {exc}") from exc
        assert isinstance(token, bytes)
        return token.decode()

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"RedisStore({mask_credentials(self.url)!r}, prefix={self._prefix!r})"


def _meta(names: Sequence[str], values: Sequence[object]) -> dict[str, str]:
    return {
        n: v.decode() if isinstance(v, bytes) else str(v)
        for n, v in zip(names, values, strict=True)
        if v is not None
    }
