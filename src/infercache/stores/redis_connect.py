"""Reaching Redis from a store URL, and the one thing infercache requires of the server.

URLs (the same for Valkey, which speaks the same protocol):
- `redis://[user:pass@]host:port/db`, `rediss://…` (TLS), `unix:///path.sock`: one server,
  through `redis.Redis.from_url`.
- `redis+cluster://[user:pass@]host:port[,host:port…]`, `rediss+cluster://…` (TLS): a Redis
  Cluster through redis-py's cluster client. The listed nodes are seeds; the client discovers
  the others and follows MOVED/ASK redirections. A cluster has no databases: no `/db`.

Eviction policy. Meta (model versions, tag generations, the store epoch) is stored with no
expiry, entries with one. Under `volatile-*` or `noeviction` the server can only evict entries,
which costs hits. Under `allkeys-*` it may evict a tag's generation counter: the counter reads
as absent (0) again, and every entry stored under generation 0 before the invalidation becomes
reachable again. `require_safe_eviction` refuses that configuration at start-up; it reads
`INFO memory` (allowed where managed services rename CONFIG) on every primary.

A `redis://` URL naming a node of a cluster is refused too (`refuse_cluster_node`): such a node
answers MOVED for every key another node holds, so the store would start "ready" and cache
almost nothing.

Cluster clients make no retries of their own (redis-py's default is ten, each after a
re-read of the slot map or a 0.25 s sleep): a failing node costs a call one round trip, and the
store skips it from then on (cluster_nodes.py).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from infercache.errors import ConfigError
from infercache.urls import mask_credentials

SyncClient = redis.Redis | RedisCluster
# What redis-py raises: its cluster errors do not all derive from RedisError (an unreachable
# cluster at connect is a bare RedisClusterException).
REDIS_ERRORS = (redis.RedisError, RedisClusterException)
AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

SINGLE_SCHEMES = ("redis", "rediss", "unix")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


@dataclass(frozen=True, slots=True)
class ClusterAddress:
    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    tls: bool


def scheme_of(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def is_cluster_url(url: str) -> bool:
    return scheme_of(url) in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> ClusterAddress:
    """`redis+cluster://[user:pass@]h1:p1,h2:p2[?…]` → its seed nodes and credentials."""
    scheme = scheme_of(url)
    if scheme not in CLUSTER_SCHEMES:
        raise ConfigError(f"not a cluster URL: {mask_credentials(url)!r}")
    rest = url.split("://", 1)[1].split("?", 1)[0]
    netloc, _, path = rest.partition("/")
    if path.strip("/") not in ("", "0"):
        raise ConfigError(
            f"a Redis Cluster has no databases: drop /{path} from {mask_credentials(url)!r}"
        )
    userinfo, _, hosts = netloc.rpartition("@")
    username: str | None = None
    password: str | None = None
    if userinfo:
        user, sep, secret = userinfo.partition(":")
        username = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(secret) if sep else None
    nodes = []
    for part in hosts.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(
                f"cluster node {part!r} is not host:port in {mask_credentials(url)!r}"
            )
        nodes.append((host.strip("[]"), int(port)))
    return ClusterAddress(tuple(nodes), username, password, scheme == "rediss+cluster")


def split_store_url(url: str) -> tuple[str, str]:
    """A Redis store URL → (the server or cluster URL, the key prefix from `?prefix=`,
    default `infercache:`), as `open_store` reads it."""
    parsed = urllib.parse.urlsplit(url)
    prefix = urllib.parse.parse_qs(parsed.query).get("prefix", ["infercache:"])[0]
    return urllib.parse.urlunsplit(parsed._replace(query="")), prefix


def is_redis_url(url: str) -> bool:
    """Does a store URL name Redis (one server or a cluster), i.e. can replicas share it?"""
    return scheme_of(url) in SINGLE_SCHEMES + CLUSTER_SCHEMES


def sync_client(url: str, *, socket_timeout_s: float | None) -> SyncClient:
    """A client for the server or cluster `url` names. One server: no connection is made yet;
    a cluster: the slot map is read from the first seed that answers (RedisClusterException
    when none does)."""
    if is_cluster_url(url):
        address = parse_cluster_url(url)
        return RedisCluster(
            startup_nodes=[
                ClusterNode(h, p)  # type: ignore[no-untyped-call]
                for h, p in address.nodes
            ],
            username=address.username,
            password=address.password,
            ssl=address.tls,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            retry=Retry(NoBackoff(), 0),
            require_full_coverage=False,  # a slot nobody serves fails alone, not the client
        )
    return redis.Redis.from_url(
        url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s
    )


def async_client(url: str, *, socket_timeout_s: float | None) -> AsyncClient:
    """The asyncio twin of `sync_client`."""
    if is_cluster_url(url):
        address = parse_cluster_url(url)
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in address.nodes],
            username=address.username,
            password=address.password,
            ssl=address.tls,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            retry=redis.asyncio.retry.Retry(NoBackoff(), 0),
            require_full_coverage=False,
        )
    return redis.asyncio.Redis.from_url(
        url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s
    )


def check_server(client: redis.Redis, url: str) -> None:
    """What a one-server store checks at start: not a cluster node, and a safe eviction
    policy. `ConfigError` names the fix; raises `redis.RedisError` when unreachable."""
    refuse_cluster_node(client, url)
    require_safe_eviction({"server": _policy(client)}, url)


def check_cluster_node(client: redis.Redis, node: str, url: str) -> None:
    """What a cluster store checks of each node before using it: a safe eviction policy."""
    require_safe_eviction({node: _policy(client)}, url)


def _policy(client: redis.Redis) -> str:
    return str(client.info("memory").get("maxmemory_policy", ""))


def refuse_cluster_node(client: redis.Redis, url: str) -> None:
    """Refuse a `redis://` URL that names a node of a Redis Cluster (see the module
    docstring), with the URL to use instead."""
    if int(client.info("cluster").get("cluster_enabled", 0) or 0) != 1:
        return
    parsed = urllib.parse.urlsplit(url)
    scheme = "rediss+cluster" if parsed.scheme == "rediss" else "redis+cluster"
    hint = mask_credentials(f"{scheme}://{parsed.netloc or 'HOST:PORT'}")
    raise ConfigError(
        f"refusing the Redis store {mask_credentials(url)!r}: that server is a node of a Redis "
        "Cluster, which answers MOVED for every key another node holds, so almost nothing "
        f"would be cached. Name the cluster instead: --store {hint}[,HOST:PORT...]"
    )


def require_safe_eviction(policies: Mapping[str, str], url: str) -> None:
    """Refuse a server that may evict keys without an expiry (see the module docstring)."""
    unsafe = {node: p for node, p in policies.items() if p.startswith("allkeys-")}
    if unsafe:
        shown = ", ".join(f"{node}: {p}" for node, p in sorted(unsafe.items()))
        raise ConfigError(
            f"refusing the Redis store {mask_credentials(url)!r}: maxmemory-policy is {shown}. "
            "Under allkeys-* Redis may evict the invalidation counters (model versions, tag "
            "generations), which brings invalidated entries back. Set maxmemory-policy to "
            "volatile-lru, volatile-ttl or noeviction."
        )
