"""Redis Cluster store (also Valkey in cluster mode): entries spread over the cluster by hash
tag, meta copied beside them so a lookup stays one round trip (bucket_meta.py has the design).

Keys, with `t = {b<i>}` and `i = crc32(key) % buckets` (64 by default: enough slots to spread
over a few dozen masters, few enough that a write to meta touches 64 small hashes):
- `{prefix}{t}e:{key}`: `Entry.encode()`, with `PX` of the entry's remaining TTL;
- `{prefix}{t}m` / `{prefix}{t}s`: the bucket's copy of meta and its sequence numbers;
- `{prefix}{b0}a`, `{prefix}{b0}layout`: the sequence allocator and the bucket count.
A lookup (`get_with_meta`) is one EVALSHA on the entry's slot: the entry and its bucket's meta.

At open the store checks every primary's `maxmemory-policy` (redis_connect.py: `allkeys-*` is
refused with `ConfigError`), records or checks the bucket count, and makes sure every bucket
holds a copy of the meta. A cluster unreachable at open is connected to and checked on first
contact, as in redis.py. Every `redis.RedisError` and `RedisClusterException` (redis-py's
cluster errors do not all share one root) becomes `StoreError` here. Thread-safe.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence

from redis.cluster import RedisCluster
from redis.crc import key_slot

from infercache.clock import Clock
from infercache.errors import ConfigError, StoreError
from infercache.stores.base import Entry, StoreStats
from infercache.stores.bucket_meta import BucketMeta, bucket_of, bucket_tag
from infercache.stores.redis import glob_escape
from infercache.stores.redis_connect import (
    REDIS_ERRORS,
    eviction_policies,
    require_safe_eviction,
    sync_client,
)
from infercache.urls import mask_credentials

log = logging.getLogger(__name__)

DEFAULT_BUCKETS = 64


def _mint_token() -> str:
    return secrets.token_hex(8)


class RedisClusterStore:
    def __init__(
        self,
        url: str,
        *,
        clock: Clock,
        prefix: str = "infercache:",
        buckets: int = DEFAULT_BUCKETS,
        socket_timeout_s: float = 1.0,
        mint_token: Callable[[], str] = _mint_token,
    ) -> None:
        if "{" in prefix or "}" in prefix:
            raise ConfigError(f"a cluster store prefix may not contain braces: {prefix!r}")
        if buckets < 1:
            raise ConfigError(f"buckets must be >= 1, got {buckets}")
        self.url = url
        self._clock = clock
        self._prefix = prefix
        self._buckets = buckets
        self._socket_timeout_s = socket_timeout_s
        self._mint_token = mint_token
        self._entry_re = re.compile(re.escape(prefix) + r"\{b\d+\}e:")
        self._lock = threading.Lock()
        self._connected: tuple[RedisCluster, BucketMeta] | None = None
        self._checked = False
        try:
            self._ready()
        except StoreError as exc:
            if isinstance(exc.__cause__, ConfigError):
                raise exc.__cause__ from None
            log.warning("redis cluster %s unreachable at start, checked later: %s", self, exc)

    def _ready(self) -> tuple[RedisCluster, BucketMeta]:
        """The client and meta, connecting and checking the cluster on first contact."""
        if self._checked:
            assert self._connected is not None
            return self._connected
        with self._lock:
            try:
                if self._connected is None:
                    client = sync_client(self.url, socket_timeout_s=self._socket_timeout_s)
                    assert isinstance(client, RedisCluster)
                    meta = BucketMeta(
                        client,
                        prefix=self._prefix,
                        buckets=self._buckets,
                        mint_token=self._mint_token,
                    )
                    self._connected = client, meta
                client, meta = self._connected
                require_safe_eviction(eviction_policies(client), self.url)
                meta.ensure_layout()
                meta.repair()  # fill every bucket's copy (a new store, or nodes that lost data)
            except REDIS_ERRORS as exc:
                raise StoreError(f"redis cluster store: {exc}") from exc
            except ConfigError as exc:
                raise StoreError(str(exc)) from exc
            self._checked = True
            return self._connected

    @property
    def _client(self) -> RedisCluster:
        return self._ready()[0]

    @property
    def meta(self) -> BucketMeta:
        return self._ready()[1]

    def _entry_key(self, key: str) -> str:
        return f"{bucket_tag(self._prefix, bucket_of(key, self._buckets))}e:{key}"

    # -- Store --

    def get(self, key: str) -> Entry | None:
        try:
            blob = self._client.get(self._entry_key(key))
        except REDIS_ERRORS as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc
        return Entry.decode(blob) if isinstance(blob, bytes) else None

    def get_with_meta(self, key: str, names: Sequence[str]) -> tuple[Entry | None, dict[str, str]]:
        bucket = bucket_of(key, self._buckets)
        try:
            _, bucket_meta = self._ready()
            entry_key = f"{bucket_tag(self._prefix, bucket)}e:{key}"
            blob, meta = bucket_meta.lookup(entry_key, bucket, names)
        except REDIS_ERRORS as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc
        return (Entry.decode(blob) if isinstance(blob, bytes) else None), meta

    def put(self, key: str, entry: Entry) -> None:
        ttl_ms = int((entry.expires_at_s - self._clock.now_s()) * 1000)
        try:
            if ttl_ms <= 0:
                self._client.delete(self._entry_key(key))
            else:
                self._client.set(self._entry_key(key), entry.encode(), px=ttl_ms)
        except REDIS_ERRORS as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def delete(self, key: str) -> None:
        try:
            self._client.delete(self._entry_key(key))
        except REDIS_ERRORS as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def _entry_keys(self, key_prefix: str) -> Iterator[tuple[bytes, str]]:
        """(Redis key, entry key) of every entry whose key starts with `key_prefix`, on every
        primary."""
        pattern = glob_escape(self._prefix) + "{b*}e:" + glob_escape(key_prefix) + "*"
        for raw in self._client.scan_iter(match=pattern, count=1000):
            head = self._entry_re.match(raw.decode())
            if head is not None:  # the glob's `*` could match more than a bucket number
                yield raw, raw.decode()[head.end() :]

    def purge(self) -> int:
        n = 0
        try:
            by_slot: dict[int, list[bytes]] = defaultdict(list)
            for raw, _ in self._entry_keys(""):
                by_slot[key_slot(raw)].append(raw)
            for keys in by_slot.values():
                for i in range(0, len(keys), 1000):
                    n += int(self._client.unlink(*keys[i : i + 1000]))
        except REDIS_ERRORS as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc
        return n

    def stats(self) -> StoreStats:
        """Entries under this prefix (a SCAN of every primary); bytes are the primaries'
        summed `used_memory`."""
        try:
            entries = sum(1 for _ in self._entry_keys(""))
            infos = self._client.info("memory", target_nodes=RedisCluster.PRIMARIES)
            used = sum(int(info["used_memory"]) for info in infos.values())
        except REDIS_ERRORS as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc
        return StoreStats(entries=entries, bytes=used, max_bytes=None)

    def scan(self, prefix: str) -> Iterator[tuple[str, Entry]]:
        try:
            batch: list[tuple[bytes, str]] = []
            for pair in self._entry_keys(prefix):
                batch.append(pair)
                if len(batch) >= 1000:
                    yield from self._read_batch(batch)
                    batch = []
            yield from self._read_batch(batch)
        except REDIS_ERRORS as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def _read_batch(self, batch: list[tuple[bytes, str]]) -> Iterator[tuple[str, Entry]]:
        if not batch:
            return
        # One MGET per slot, pipelined per node.
        blobs = self._client.mget_nonatomic([raw for raw, _ in batch])
        for (_, key), blob in zip(batch, blobs, strict=True):
            if isinstance(blob, bytes):  # None: expired or deleted since the SCAN
                yield key, Entry.decode(blob)

    # -- MetaStore --

    def read_meta(self, names: Sequence[str]) -> dict[str, str]:
        if not names:
            return {}
        try:
            return self._ready()[1].read(names)
        except REDIS_ERRORS as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def write_meta(self, name: str, value: str) -> None:
        try:
            self._ready()[1].write(name, value)
        except REDIS_ERRORS as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def incr_meta(self, name: str) -> int:
        try:
            return self._ready()[1].incr(name)
        except REDIS_ERRORS as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def epoch(self) -> str:
        try:
            return self._ready()[1].epoch()
        except REDIS_ERRORS as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def close(self) -> None:
        if self._connected is not None:
            self._connected[0].close()

    def __repr__(self) -> str:
        return f"RedisClusterStore({mask_credentials(self.url)!r}, prefix={self._prefix!r})"
