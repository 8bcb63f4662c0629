"""Meta on a Redis Cluster: one copy per hash-tag bucket, so a lookup reads its entry and the
meta it checks from one slot in one round trip, and invalidation stays O(1) in entries.

Why copies. An exact lookup reads its entry and the model's version token and its tags'
generations (versions.py). In a cluster one command (or one Lua script) may only touch one hash
slot. Entries are spread over `buckets` slots by hash tag: the entry `k` lives at
`{prefix}{b<i>}e:k` with `i = crc32(k) % buckets`. Keeping all meta in one slot would make every
lookup two round trips and send every lookup to one node; so every bucket holds its own copy of
all meta, in a hash `{prefix}{b<i>}m` (name → value) beside a hash `{prefix}{b<i>}s`
(name → sequence number). A lookup reads its bucket's copy with its entry (`LOOKUP`).

Writes (`write`, `incr`) — O(buckets), independent of the number of entries:
1. allocate: bucket 0 is home; `{prefix}{b0}a` holds, per name, the last sequence number
   handed out. `ALLOCATE` atomically adds 1 (concurrent writers get distinct numbers; for a
   counter the number is the value, so counters are atomic and strictly increasing).
2. fan out to buckets 1..n-1: `SET_IF_NEWER` stores (value, seq) only if seq is higher than
   the bucket's, so racing writers converge on the highest sequence everywhere and no copy
   ever goes back to an older value.
3. verify: every copy has a sequence ≥ ours (a copy lost meanwhile is written again).
4. commit bucket 0 last. `read` of meta outside a lookup reads bucket 0, so a write that failed
   half-way (a StoreError) is still seen as not done, and a retry (e.g. `set_model_version`
   with the same version) repeats it. Until a failed write is retried, buckets it reached
   and buckets it did not may disagree; both are readable only when their node is.
When a write returns, every copy holds its value: every process's next lookup sees it.

Lost copies. A node restarted empty, or flushed, loses the entries and meta copies of its
buckets together. Each copy carries a marker field, `EPOCH_META`, written only together with a
complete set of names; a read that finds no marker `repair`s that bucket first: read every
bucket's copy, take per name the value with the highest sequence, and write it (with
`SET_IF_NEWER`, and the marker) into the bucket — and into home's allocator, which may have
been lost too. So meta survives while any one node keeps its copies, and no counter restarts
below a value entries were stored under. Only when every copy is lost is a new epoch minted
(base.py: the signal that the store was emptied).

Limits: a failover to a replica that had not received the last writes loses them, as it does
on one server (Redis replication is asynchronous). Every process sharing a cluster must use
the same `buckets`; the count is recorded at `{prefix}{b0}layout` and a mismatch refused.
Thread-safe: repairs are serialised in-process; everything else is single commands/scripts.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable, Sequence

from redis.cluster import RedisCluster
from redis.commands.core import Script

from infercache.errors import ConfigError, StoreError
from infercache.stores.base import EPOCH_META

log = logging.getLogger(__name__)

_LOOKUP = """
return {redis.call('GET', KEYS[1]), redis.call('HMGET', KEYS[2], unpack(ARGV))}
"""
# KEYS: allocator, home copy; ARGV: name, marker field. -1: home has lost its copy.
_ALLOCATE = """
if redis.call('HEXISTS', KEYS[2], ARGV[2]) == 0 then return -1 end
return redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
"""
# KEYS: values, seqs; ARGV: seq, name, value. Returns the bucket's sequence afterwards.
_SET_IF_NEWER = """
local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[2]) or '0')
if tonumber(ARGV[1]) > cur then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
  return tonumber(ARGV[1])
end
return cur
"""
# KEYS: values, seqs, allocator (home) or seqs again; ARGV: marker, token, then name/seq/value
# triples. Returns the marker's value (the one already there wins).
_RESTORE = """
for i = 3, #ARGV, 3 do
  local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > cur then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  end
  if KEYS[3] ~= KEYS[2] then
    local got = tonumber(redis.call('HGET', KEYS[3], ARGV[i]) or '0')
    if tonumber(ARGV[i + 1]) > got then redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
  end
end
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
return redis.call('HGET', KEYS[1], ARGV[1])
"""


def bucket_of(key: str, buckets: int) -> int:
    """The bucket an entry key lives in. Pure."""
    return zlib.crc32(key.encode()) % buckets


def bucket_tag(prefix: str, bucket: int) -> str:
    """The key prefix, hash tag included, of everything in `bucket`. Pure."""
    return f"{prefix}{{b{bucket}}}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class BucketMeta:
    """Meta copied into every bucket of a cluster (see the module docstring). Raises
    `redis.RedisError` (the store translates it), and `StoreError` for a write that could not
    reach every copy."""

    def __init__(
        self,
        client: RedisCluster,
        *,
        prefix: str,
        buckets: int,
        mint_token: Callable[[], str],
        verify_rounds: int = 3,
    ) -> None:
        if buckets < 1:
            raise ConfigError(f"buckets must be >= 1, got {buckets}")
        self._client = client
        self.prefix = prefix
        self.buckets = buckets
        self._mint_token = mint_token
        self._verify_rounds = verify_rounds
        self._repair_lock = threading.Lock()
        self._lookup = Script(client, _LOOKUP)  # EVALSHA, loading the script on NOSCRIPT
        self._allocate = Script(client, _ALLOCATE)
        self._set_if_newer = Script(client, _SET_IF_NEWER)
        self._restore = Script(client, _RESTORE)

    # -- keys --

    def bucket_of(self, key: str) -> int:
        return bucket_of(key, self.buckets)

    def tag(self, bucket: int) -> str:
        return bucket_tag(self.prefix, bucket)

    def _values(self, bucket: int) -> str:
        return f"{self.tag(bucket)}m"

    def _seqs(self, bucket: int) -> str:
        return f"{self.tag(bucket)}s"

    def _allocator(self) -> str:
        return f"{self.tag(0)}a"

    # -- reads --

    def lookup(
        self, entry_key: str, bucket: int, names: Sequence[str]
    ) -> tuple[bytes | None, dict[str, str]]:
        """The entry at `entry_key` (in `bucket`) and the bucket's copy of `names`."""
        fields = [*names, EPOCH_META]
        keys = [entry_key, self._values(bucket)]
        blob, values = self._lookup(keys=keys, args=fields)
        if values[-1] is None:
            self.repair(bucket)
            blob, values = self._lookup(keys=keys, args=fields)
        return blob, self._named(names, values)

    def read(self, names: Sequence[str], bucket: int = 0) -> dict[str, str]:
        fields = [*names, EPOCH_META]
        values = self._client.hmget(self._values(bucket), fields)
        if values[-1] is None:
            self.repair(bucket)
            values = self._client.hmget(self._values(bucket), fields)
        return self._named(names, values)

    @staticmethod
    def _named(names: Sequence[str], values: Sequence[object]) -> dict[str, str]:
        meta = {n: _text(v) for n, v in zip(names, values, strict=False) if v is not None}
        if EPOCH_META in names:
            meta[EPOCH_META] = _text(values[-1])
        return meta

    def epoch(self) -> str:
        return self.read([EPOCH_META])[EPOCH_META]

    # -- writes --

    def write(self, name: str, value: str) -> None:
        self._replicate(name, value)

    def incr(self, name: str) -> int:
        return self._replicate(name, None)

    def _replicate(self, name: str, value: str | None) -> int:
        if name == EPOCH_META:
            raise ValueError(f"{EPOCH_META} is minted by the store, not written")
        keys, args = [self._allocator(), self._values(0)], [name, EPOCH_META]
        seq = int(self._allocate(keys=keys, args=args))
        if seq < 0:  # home lost its copy (and so maybe its allocator): rebuild both first
            self.repair(0)
            seq = int(self._allocate(keys=keys, args=args))
        text = str(seq) if value is None else value
        pending = list(range(1, self.buckets))
        for _ in range(self._verify_rounds):
            if not pending:
                break
            self._fan_out(pending, seq, name, text)
            pending = self._behind(pending, seq, name)
        if pending:
            raise StoreError(f"meta {name!r} did not reach buckets {pending}: retry the write")
        self._set_if_newer(keys=[self._values(0), self._seqs(0)], args=[seq, name, text])
        return seq

    def _fan_out(self, buckets: Sequence[int], seq: int, name: str, value: str) -> None:
        pipe = self._client.pipeline()  # type: ignore[no-untyped-call]
        for b in buckets:
            # Plain EVAL: a cluster pipeline has no script support (no `eval`, no NOSCRIPT
            # reload); writes are rare, so sending the script text costs little. The node is
            # given: otherwise redis-py asks the server for an EVAL's keys (COMMAND GETKEYS),
            # one more round trip per bucket.
            values = self._values(b)
            pipe.execute_command(
                "EVAL", _SET_IF_NEWER, 2, values, self._seqs(b), seq, name, value,
                target_nodes=self._client.get_node_from_key(values),  # type: ignore[no-untyped-call]
            )  # fmt: skip
        pipe.execute()

    def _behind(self, buckets: Sequence[int], seq: int, name: str) -> list[int]:
        pipe = self._client.pipeline()  # type: ignore[no-untyped-call]
        for b in buckets:
            pipe.hget(self._seqs(b), name)
        return [b for b, got in zip(buckets, pipe.execute(), strict=True) if int(got or 0) < seq]

    # -- repair --

    def repair(self, bucket: int | None = None) -> int:
        """Rebuild the copies that lost their marker (`bucket`'s, or every bucket's) from the
        others, and home's first if it lost its own; return how many were rebuilt."""
        with self._repair_lock:
            best, markers = self._snapshot()
            wanted = range(self.buckets) if bucket is None else (bucket,)
            targets = [b for b in wanted if b not in markers]
            if not targets:
                return 0  # another thread (or process) repaired it meanwhile
            token = markers.get(0)
            if token is None:
                candidate = next(iter(markers.values()), None) or self._mint_token()
                token = self._restore_bucket(0, best, candidate)
                if not markers:
                    log.info(
                        "no copy of the meta under %r: new epoch %s (a new store, or every "
                        "node lost its data)",
                        self.prefix,
                        token,
                    )
            for b in targets:
                if b != 0:
                    self._restore_bucket(b, best, token)
            if markers:
                log.warning("restored the meta of buckets %s from the other buckets", targets)
            return len(targets)

    def _snapshot(self) -> tuple[dict[str, tuple[int, str]], dict[int, str]]:
        """Per name, the (seq, value) with the highest seq over every copy; each bucket's
        marker, where present."""
        pipe = self._client.pipeline()  # type: ignore[no-untyped-call]
        for b in range(self.buckets):
            pipe.hgetall(self._values(b))
            pipe.hgetall(self._seqs(b))
        pipe.hgetall(self._allocator())
        replies = pipe.execute()
        best: dict[str, tuple[int, str]] = {}
        markers: dict[int, str] = {}
        for b in range(self.buckets):
            values, seqs = replies[2 * b], replies[2 * b + 1]
            for raw_name, raw_value in values.items():
                name = _text(raw_name)
                if name == EPOCH_META:
                    markers[b] = _text(raw_value)
                    continue
                seq = int(seqs.get(raw_name, 0))
                if seq > best.get(name, (0, ""))[0]:
                    best[name] = (seq, _text(raw_value))
        return best, markers

    def _restore_bucket(self, bucket: int, best: dict[str, tuple[int, str]], token: str) -> str:
        third = self._allocator() if bucket == 0 else self._seqs(bucket)
        args: list[str | int] = [EPOCH_META, token]
        for name, (seq, value) in best.items():
            args += [name, seq, value]
        keys = [self._values(bucket), self._seqs(bucket), third]
        return _text(self._restore(keys=keys, args=args))

    def ensure_layout(self) -> None:
        """Record the bucket count, or refuse one that differs from the recorded count."""
        key = f"{self.tag(0)}layout"
        mine = f"buckets={self.buckets}"
        self._client.set(key, mine, nx=True)
        recorded = _text(self._client.get(key))
        if recorded != mine:
            raise ConfigError(
                f"this cluster's infercache keys under {self.prefix!r} use {recorded}, this "
                f"process {mine}: every process sharing a cluster must use the same count"
            )
