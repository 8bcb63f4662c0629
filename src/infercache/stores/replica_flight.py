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
Each Lua call is bounded by `FlightTimings.call_ms` (the gateway gives the store budget, at
least 250 ms; the blocking wait is bounded by its own `block_ms`). On a Redis Cluster, flights
given the cluster store's `route` (async_nodes.py) go straight to the node serving their slot,
through its per-node breaker: a flight whose key lives on a skipped node is refused at once
(`NodeUnavailableError`), and one that fails on a node counts against that node for the store
too.
A renewal that fails is retried at the next tick; one that finds another token sets
`FlightLease.lost` (this leader stalled past its lease and was presumed dead; its answer is
still published if none is there yet). All waits are awaits: nothing blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from redis.exceptions import NoScriptError

from infercache.clock import Clock
from infercache.errors import StoreError
from infercache.stores.async_nodes import AsyncNodes
from infercache.stores.cluster_nodes import ClusterNodes
from infercache.stores.redis_connect import (
    REDIS_ERRORS,
    AsyncClient,
    async_client,
    is_cluster_url,
    parse_cluster_url,
    split_store_url,
)

log = logging.getLogger(__name__)

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


class _Lua:
    """A script run by its SHA, loaded on the node that lacks it (after a restart, say)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()

    async def __call__(self, client: AsyncClient, keys: list[str], args: list[Any]) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await client.script_load(self.text)
            return await client.evalsha(self.sha, len(keys), *keys, *args)


_JOIN_LUA, _RENEW_LUA = _Lua(_JOIN), _Lua(_RENEW)
_PUBLISH_LUA, _RELEASE_LUA = _Lua(_PUBLISH), _Lua(_RELEASE)


class ReplicaFlights:
    """On `client` (one server, or any cluster client), or through `route` (a cluster store's
    nodes: async_nodes.py); exactly one of the two."""

    def __init__(
        self,
        client: AsyncClient | None = None,
        *,
        clock: Clock,
        prefix: str = "infercache:",
        timings: FlightTimings | None = None,
        mint_token: Callable[[], str] = _mint_token,
        route: AsyncNodes | None = None,
    ) -> None:
        if (client is None) == (route is None):
            raise ValueError("give ReplicaFlights a client or a route, not both or neither")
        self._client = client
        self._route = route
        self._clock = clock
        self._prefix = prefix
        self.timings = timings or FlightTimings()
        self._mint_token = mint_token

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        if self._route is not None:
            await self._route.aclose()

    def _keys(self, key: str) -> tuple[str, str, str]:
        tag = f"{self._prefix}{{fl:{key}}}"
        return f"{tag}lease", f"{tag}answer", f"{tag}wake"

    def _node(self, key: str) -> tuple[str | None, AsyncClient]:
        """(the node's name when routed, its client) for the flight `key`. Raises
        `StoreError` when the node is skipped, or the route has no slot map yet."""
        if self._route is None:
            assert self._client is not None
            return None, self._client
        return self._route(self._keys(key)[0])

    async def _run(self, node: str | None, script: _Lua, client: AsyncClient,
                   keys: list[str], args: list[Any]) -> Any:  # fmt: skip
        """One Lua call within `call_ms`; a failure on a routed node counts against it."""
        limit_s = None if self.timings.call_ms is None else self.timings.call_ms / 1000
        try:
            async with asyncio.timeout(limit_s):
                result = await script(client, keys, args)
        except (TimeoutError, *REDIS_ERRORS) as exc:
            if node is not None and self._route is not None:
                self._route.failed(node, exc)
            if isinstance(exc, TimeoutError):
                raise StoreError(f"no answer within {limit_s} s from node {node}") from exc
            raise
        if node is not None and self._route is not None:
            self._route.succeeded(node)
        return result

    async def join(self, key: str, *, timeout_s: float) -> SharedAnswer | FlightLease:
        """The answer for `key`, or the lease to fetch it. `StoreError` at the deadline or
        when Redis fails."""
        node, client = self._node(key)
        lease_key, answer_key, wake_key = self._keys(key)
        token = self._mint_token()
        deadline_s = self._clock.monotonic_s() + timeout_s
        try:
            while True:
                reply = await self._run(
                    node, _JOIN_LUA, client,
                    [lease_key, answer_key, wake_key], [token, self.timings.lease_ms],
                )  # fmt: skip
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
                await client.xread({wake_key: reply[2]}, count=1, block=block_ms)
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
                node, client = flights._node(self.key)
                held = await flights._run(
                    node, _RENEW_LUA, client, [lease_key], [self.token, flights.timings.lease_ms]
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
        try:
            node, client = flights._node(self.key)
            if answer is None:
                await flights._run(
                    node, _RELEASE_LUA, client,
                    [lease_key, wake_key], [self.token, timings.answer_ttl_ms],
                )  # fmt: skip
            else:
                ttl_ms = timings.answer_ttl_ms if answer.ok else timings.error_ttl_ms
                await flights._run(
                    node, _PUBLISH_LUA, client, [lease_key, answer_key, wake_key],
                    [self.token, answer.status, answer.body, ttl_ms, timings.answer_ttl_ms],
                )  # fmt: skip
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


def open_flights(
    store_url: str,
    *,
    clock: Clock,
    timings: FlightTimings | None = None,
    nodes: Callable[[], ClusterNodes | None] | None = None,
) -> ReplicaFlights:
    """Flights beside the Redis store `store_url` names (as given to `open_store`, with its
    `?prefix=`), on their own asyncio connections (none made until the first join). On a
    cluster, `nodes` gives the cluster store's nodes (`RedisClusterStore.connected_nodes`) to
    route through them; without it, an asyncio cluster client. Close with `aclose()`."""
    url, prefix = split_store_url(store_url)
    timings = timings or FlightTimings()
    socket_timeout_s = timings.max_block_ms / 1000 + 2.0
    if nodes is not None and is_cluster_url(url):
        route = AsyncNodes(nodes, address=parse_cluster_url(url), socket_timeout_s=socket_timeout_s)
        return ReplicaFlights(clock=clock, prefix=prefix, timings=timings, route=route)
    client = async_client(url, socket_timeout_s=socket_timeout_s)
    return ReplicaFlights(client, clock=clock, prefix=prefix, timings=timings)
