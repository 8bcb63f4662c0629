"""A Redis Cluster's nodes, each behind its own breaker: a store call goes straight to the node
serving its slot, is skipped at once while that node fails, and costs at most one round trip
(bounded by the client's socket timeout, the store budget) when the node fails.

    nodes = ClusterNodes(client, breakers, check_node=check)   # client: redis-py RedisCluster
    nodes.call(key, op)            op(the node serving key's slot, as a redis.Redis)
    nodes.each_node(keys, op)      op(node, its keys) once per node: fan-outs and snapshots;
                                   `skip_down` leaves failing nodes out instead of refusing
    nodes.each_primary(op)         op(node) on every primary: scans, stats

redis-py's `RedisCluster` is kept for its slot map (CLUSTER SLOTS) and its connection pool per
node, but not for its command path: on a failure that path rebuilds the slot map inline, sleeps
0.25 s on CLUSTERDOWN and retries (ten times by default), which is how one dead master cost
requests seconds. Here a call on a node:
- refused or reset (ConnectionError, LOADING), CLUSTERDOWN or MASTERDOWN, or a slot nobody
  serves: the node's breaker opens at once (cluster_breaker.py), the call raises
  `NodeUnavailableError` (a counted miss); a timeout counts towards opening it;
- CLUSTERDOWN "only accepts read commands", or a script's write refused "while the cluster
  is down and readonly" (`cluster-allow-reads-when-down yes`: the node answers and serves
  reads, it refused a write): `NodeUnavailableError` for this call alone, the node stays in
  use, so its keys keep hitting while the cluster is down or the node is rejoining (and the
  store guard does not hold the write against the whole store);
- MOVED (a failover or a resharding moved the slot): the slot map is patched from the answer
  and the call made once more on the new owner; ASK or TRYAGAIN (a slot being migrated): the
  call fails, a miss; both ask the watcher for a fresh slot map;
- any other Redis error: `StoreError`. Every redis-py error becomes one of the two here.

The watcher is a daemon thread that runs only while a node is open or a refresh is wanted: every
`watch_every_s` it refreshes the slot map (so a replica promoted by a failover is found), then
closes each open node that answers `CLUSTER INFO` with `cluster_state:ok`, or serves reads all
the same (an EXISTS on one of its slots answered: `cluster-allow-reads-when-down yes`, so a
restarted master serves its keys during the ~2 s Redis keeps it in `cluster_state:fail`), and
passes `check_node` (the store's check: its eviction policy). A node that left the map (a
failed-over master) is closed too: nothing routes to it. No request ever probes a dead node.

`check_node` runs before a node's first use: at connect (`check_primaries`) for every primary
that answers, raising `ConfigError` to refuse the store; for a node that did not answer, or
appeared since (a promoted replica), on its first call or when the watcher finds it back; a node
that fails it then stays open (logged once). Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    SlotNotCoveredError,
    TryAgainError,
)

from infercache.errors import ConfigError, NodeUnavailableError, StoreError
from infercache.stores.cluster_breaker import NodeBreakers
from infercache.stores.redis_connect import REDIS_ERRORS

log = logging.getLogger(__name__)

T = TypeVar("T")
_PROBE_TRIES = 4096  # keys tried for one in a node's slots (a third of them, with 3 masters)
NodeCheck = Callable[[redis.Redis, str], None]  # (node, its name): ConfigError refuses it


class ClusterNodes:
    def __init__(
        self, client: RedisCluster, breakers: NodeBreakers, *, check_node: NodeCheck
    ) -> None:
        """`breakers`: made by the caller (`NodeBreakers(clock, on_open=...)`), whose
        `on_open` must call `kick` so the watcher starts."""
        self.client = client
        self._check_node = check_node
        self.breakers = breakers
        self._checked: set[str] = set()
        self._refused: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._watcher: threading.Thread | None = None
        self._refresh_wanted = False
        self._closed = False
        if breakers.open_nodes():  # opened before this client existed (by replica flights)
            self.kick()

    # -- routing --

    def node_of(self, key: str) -> ClusterNode:
        try:
            node: ClusterNode = self.client.nodes_manager.get_node_from_slot(key_slot(key.encode()))
        except SlotNotCoveredError as exc:
            self.want_refresh()
            raise NodeUnavailableError(f"redis cluster: no node serves the slot of {key}") from exc
        return node

    def allows(self, key: str) -> bool:
        """Is the node serving `key` in use (its breaker closed)? No network."""
        try:
            return not self.breakers.is_open(self.node_of(key).name)
        except NodeUnavailableError:
            return False

    def call(self, key: str, op: Callable[[redis.Redis], T]) -> T:
        """`op` on the node serving `key`'s slot. Raises NodeUnavailableError or StoreError."""
        try:
            return self._on(self.node_of(key), op)
        except MovedError as moved:
            self.client.nodes_manager.move_slot(moved)
            self.want_refresh()
        try:
            return self._on(self.node_of(key), op)
        except MovedError as exc:
            raise StoreError(f"redis cluster: the slot of {key} keeps moving: {exc}") from exc

    def each_node(
        self,
        keys: Sequence[str],
        op: Callable[[redis.Redis, list[str]], Sequence[Any]],
        *,
        skip_down: bool = False,
    ) -> tuple[dict[str, Any], list[str]]:
        """`op(node, its keys)` → one value per key, on each node serving some of `keys`.
        Returns {key: value} and the keys left out: with `skip_down`, those of nodes that are
        skipped or fail; without, a skipped node refuses the call before anything is sent."""
        groups: dict[str, tuple[ClusterNode, list[str]]] = {}
        left_out: list[str] = []
        for key in keys:
            try:
                node = self.node_of(key)
            except NodeUnavailableError:
                if not skip_down:
                    raise
                left_out.append(key)
                continue
            groups.setdefault(node.name, (node, []))[1].append(key)
        if not skip_down:
            self._require_closed(groups)
        values: dict[str, Any] = {}
        for node, node_keys in groups.values():
            try:
                got = self._on(node, op, node_keys)
            except NodeUnavailableError:
                if not skip_down:
                    raise
                left_out.extend(node_keys)
                continue
            except MovedError as exc:
                self.want_refresh()
                raise StoreError(f"redis cluster: a slot moved during the call: {exc}") from exc
            values.update(zip(node_keys, got, strict=True))
        return values, left_out

    def primaries(self) -> list[ClusterNode]:
        return list(self.client.nodes_manager.get_nodes_by_server_type("primary"))

    def each_primary(self, op: Callable[[redis.Redis], T]) -> list[T]:
        """`op` on every primary; a skipped one refuses the call before anything is sent."""
        nodes = self.primaries()
        self._require_closed(node.name for node in nodes)
        return [self._on(node, op) for node in nodes]

    def _require_closed(self, names: Iterable[str]) -> None:
        down = sorted(name for name in names if self.breakers.is_open(name))
        if down:
            raise NodeUnavailableError(
                f"redis cluster: this call needs nodes skipped while they fail: {', '.join(down)}"
            )

    def _on(self, node: ClusterNode, op: Callable[..., T], *args: Any) -> T:
        name = node.name
        if not self.breakers.allow(name):
            raise NodeUnavailableError(f"redis cluster node {name} is skipped while it fails")
        try:
            client = self.client.get_redis_connection(node)
            if name not in self._checked:
                self._check(name, client)
            result = op(client, *args)
        except MovedError:
            raise  # the caller follows it
        except (AskError, TryAgainError) as exc:  # a slot being migrated
            self.want_refresh()
            raise StoreError(f"redis cluster node {name}: {exc}") from exc
        except redis.TimeoutError as exc:
            self.breakers.failed(name, definite=False, why=exc)
            raise NodeUnavailableError(f"redis cluster node {name}: {exc}") from exc
        except REDIS_ERRORS as exc:
            if serves_reads_only(exc):  # it answers and serves reads: only this write fails
                raise NodeUnavailableError(f"redis cluster node {name}: {exc}") from exc
            if isinstance(exc, (redis.ConnectionError, ClusterDownError)):
                self.breakers.failed(name, definite=True, why=exc)
                raise NodeUnavailableError(f"redis cluster node {name}: {exc}") from exc
            raise StoreError(f"redis cluster node {name}: {exc}") from exc
        self.breakers.succeeded(name)
        return result

    # -- checks --

    def check_primaries(self) -> list[str]:
        """At connect: check every primary that answers (`ConfigError` if one fails the
        check: the store is refused); open the others, to be checked when they answer.
        Returns the nodes opened."""
        down = []
        for node in self.primaries():
            try:
                self._check_node(self.client.get_redis_connection(node), node.name)
            except REDIS_ERRORS as exc:
                self.breakers.failed(node.name, definite=True, why=exc)
                down.append(node.name)
                continue
            self._checked.add(node.name)
        if down:
            self.kick()  # the store's `on_open` may not reach this instance yet
        return down

    def _check(self, name: str, client: redis.Redis) -> None:
        """`check_node` before a node's first use, or when it returns. A node that fails it
        stays open (logged once); a Redis error propagates."""
        try:
            self._check_node(client, name)
        except ConfigError as exc:
            if name not in self._refused:
                self._refused.add(name)
                log.error("cache store node %s refused: %s", name, exc)
            self.breakers.failed(name, definite=True, why="refused")
            raise NodeUnavailableError(str(exc)) from exc
        self._refused.discard(name)
        self._checked.add(name)

    # -- the watcher --

    def want_refresh(self) -> None:
        """Ask the watcher for a fresh slot map (soon, off the request path)."""
        self._refresh_wanted = True
        self.kick()

    def kick(self) -> None:
        """Start the watcher (if it is not running) and wake it now."""
        with self._lock:
            if self._closed:
                return
            if self._watcher is None:
                self._watcher = threading.Thread(
                    target=self._watch, name="infercache-cluster-watch", daemon=True
                )
                self._watcher.start()
        self._wake.set()

    def _watch(self) -> None:
        every_s = self.breakers.settings.watch_every_s
        while True:
            self._wake.wait(every_s)
            self._wake.clear()
            if not self._closed:
                try:
                    self.watch_once()
                except Exception:  # the watcher must outlive a surprise, or nodes stay skipped
                    log.exception("cache store cluster watcher: one round failed")
            with self._lock:
                if self._closed or not (self._refresh_wanted or self.breakers.open_nodes()):
                    self._watcher = None
                    return

    def watch_once(self) -> list[str]:
        """One round of the watcher: refresh the slot map, then close every open node that
        serves again. Returns the nodes closed."""
        self._refresh_wanted = False
        manager = self.client.nodes_manager
        try:
            manager.initialize(disconnect_startup_nodes_pools=False)
        except REDIS_ERRORS as exc:
            log.debug("cluster slot map not refreshed: %s", exc)
        closed = []
        for name in self.breakers.open_nodes():
            node = manager.get_node(node_name=name)
            if node is not None:
                try:
                    client = self.client.get_redis_connection(node)
                    # Its pooled connections died with it (or with the network): new ones,
                    # or each would fail once more on the node's first calls back.
                    client.connection_pool.disconnect()
                    if client.cluster("INFO").get("cluster_state") != "ok" and not (
                        self._reads_served(node, client)
                    ):
                        continue
                    self._check(name, client)
                except (StoreError, *REDIS_ERRORS):
                    continue
            # else: the node left the map (a master failed over): nothing routes to it
            if self.breakers.close(name):
                closed.append(name)
        return closed

    def _reads_served(self, node: ClusterNode, client: redis.Redis) -> bool:
        """Does `node`, its cluster state not ok, serve reads on its slots all the same
        (`cluster-allow-reads-when-down yes`: a master in the 2 s after its restart, or any
        master while the cluster is down)? One EXISTS of a key in a slot it serves."""
        key = self._key_on(node.name)
        if key is None:
            return False
        try:
            client.exists(key)
        except (ClusterDownError, MovedError, AskError, TryAgainError):
            return False
        return True

    def _key_on(self, name: str) -> str | None:
        """A key whose slot `name` serves in the slot map; None if it serves none."""
        slots = self.client.nodes_manager.slots_cache
        for i in range(_PROBE_TRIES):
            key = f"infercache-probe:{i}"
            owners = slots.get(key_slot(key.encode()))
            if owners and owners[0].name == name:
                return key
        return None

    def health(self) -> dict[str, Any]:
        return {
            "primaries": sorted(node.name for node in self.primaries()),
            "nodes": self.breakers.health(),
        }

    def close(self) -> None:
        with self._lock:
            self._closed = True
            watcher = self._watcher
        self._wake.set()
        if watcher is not None:
            watcher.join(5)
        self.client.close()


def serves_reads_only(exc: BaseException) -> bool:
    """Does the error say the node refused a write but serves reads (a cluster not ok with
    `cluster-allow-reads-when-down yes`)? A CLUSTERDOWN for a command, an error for a script's
    write."""
    text = str(exc)
    return "only accepts read commands" in text or "cluster is down and readonly" in text
