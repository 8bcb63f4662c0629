"""One upstream call per key across gateway replicas: a lease in Redis, the answer beside it.

    flights = open_flights(store_url, clock=clock)    # or ReplicaFlights(client, ...)
    outcome = await flights.join(key, timeout_s=60)
    if isinstance(outcome, SharedAnswer):    # another replica fetched it (or failed)
        serve outcome: `completion()` as JSON, or replayed as a stream
    else:                                    # a FlightLease: this replica fetches
        async with outcome:                  # leaving without close() hands the work over
            response = await fetch()
            await outcome.close(SharedAnswer.of_completion(response))  # or .of_error(...)

Keys of one flight share the slot of `{prefix}{fl:KEY}` (so this runs on a cluster too):
- `lease`: the leader's random token, `SET NX PX lease_ms`; renewed every lease_ms / 3 while
  it works (only while it still holds its own token);
- `answer`: a hash {status, body}, written once and kept `answer_ttl_ms` (an error only
  `error_ttl_ms`: waiters in flight get it, later arrivals try again);
- `wake`: a short stream appended to whenever the answer is published or the lease released.

`join`, one Lua call each round: an answer → return it; else `SET lease NX PX` → lead; else
wait: `XREAD BLOCK` on `wake` after its newest entry, for no longer than the lease has left.
So a waiter returns as soon as the answer is published or the leader hands over, and checks
again no later than the moment a dead leader's lease expires; then exactly one waiter's
`SET NX` wins and it leads, the others keep waiting for its answer. A waiter gives up at its
deadline (the injected clock) with `StoreError`: the caller then fetches by itself.

The answer is whole: `status` 200 and the complete chat.completion body, which a streaming
waiter replays as chunks (chat.py `chunks_from_completion`); or an error status and its
OpenAI-shaped body. Partial streams are never published: a leader whose stream was cut
publishes an error or hands over.

Failure: every redis-py error becomes `StoreError` (a caller falls back to fetching alone).
Each Lua call is bounded by `FlightTimings.call_ms` (the store budget; the blocking wait by its
own `block_ms`). On a Redis Cluster the store's per-node breakers (cluster_breaker.py) are
shared: a flight whose key lives on a node that is skipped is refused at once
(`NodeUnavailableError`), and a flight call that fails on a node opens that node's breaker for
the store too. The cluster client reads its slot map (and redis-py its command table, 50-100 ms)
in the background, at the first join and after a node failure; joins meanwhile are refused
(`StoreUnavailableError`: the caller fetches alone) rather than waiting for it.
A renewal that fails is retried at the next tick; one that finds another token sets
`FlightLease.lost` (this leader stalled past its lease and was presumed dead; its answer is
still published if none is there yet). All waits are awaits: nothing blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import redis
import redis.asyncio.cluster
from redis.commands.core import AsyncScript
from redis.crc import key_slot
from redis.exceptions import ClusterDownError, SlotNotCoveredError

from infercache.clock import Clock
from infercache.errors import NodeUnavailableError, StoreError, StoreUnavailableError
from infercache.stores.cluster_breaker import NodeBreakers
from infercache.stores.redis_connect import (
    REDIS_ERRORS,
    AsyncClient,
    async_client,
    split_store_url,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

# KEYS: lease, answer, wake; ARGV: token, lease_ms.
_JOIN = """
local a = redis.call('HMGET', KEYS[2], 'status', 'body')
if a[1] then return {'answer', a[1], a[2]} end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {'lead'} end
local newest = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
local after = '0-0'
if #newest > 0 then after = newest[1][1] end
return {'wait', redis.call('PTTL', KEYS[1]), after}
"""
# KEYS: lease; ARGV: token, lease_ms.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
# KEYS: lease, answer, wake; ARGV: token, status, body, answer_ttl_ms, wake_ttl_ms.
_PUBLISH = """
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('HSET', KEYS[2], 'status', ARGV[2], 'body', ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('XADD', KEYS[3], 'MAXLEN', 8, '*', 'why', 'answer')
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return 1
"""
# KEYS: lease, wake; ARGV: token, wake_ttl_ms.
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('XADD', KEYS[2], 'MAXLEN', 8, '*', 'why', 'released')
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""


@dataclass(frozen=True, slots=True)
class SharedAnswer:
    """A flight's outcome as other replicas receive it."""

    status: int  # 200: `body` is a whole chat.completion; otherwise an OpenAI error body
    body: bytes

    @classmethod
    def of_completion(cls, response: Mapping[str, Any]) -> SharedAnswer:
        return cls(200, orjson.dumps(response))

    @classmethod
    def of_error(cls, status: int, body: Mapping[str, Any]) -> SharedAnswer:
        if status < 400:
            raise ValueError(f"an error answer needs an error status, got {status}")
        return cls(status, orjson.dumps(body))

    @property
    def ok(self) -> bool:
        return self.status == 200

    def completion(self) -> dict[str, Any]:
        """The body as JSON (the completion, or the error body when not `ok`)."""
        value = orjson.loads(self.body)
        assert isinstance(value, dict)
        return value


@dataclass(frozen=True, slots=True)
class FlightTimings:
    lease_ms: int = 10_000  # a dead leader is replaced after at most this long
    answer_ttl_ms: int = 30_000  # how long a late joiner can still pick the answer up
    error_ttl_ms: int = 1_000
    max_block_ms: int = 5_000  # longest single XREAD (the client's socket timeout must exceed)
    call_ms: int | None = None  # one Lua call's deadline (the store budget); None: no deadline

    def __post_init__(self) -> None:
        timings = (self.lease_ms, self.answer_ttl_ms, self.error_ttl_ms, self.max_block_ms)
        if min(*timings, self.call_ms or 1) < 1:
            raise ValueError(f"every timing must be >= 1 ms: {self}")


def _mint_token() -> str:
    return secrets.token_hex(16)


class ReplicaFlights:
    def __init__(
        self,
        client: AsyncClient,
        *,
        clock: Clock,
        prefix: str = "infercache:",
        timings: FlightTimings | None = None,
        mint_token: Callable[[], str] = _mint_token,
        breakers: NodeBreakers | None = None,
    ) -> None:
        self._client = client
        self._clock = clock
        self._prefix = prefix
        self.timings = timings or FlightTimings()
        self._mint_token = mint_token
        self._cluster = client if isinstance(client, redis.asyncio.cluster.RedisCluster) else None
        self._breakers = breakers if self._cluster is not None else None
        self._connecting: asyncio.Task[Any] | None = None
        self._join = AsyncScript(client, _JOIN)
        self._renew = AsyncScript(client, _RENEW)
        self._publish = AsyncScript(client, _PUBLISH)
        self._release = AsyncScript(client, _RELEASE)

    async def aclose(self) -> None:
        await self._client.aclose()

    def _keys(self, key: str) -> tuple[str, str, str]:
        tag = f"{self._prefix}{{fl:{key}}}"
        return f"{tag}lease", f"{tag}answer", f"{tag}wake"

    def _node_of(self, redis_key: str) -> str | None:
        """The cluster node serving `redis_key`, when its breaker is to be asked."""
        if self._breakers is None:
            return None
        assert isinstance(self._client, redis.asyncio.cluster.RedisCluster)
        try:
            node = self._client.nodes_manager.get_node_from_slot(key_slot(redis_key.encode()))
        except (KeyError, SlotNotCoveredError):
            return None  # the client has not read the slot map yet: its first call does
        return str(node.name)

    async def connect(self) -> None:
        """Read the cluster's slot map now (a no-op on one server)."""
        if self._cluster is not None:
            await self._cluster.initialize()

    def _connected(self) -> bool:
        """Is the cluster client ready? If not, it connects in the background."""
        cluster = self._cluster
        if cluster is None or not getattr(cluster, "_initialize", False):
            return True
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(cluster.initialize())
            self._connecting.add_done_callback(_log_failure)
        return False

    def _admit(self, node: str | None, key: str) -> None:
        if node is not None and self._breakers is not None and not self._breakers.allow(node):
            raise NodeUnavailableError(f"replica flight {key}: node {node} is skipped")

    async def _bounded(self, node: str | None, call: Awaitable[T]) -> T:
        """One call within `call_ms`; a node failing it is held against the node."""
        limit_s = None if self.timings.call_ms is None else self.timings.call_ms / 1000
        try:
            async with asyncio.timeout(limit_s):
                result = await call
        except (TimeoutError, redis.TimeoutError) as exc:
            if node is not None and self._breakers is not None:
                self._breakers.failed(node, definite=False, why=exc or "timeout")
            raise StoreError(f"no answer within {limit_s} s from node {node}") from exc
        except (redis.ConnectionError, ClusterDownError) as exc:
            if node is not None and self._breakers is not None:
                self._breakers.failed(node, definite=True, why=exc)
            raise
        if node is not None and self._breakers is not None:
            self._breakers.succeeded(node)
        return result

    async def join(self, key: str, *, timeout_s: float) -> SharedAnswer | FlightLease:
        """The answer for `key`, or the lease to fetch it. `StoreError` at the deadline or
        when Redis fails."""
        if not self._connected():
            raise StoreUnavailableError("replica flights: reading the cluster's slot map")
        lease_key, answer_key, wake_key = self._keys(key)
        node = self._node_of(lease_key)
        self._admit(node, key)
        token = self._mint_token()
        deadline_s = self._clock.monotonic_s() + timeout_s
        try:
            while True:
                reply = await self._bounded(
                    node,
                    self._join(
                        keys=[lease_key, answer_key, wake_key],
                        args=[token, self.timings.lease_ms],
                    ),
                )
                what = reply[0].decode()
                if what == "answer":
                    return SharedAnswer(int(reply[1]), bytes(reply[2]))
                if what == "lead":
                    return FlightLease(self, key, token)
                left_ms = int((deadline_s - self._clock.monotonic_s()) * 1000)
                if left_ms <= 0:
                    raise StoreError(f"no answer for flight {key} within {timeout_s} s")
                lease_left_ms = max(int(reply[1]), 1)  # -2: expired just now; -1: impossible
                block_ms = min(lease_left_ms + 1, left_ms, self.timings.max_block_ms)
                await self._client.xread({wake_key: reply[2]}, count=1, block=block_ms)
        except REDIS_ERRORS as exc:
            raise StoreError(f"replica flight {key}: {exc}") from exc


class FlightLease:
    """This replica leads the flight for `key`: fetch, then `close` exactly once. Renews itself
    in the background until closed."""

    def __init__(self, flights: ReplicaFlights, key: str, token: str) -> None:
        self._flights = flights
        self.key = key
        self.token = token
        self.lost = asyncio.Event()  # the lease was taken over while this leader worked
        self._closed = False
        self._stop = asyncio.Event()
        self._renewer = asyncio.create_task(self._renew_until_closed())

    async def _renew_until_closed(self) -> None:
        flights = self._flights
        every_s = flights.timings.lease_ms / 3000
        lease_key = flights._keys(self.key)[0]
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), every_s)
                return
            try:
                held = await flights._bounded(
                    flights._node_of(lease_key),
                    flights._renew(keys=[lease_key], args=[self.token, flights.timings.lease_ms]),
                )
            except (StoreError, *REDIS_ERRORS) as exc:
                log.warning("could not renew the lease of flight %s: %s", self.key, exc)
                continue
            if not held:
                log.warning("flight %s: lease lost to another replica", self.key)
                self.lost.set()
                return

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self, answer: SharedAnswer | None) -> bool:
        """Publish `answer` to every waiting replica and release the lease; with None, only
        release it, so a waiter takes over at once. False (and nothing done) if already
        closed. Raises `StoreError` if Redis fails (the lease then expires by itself)."""
        if self._closed:
            return False
        self._closed = True
        self._stop.set()
        await self._renewer
        flights = self._flights
        lease_key, answer_key, wake_key = flights._keys(self.key)
        timings = flights.timings
        node = flights._node_of(lease_key)
        try:
            flights._admit(node, self.key)
            if answer is None:
                call = flights._release(
                    keys=[lease_key, wake_key], args=[self.token, timings.answer_ttl_ms]
                )
            else:
                ttl_ms = timings.answer_ttl_ms if answer.ok else timings.error_ttl_ms
                call = flights._publish(
                    keys=[lease_key, answer_key, wake_key],
                    args=[self.token, answer.status, answer.body, ttl_ms, timings.answer_ttl_ms],
                )
            await flights._bounded(node, call)
        except REDIS_ERRORS as exc:
            raise StoreError(f"replica flight {self.key}: {exc}") from exc
        return True

    async def __aenter__(self) -> FlightLease:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Leaving without `close` (an exception, a cancellation) hands the work over."""
        if not self._closed:
            try:
                await self.close(None)
            except StoreError as exc:
                log.warning("flight %s: could not hand over, it expires: %s", self.key, exc)

    def abandon(self) -> None:
        """Stop renewing without releasing: what a crashed leader leaves behind (the lease
        expires after `lease_ms`). For fault tests and shutdown."""
        self._closed = True
        self._stop.set()


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("replica flights: no slot map yet: %s", task.exception())


def open_flights(
    store_url: str,
    *,
    clock: Clock,
    timings: FlightTimings | None = None,
    breakers: NodeBreakers | None = None,
) -> ReplicaFlights:
    """Flights beside the Redis store `store_url` names (as given to `open_store`, with its
    `?prefix=`), on their own asyncio client (no connection is made until the first join);
    `breakers`: the cluster store's, to share. Close with `aclose()`."""
    url, prefix = split_store_url(store_url)
    timings = timings or FlightTimings()
    client = async_client(url, socket_timeout_s=timings.max_block_ms / 1000 + 2.0)
    return ReplicaFlights(client, clock=clock, prefix=prefix, timings=timings, breakers=breakers)
