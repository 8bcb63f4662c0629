"""Cache stores behind one `Backend` Protocol, chosen by URL (see `open_store`).

base.py                the seam: `Store`, `MetaStore`, `InlineReads`/`InlineWrites`, `Entry`
memory.py              in-process, an LRU bounded by bytes
sqlite.py              the embedded default: the store (schema, bound, batched recency) over
sqlite_connections.py  its per-thread connections and non-blocking regime
redis.py               one Redis server (redis_connect.py: reaching it from a URL)
redis_cluster.py       a Redis Cluster, meta copied per hash-tag bucket (bucket_meta.py)
feed.py                the semantic replicas' change feed (a Redis Stream)
replica_flight.py      one upstream call per key across gateways (a lease in Redis)
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from infercache.clock import Clock
from infercache.errors import ConfigError
from infercache.stores.base import EPOCH_META, Backend, Entry, MetaStore, Store, StoreStats
from infercache.stores.memory import MemoryStore
from infercache.stores.sqlite import SQLiteStore

__all__ = ["EPOCH_META", "Backend", "Entry", "MetaStore", "Store", "StoreStats", "open_store"]


def open_store(
    url: str, *, clock: Clock, max_bytes: int, timeout_s: float | None = None
) -> Backend:
    """Build the backend a URL names.

    - `memory://` (optionally `memory://?max_bytes=N`): in this process only.
    - `sqlite:///relative/path.db` or `sqlite:////absolute/path.db` (SQLAlchemy's convention):
      persistent, several processes may share the file.
    - `redis://host:port/db?prefix=P` (also `rediss://`, `unix://`): shared by every process
      using the server; `prefix` namespaces the keys (default `infercache:`).
    - `redis+cluster://host:port[,host:port...]?prefix=P` (also `rediss+cluster://`): a Redis
      (or Valkey) Cluster; the nodes listed are seeds (redis_cluster.py).
    `max_bytes` bounds memory and SQLite (a URL's `max_bytes` wins); Redis is bounded by its
    own `maxmemory`. `timeout_s`, when given, bounds each call: SQLite's busy timeout, Redis'
    socket timeout (the gateway's store budget, store_guard.py); else the stores' defaults.
    """
    parsed = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parsed.query)
    if "max_bytes" in query:
        try:
            max_bytes = int(query["max_bytes"][0])
        except ValueError as exc:
            raise ConfigError(f"bad max_bytes in store URL {url!r}") from exc
    if max_bytes <= 0:
        raise ConfigError(f"store max_bytes must be > 0, got {max_bytes} ({url!r})")
    if parsed.scheme == "memory":
        return MemoryStore(max_bytes=max_bytes, clock=clock, url=url)
    if parsed.scheme == "sqlite":
        if not url.startswith("sqlite:///") or len(url) <= len("sqlite:///"):
            raise ConfigError(f"sqlite store URL must be sqlite:///PATH, got {url!r}")
        path = urllib.parse.unquote(url[len("sqlite:///") :].split("?", 1)[0])
        if timeout_s is None:
            return SQLiteStore(Path(path), max_bytes=max_bytes, clock=clock)
        return SQLiteStore(Path(path), max_bytes=max_bytes, clock=clock, busy_timeout_s=timeout_s)
    if parsed.scheme in ("redis", "rediss", "unix"):
        from infercache.stores.redis import RedisStore
        from infercache.stores.redis_connect import split_store_url

        base, prefix = split_store_url(url)
        if timeout_s is None:
            return RedisStore(base, clock=clock, prefix=prefix)
        return RedisStore(base, clock=clock, prefix=prefix, socket_timeout_s=timeout_s)
    if parsed.scheme in ("redis+cluster", "rediss+cluster"):
        from infercache.stores.redis_cluster import RedisClusterStore
        from infercache.stores.redis_connect import split_store_url

        base, prefix = split_store_url(url)
        if timeout_s is None:
            return RedisClusterStore(base, clock=clock, prefix=prefix)
        return RedisClusterStore(base, clock=clock, prefix=prefix, socket_timeout_s=timeout_s)
    raise ConfigError(
        f"unknown store URL scheme {parsed.scheme!r}: use memory://, sqlite:///PATH, "
        "redis://HOST:PORT/DB or redis+cluster://HOST:PORT[,HOST:PORT...]"
    )
