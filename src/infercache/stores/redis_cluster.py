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
holds a copy of the meta. A cluster unreachable at open is checked on first contact, as in
redis.py. Every `redis.RedisError` becomes `StoreError` here. Thread-safe.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence

import redis
from redis.cluster import RedisCluster
from redis.crc import key_slot

from infercache.clock import Clock
from infercache.errors import ConfigError, StoreError
from infercache.stores.base import Entry, StoreStats
from infercache.stores.bucket_meta import BucketMeta
from infercache.stores.redis import glob_escape
from infercache.stores.redis_connect import (
    eviction_policies,
    masked_url,
    require_safe_eviction,
    sync_client,
)

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
        self.url = url
        self._clock = clock
        self._prefix = prefix
        client = sync_client(url, socket_timeout_s=socket_timeout_s)
        assert isinstance(client, RedisCluster)
        self._client = client
        self.meta = BucketMeta(client, prefix=prefix, buckets=buckets, mint_token=mint_token)
        self._entry_re = re.compile(re.escape(prefix) + r"\{b\d+\}e:")
        self._checked = False
        try:
            self._check_cluster()
        except redis.RedisError as exc:
            log.warning("redis cluster %s unreachable at start, checked later: %s", self, exc)

    def _check_cluster(self) -> None:
        require_safe_eviction(eviction_policies(self._client), self.url)
        self.meta.ensure_layout()
        self.meta.repair()  # fill every bucket's copy (a new store, or nodes that lost data)
        self._checked = True

    def _ready(self) -> None:
        if self._checked:
            return
        try:
            self._check_cluster()
        except ConfigError as exc:
            raise StoreError(str(exc)) from exc

    def _entry_key(self, key: str) -> str:
        return f"{self.meta.tag(self.meta.bucket_of(key))}e:{key}"

    # -- Store --

    def get(self, key: str) -> Entry | None:
        try:
            self._ready()
            blob = self._client.get(self._entry_key(key))
        except redis.RedisError as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc
        return Entry.decode(blob) if isinstance(blob, bytes) else None

    def get_with_meta(self, key: str, names: Sequence[str]) -> tuple[Entry | None, dict[str, str]]:
        bucket = self.meta.bucket_of(key)
        try:
            self._ready()
            blob, meta = self.meta.lookup(f"{self.meta.tag(bucket)}e:{key}", bucket, names)
        except redis.RedisError as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc
        return (Entry.decode(blob) if isinstance(blob, bytes) else None), meta

    def put(self, key: str, entry: Entry) -> None:
        ttl_ms = int((entry.expires_at_s - self._clock.now_s()) * 1000)
        try:
            self._ready()
            if ttl_ms <= 0:
                self._client.delete(self._entry_key(key))
            else:
                self._client.set(self._entry_key(key), entry.encode(), px=ttl_ms)
        except redis.RedisError as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def delete(self, key: str) -> None:
        try:
            self._ready()
            self._client.delete(self._entry_key(key))
        except redis.RedisError as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def _entry_keys(self, key_prefix: str) -> Iterator[bytes]:
        """Every entry key (raw) whose entry key starts with `key_prefix`, on every primary."""
        pattern = glob_escape(self._prefix) + "{b*}e:" + glob_escape(key_prefix) + "*"
        for raw in self._client.scan_iter(match=pattern, count=1000):
            if self._entry_re.match(raw.decode()):
                yield raw

    def purge(self) -> int:
        n = 0
        try:
            self._ready()
            by_slot: dict[int, list[bytes]] = defaultdict(list)
            for raw in self._entry_keys(""):
                by_slot[key_slot(raw)].append(raw)
            for keys in by_slot.values():
                for i in range(0, len(keys), 1000):
                    n += int(self._client.unlink(*keys[i : i + 1000]))
        except redis.RedisError as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc
        return n

    def stats(self) -> StoreStats:
        """Entries under this prefix (a SCAN of every primary); bytes are the primaries'
        summed `used_memory`."""
        try:
            self._ready()
            entries = sum(1 for _ in self._entry_keys(""))
            infos = self._client.info("memory", target_nodes=RedisCluster.PRIMARIES)
            used = sum(int(info["used_memory"]) for info in infos.values())
        except redis.RedisError as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc
        return StoreStats(entries=entries, bytes=used, max_bytes=None)

    def scan(self, prefix: str) -> Iterator[tuple[str, Entry]]:
        try:
            self._ready()
            batch: list[bytes] = []
            for raw in self._entry_keys(prefix):
                batch.append(raw)
                if len(batch) >= 1000:
                    yield from self._read_batch(batch)
                    batch = []
            yield from self._read_batch(batch)
        except redis.RedisError as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def _read_batch(self, keys: list[bytes]) -> Iterator[tuple[str, Entry]]:
        if not keys:
            return
        # One MGET per slot, pipelined per node.
        for raw, blob in zip(keys, self._client.mget_nonatomic(keys), strict=True):
            if isinstance(blob, bytes):
                yield self._key_of(raw.decode()), Entry.decode(blob)

    def _key_of(self, entry_key: str) -> str:
        head = self._entry_re.match(entry_key)
        assert head is not None  # _entry_keys yields only matching keys
        return entry_key[head.end() :]

    # -- MetaStore --

    def read_meta(self, names: Sequence[str]) -> dict[str, str]:
        if not names:
            return {}
        try:
            self._ready()
            return self.meta.read(names)
        except redis.RedisError as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def write_meta(self, name: str, value: str) -> None:
        try:
            self._ready()
            self.meta.write(name, value)
        except redis.RedisError as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def incr_meta(self, name: str) -> int:
        try:
            self._ready()
            return self.meta.incr(name)
        except redis.RedisError as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def epoch(self) -> str:
        try:
            self._ready()
            return self.meta.epoch()
        except redis.RedisError as exc:
            raise StoreError(f"redis cluster store: {exc}") from exc

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"RedisClusterStore({masked_url(self.url)!r}, prefix={self._prefix!r})"
