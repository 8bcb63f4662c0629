"""The shared tier: KV blocks (kv_blocks.py) in Redis, one key per block, so a replica loads a
prefix another replica computed instead of recomputing it.

Keys, under `prefix` (default `infercache:kv:`):

    {prefix}b:<name>   one block's bytes (the kv_blocks layout), with a TTL (`ttl_s`)
    {prefix}lru        sorted set: block name → last use (server time, ms)
    {prefix}sizes      hash: block name → bytes
    {prefix}bytes      the total of `sizes`

`put` is one Lua script, atomic on the server: drop from the index the blocks whose TTL has run
out (last use older than the TTL), store the block (a block already there only has its TTL and
recency refreshed), then delete least recently used blocks until the total fits `max_bytes`.
`get` is one script: GET, and on a hit, refresh the block's TTL and recency; a name indexed but
gone (Redis evicted it under `maxmemory`) leaves the index. The total is rebuilt from `sizes`
if its key was lost. Blocks of a model no longer served are never asked for again (their names
chain from its fingerprint): LRU and the TTL reclaim them.

Each call is one round trip of at most one block, so memory stays at one block in flight.
The engine's worker waits on these calls, so they are bounded: `socket_timeout_s`, and after a
failure the tier is skipped for `retry_s`, doubling up to `max_retry_s` on the injected clock (a
circuit breaker): while Redis is down, a request pays nothing for it.

What the keys hold: token ids and their K/V, from which a prompt can be read back. The engine
only ever asks for names chained from the requesting tenant's own namespace, so a tenant never
loads another's blocks; but whoever can read these keys can read the prompts: give the engine a
Redis user of its own limited to `~{prefix}*` (README, "KV tiers").
Every `redis.RedisError` becomes `KVTierError` here. Thread-safe as redis-py's pool is; the
circuit breaker has one owner (the engine's worker thread).
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from infercache.clock import Clock
from infercache.errors import KVTierError
from infercache.urls import mask_credentials

log = logging.getLogger(__name__)

# Every script: KEYS = lru, sizes, total; ARGV[1] = TTL (ms), ARGV[2] = the block key prefix.
_COMMON = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local function drop(name)
  local size = redis.call('HGET', KEYS[2], name)
  if size then
    redis.call('DECRBY', KEYS[3], size)
    redis.call('HDEL', KEYS[2], name)
  end
  redis.call('ZREM', KEYS[1], name)
end
"""

# ARGV[3] = name, ARGV[4] = value, ARGV[5] = max bytes. Returns {1 + evicted | 0, total}.
_PUT = (
    _COMMON
    + """
local key = ARGV[2] .. ARGV[3]
if redis.call('EXISTS', KEYS[3]) == 0 then
  local total = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[2])) do total = total + tonumber(v) end
  redis.call('SET', KEYS[3], total)
end
for _, name in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - ttl, 'LIMIT', 0, 256)) do
  redis.call('DEL', ARGV[2] .. name)
  drop(name)
end
if redis.call('EXISTS', key) == 1 and redis.call('ZSCORE', KEYS[1], ARGV[3]) then
  redis.call('PEXPIRE', key, ttl)
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  return {0, tonumber(redis.call('GET', KEYS[3]))}
end
drop(ARGV[3])
local size = string.len(ARGV[4])
redis.call('SET', key, ARGV[4], 'PX', ttl)
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('HSET', KEYS[2], ARGV[3], size)
local total = redis.call('INCRBY', KEYS[3], size)
local evicted = 0
while total > tonumber(ARGV[5]) do
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0)
  if #oldest == 0 then break end
  redis.call('DEL', ARGV[2] .. oldest[1])
  drop(oldest[1])
  evicted = evicted + 1
  total = tonumber(redis.call('GET', KEYS[3]))
end
return {1 + evicted, total}
"""
)

# ARGV[3] = name. Returns the block's bytes, or false.
_GET = (
    _COMMON
    + """
local key = ARGV[2] .. ARGV[3]
local v = redis.call('GET', key)
if v then
  redis.call('PEXPIRE', key, ttl)
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  return v
end
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then drop(ARGV[3]) end
return false
"""
)

# ARGV[3] = name. Deletes the block (one that failed verification).
_DISCARD = (
    _COMMON
    + """
redis.call('DEL', ARGV[2] .. ARGV[3])
drop(ARGV[3])
return 1
"""
)

# ARGV[3..] = names. Refreshes the TTL and recency of those present; returns 1/0 for each.
_TOUCH = (
    _COMMON
    + """
local out = {}
for i = 3, #ARGV do
  if redis.call('PEXPIRE', ARGV[2] .. ARGV[i], ttl) == 1 then
    redis.call('ZADD', KEYS[1], now, ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
"""
)


class SharedTier:
    def __init__(
        self,
        url: str,
        *,
        max_bytes: int,
        ttl_s: float,
        clock: Clock,
        prefix: str = "infercache:kv:",
        socket_timeout_s: float = 0.5,
        retry_s: float = 1.0,
        max_retry_s: float = 30.0,
    ) -> None:
        if max_bytes < 0 or ttl_s <= 0:
            raise ValueError(f"need max_bytes >= 0 and ttl_s > 0, got {max_bytes}, {ttl_s}")
        self.url = mask_credentials(url)
        self.max_bytes = max_bytes
        self.ttl_ms = int(ttl_s * 1000)
        self._clock = clock
        self._keys = (f"{prefix}lru", f"{prefix}sizes", f"{prefix}bytes")
        self._blocks = f"{prefix}b:"
        self._client = redis.Redis.from_url(
            url, socket_timeout=socket_timeout_s, socket_connect_timeout=socket_timeout_s
        )
        self._put = self._client.register_script(_PUT)
        self._get = self._client.register_script(_GET)
        self._touch = self._client.register_script(_TOUCH)
        self._discard = self._client.register_script(_DISCARD)
        self._retry_s = retry_s
        self._max_retry_s = max_retry_s
        self._failures = 0
        self._closed_until_s: float | None = None
        self.used_bytes: int | None = None  # as of the last put
        self.evicted_blocks = 0

    @property
    def available(self) -> bool:
        """False while skipped after a failure (the circuit breaker is open)."""
        until = self._closed_until_s
        return until is None or self._clock.monotonic_s() >= until

    def state(self) -> str:
        return "ok" if self._failures == 0 else "failing" if not self.available else "retrying"

    def get(self, name: str) -> bytes | None:
        """Block `name`'s bytes, or None when absent. Raises KVTierError."""
        value = self._call(self._get, [name])
        return value if isinstance(value, bytes) else None

    def touch(self, names: list[str]) -> list[bool]:
        """Which of `names` are stored (those have their TTL and recency refreshed). Raises
        KVTierError."""
        if not names:
            return []
        return [bool(x) for x in self._call(self._touch, names)]

    def put(self, name: str, value: bytes) -> bool:
        """Store block `name` (False: it was there already, or exceeds the budget). Raises
        KVTierError."""
        if len(value) > self.max_bytes:
            return False
        stored, total = self._call(self._put, [name, value, self.max_bytes])
        self.used_bytes = int(total)
        if stored:
            self.evicted_blocks += int(stored) - 1
        return bool(stored)

    def discard(self, name: str) -> None:
        """Delete block `name` (it failed verification). Raises KVTierError."""
        self._call(self._discard, [name])

    def _call(self, script: Any, args: list[Any]) -> Any:
        if not self.available:
            raise KVTierError(f"shared KV tier {self.url} skipped after a failure")
        try:
            result = script(keys=list(self._keys), args=[self.ttl_ms, self._blocks, *args])
        except redis.RedisError as e:
            self._failed(e)
            raise KVTierError(f"shared KV tier {self.url}: {e}") from e
        if self._failures:
            log.warning("shared KV tier %s answers again", self.url)
        self._failures = 0
        self._closed_until_s = None
        return result

    def _failed(self, error: Exception) -> None:
        self._failures += 1
        wait_s = min(self._retry_s * 2 ** (self._failures - 1), self._max_retry_s)
        self._closed_until_s = self._clock.monotonic_s() + wait_s
        log.warning("shared KV tier %s failed (%s); skipped for %.1f s", self.url, error, wait_s)

    def close(self) -> None:
        self._client.close()
