"""The asyncio door to a Redis Cluster's nodes, for replica flights: the cluster store's slot
map and per-node breakers (cluster_nodes.py), and one `redis.asyncio.Redis` per node.

    route = AsyncNodes(store.connected_nodes, address=parse_cluster_url(url), ...)
    name, client = route(redis_key)     the node serving the key's slot; NodeUnavailableError
                                        while it is skipped, StoreUnavailableError while the
                                        store has no slot map (it could not connect yet)
    route.failed(name, exc)             a call on the node failed (evidence, see below)
    route.succeeded(name)

Why not redis-py's asyncio `RedisCluster`: each time it (re)connects, at its first call and
after any node error, it reloads the server's command table (`COMMAND`: 50-100 ms of parsing
on the event loop, stalling every request the loop serves), and it retries with sleeps. Here
the store's watcher keeps the slot map fresh; a MOVED asks it for a refresh and fails the call
(a flight is an optimisation: the caller fetches alone).

A failure here is evidence, not proof, and counts like a timeout towards opening the node
(`NodeBreakers.failed(definite=False)`): a pooled connection that the node closed while it
restarted fails once; the store's own calls open a dead node at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import redis.asyncio
from redis.exceptions import ClusterDownError, MovedError

from infercache.errors import NodeUnavailableError, StoreUnavailableError
from infercache.stores.cluster_nodes import ClusterNodes, serves_reads_only
from infercache.stores.redis_connect import ClusterAddress

# What a node failing looks like (anything else is the call's own error: a bad script, say).
FAILING = (TimeoutError, redis.TimeoutError, redis.ConnectionError, ClusterDownError)


class AsyncNodes:
    def __init__(
        self,
        nodes: Callable[[], ClusterNodes | None],
        *,
        address: ClusterAddress,
        socket_timeout_s: float | None,
    ) -> None:
        self._nodes = nodes
        self._address = address
        self._socket_timeout_s = socket_timeout_s
        self._clients: dict[str, redis.asyncio.Redis] = {}

    def __call__(self, redis_key: str) -> tuple[str, redis.asyncio.Redis]:
        nodes = self._nodes()
        if nodes is None:
            raise StoreUnavailableError("the cluster store has not read the slot map yet")
        node = nodes.node_of(redis_key)
        name = str(node.name)
        if not nodes.breakers.allow(name):
            raise NodeUnavailableError(f"redis cluster node {name} is skipped while it fails")
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = redis.asyncio.Redis(
                host=node.host,
                port=node.port,
                username=self._address.username,
                password=self._address.password,
                ssl=self._address.tls,
                socket_timeout=self._socket_timeout_s,
                socket_connect_timeout=self._socket_timeout_s,
            )
        return name, client

    def failed(self, name: str, exc: BaseException) -> None:
        nodes = self._nodes()
        if nodes is None:
            return
        if isinstance(exc, MovedError):
            nodes.want_refresh()
        elif isinstance(exc, FAILING) and not serves_reads_only(exc):
            # (a node serving reads only refused this write: it is not down)
            nodes.breakers.failed(name, definite=False, why=str(exc) or "timeout")

    def succeeded(self, name: str) -> None:
        nodes = self._nodes()
        if nodes is not None:
            nodes.breakers.succeeded(name)

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(client.aclose() for client in clients))
