"""Redis Cluster store (also Valkey in cluster mode): entries spread over the cluster by hash
tag, meta copied beside them so a lookup stays one round trip (bucket_meta.py has the design).

Keys, with `t = {b<i>}` and `i = crc32(key) % buckets` (64 by default: enough slots to spread
over a few dozen masters, few enough that a write to meta touches 64 small hashes):
- `{prefix}{t}e:{key}`: `Entry.encode()`, with `PX` of the entry's remaining TTL;
- `{prefix}{t}m` / `{prefix}{t}s`: the bucket's copy of meta and its sequence numbers;
- `{prefix}{b0}a`, `{prefix}{b0}layout`: the sequence allocator and the bucket count.
A lookup (`get_with_meta`) is one EVALSHA on the entry's slot: the entry and its bucket's meta.

At open the store checks every primary that answers (its `maxmemory-policy`: `allkeys-*` is
refused with `ConfigError`, redis_connect.py), records or checks the bucket count if home's node
answers, and repairs the copies of meta the live nodes hold. It does not need every master:
what did not answer is checked when it does (cluster_nodes.py: on first use, or when the
watcher finds it back; the bucket count before the first call that finds home up), and the
entries and meta on live slots are served meanwhile. A cluster with no seed reachable at open
is connected to on a later call (the store guard's breaker paces the attempts).

Failures cost hits, never seconds: every call goes straight to the node serving its slot
(cluster_nodes.py), with the store budget as socket timeout and no retries; a node that fails
is skipped at once (`NodeUnavailableError`, a counted `store_unavailable` miss) while keys on
the other nodes are served as usual, until a background watcher sees it serve again or finds
the replica that took its slots over. Calls that need every node (meta writes, scans, stats,
purge) are refused at once while one is skipped. Thread-safe.
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import KW_ONLY, InitVar, dataclass, field
from functools import partial
from typing import Any

import redis
from redis.client import Pipeline
from redis.cluster import RedisCluster

from infercache.clock import Clock
from infercache.errors import ConfigError, StoreError
from infercache.stores.base import Entry, StoreStats
from infercache.stores.bucket_meta import BucketMeta, bucket_of, bucket_tag, check_buckets
from infercache.stores.cluster_breaker import NodeBreakers, NodeBreakerSettings
from infercache.stores.cluster_nodes import ClusterNodes
from infercache.stores.redis import glob_escape
from infercache.stores.redis_connect import REDIS_ERRORS, check_cluster_node, sync_client
from infercache.urls import mask_credentials

log = logging.getLogger(__name__)

DEFAULT_BUCKETS = 64


def _mint_token() -> str:
    return secrets.token_hex(8)


@dataclass(eq=False, repr=False, slots=True)
class RedisClusterStore:
    url: str
    _: KW_ONLY
    clock: Clock
    prefix: str = "infercache:"
    buckets: int = DEFAULT_BUCKETS
    socket_timeout_s: float = 1.0
    mint_token: Callable[[], str] = _mint_token
    breaker_settings: InitVar[NodeBreakerSettings | None] = None
    breakers: NodeBreakers = field(init=False)
    _entry_re: re.Pattern[str] = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _connected: tuple[ClusterNodes, BucketMeta] | None = field(init=False, default=None)
    _layout_checked: bool = field(init=False, default=False)

    def __post_init__(self, breaker_settings: NodeBreakerSettings | None) -> None:
        if "{" in self.prefix or "}" in self.prefix:
            raise ConfigError(f"a cluster store prefix may not contain braces: {self.prefix!r}")
        check_buckets(self.buckets)
        self.breakers = NodeBreakers(self.clock, breaker_settings, on_open=self._node_opened)
        self._entry_re = re.compile(re.escape(self.prefix) + r"\{b\d+\}e:")
        try:
            self._ready()
        except StoreError as exc:
            if isinstance(exc.__cause__, ConfigError):
                self.close()
                raise exc.__cause__ from None
            log.warning("redis cluster %s unreachable at start, checked later: %s", self, exc)

    def _ready(self) -> tuple[ClusterNodes, BucketMeta]:
        """The nodes and meta, connecting on first contact; the bucket count checked once
        home's node is up (see the module docstring)."""
        connected = self._connected or self._connect()
        if not self._layout_checked:
            nodes, meta = connected
            if nodes.allows(meta.home_key()):
                try:
                    meta.ensure_layout()
                except ConfigError as exc:
                    raise StoreError(str(exc)) from exc
                self._layout_checked = True
        return connected

    def _connect(self) -> tuple[ClusterNodes, BucketMeta]:
        with self._lock:
            if self._connected is not None:
                return self._connected
            try:
                client = sync_client(self.url, socket_timeout_s=self.socket_timeout_s)
            except REDIS_ERRORS as exc:
                raise StoreError(f"redis cluster store: {exc}") from exc
            assert isinstance(client, RedisCluster)
            nodes = ClusterNodes(
                client, self.breakers, check_node=partial(_check_node, url=self.url)
            )
            try:
                down = nodes.check_primaries()
            except ConfigError as exc:
                nodes.close()
                raise StoreError(str(exc)) from exc
            if down:
                log.warning("redis cluster %s: nodes %s down at start, checked later", self, down)
            meta = BucketMeta(
                nodes, prefix=self.prefix, buckets=self.buckets, mint_token=self.mint_token
            )
            try:
                meta.repair()  # every live bucket's copy (a new store, or nodes that lost data)
            except StoreError as exc:
                log.warning("redis cluster %s: meta repair deferred: %s", self, exc)
            self._connected = nodes, meta
            return self._connected

    @property
    def nodes(self) -> ClusterNodes:
        return self._ready()[0]

    def connected_nodes(self) -> ClusterNodes | None:
        """The nodes once connected, else None; never connects (for replica flights, on an
        event loop)."""
        return None if self._connected is None else self._connected[0]

    def _node_opened(self) -> None:
        """A node's breaker opened (here, or in replica flights sharing `breakers`)."""
        if self._connected is not None:
            self._connected[0].kick()

    @property
    def meta(self) -> BucketMeta:
        return self._ready()[1]

    def _entry_key(self, key: str) -> str:
        return f"{bucket_tag(self.prefix, bucket_of(key, self.buckets))}e:{key}"

    def _on_entry(self, key: str, op: Callable[[redis.Redis, str], Any]) -> Any:
        entry_key = self._entry_key(key)
        return self._ready()[0].call(entry_key, lambda node: op(node, entry_key))

    # -- Store --

    def get(self, key: str) -> Entry | None:
        blob = self._on_entry(key, lambda node, k: node.get(k))
        return Entry.decode(blob) if isinstance(blob, bytes) else None

    def get_with_meta(self, key: str, names: Sequence[str]) -> tuple[Entry | None, dict[str, str]]:
        bucket = bucket_of(key, self.buckets)
        entry_key = f"{bucket_tag(self.prefix, bucket)}e:{key}"
        blob, meta = self._ready()[1].lookup(entry_key, bucket, names)
        return (Entry.decode(blob) if isinstance(blob, bytes) else None), meta

    def put(self, key: str, entry: Entry) -> None:
        ttl_ms = int((entry.expires_at_s - self.clock.now_s()) * 1000)
        if ttl_ms <= 0:
            self.delete(key)
            return
        blob = entry.encode()
        self._on_entry(key, lambda node, k: node.set(k, blob, px=ttl_ms))

    def delete(self, key: str) -> None:
        self._on_entry(key, lambda node, k: node.delete(k))

    def _pattern(self, key_prefix: str) -> str:
        return glob_escape(self.prefix) + "{b*}e:" + glob_escape(key_prefix) + "*"

    def _entry_keys(self, node: redis.Redis, key_prefix: str) -> list[bytes]:
        """The Redis keys of the entries on `node` whose key starts with `key_prefix`."""
        return [
            raw
            for raw in node.scan_iter(match=self._pattern(key_prefix), count=1000)
            # the glob's `*` could match more than a bucket number
            if self._entry_re.match(raw.decode())
        ]

    def purge(self) -> int:
        def purge_node(node: redis.Redis) -> int:
            keys = self._entry_keys(node, "")
            # One UNLINK per key, pipelined: a multi-key UNLINK must stay in one slot.
            return sum(int(str(n)) for n in _each_key(node, keys, _unlink))

        return sum(self.nodes.each_primary(purge_node))

    def stats(self) -> StoreStats:
        """Entries under this prefix (a SCAN of every primary); bytes are the primaries'
        summed `used_memory`."""

        def node_stats(node: redis.Redis) -> tuple[int, int]:
            return len(self._entry_keys(node, "")), int(node.info("memory")["used_memory"])

        counts = self.nodes.each_primary(node_stats)
        return StoreStats(
            entries=sum(n for n, _ in counts), bytes=sum(b for _, b in counts), max_bytes=None
        )

    def scan(self, prefix: str) -> Iterator[tuple[str, Entry]]:
        def read_node(node: redis.Redis) -> list[tuple[bytes, object]]:
            keys = self._entry_keys(node, prefix)
            return list(zip(keys, _each_key(node, keys, _get), strict=True))

        for pairs in self.nodes.each_primary(read_node):
            for raw, blob in pairs:
                head = self._entry_re.match(raw.decode())
                if head is not None and isinstance(blob, bytes):  # None: gone since the SCAN
                    yield raw.decode()[head.end() :], Entry.decode(blob)

    # -- MetaStore --

    def read_meta(self, names: Sequence[str]) -> dict[str, str]:
        if not names:
            return {}
        return self._ready()[1].read(names)

    def write_meta(self, name: str, value: str) -> None:
        self._ready()[1].write(name, value)

    def incr_meta(self, name: str) -> int:
        return self._ready()[1].incr(name)

    def epoch(self) -> str:
        return self._ready()[1].epoch()

    def health(self) -> dict[str, Any]:
        """Per node: its breaker, how often it opened, calls skipped (for /stats)."""
        return {} if self._connected is None else self._connected[0].health()

    def close(self) -> None:
        if self._connected is not None:
            self._connected[0].close()

    def __repr__(self) -> str:
        return f"RedisClusterStore({mask_credentials(self.url)!r}, prefix={self.prefix!r})"


def _check_node(node: redis.Redis, name: str, *, url: str) -> None:
    check_cluster_node(node, name, url)


def _each_key(
    node: redis.Redis, keys: Sequence[bytes], command: Callable[[Pipeline, bytes], object]
) -> list[object]:
    """`command(pipe, key)` for each key, pipelined in batches of 1000."""
    replies: list[object] = []
    for i in range(0, len(keys), 1000):
        pipe = node.pipeline(transaction=False)
        for key in keys[i : i + 1000]:
            command(pipe, key)
        replies.extend(pipe.execute())
    return replies


def _get(pipe: Pipeline, key: bytes) -> object:
    return pipe.get(key)


def _unlink(pipe: Pipeline, key: bytes) -> object:
    return pipe.unlink(key)
