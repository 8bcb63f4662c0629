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
   and buckets it did not may disagree; both are readable only when their node is. While
   home's node is skipped (no write can run then), `read` answers from the first bucket on a
   node in use, as lookups do: a gateway's start-up check and its version reads go on.
When a write returns, every copy holds its value: every process's next lookup sees it.

Lost copies. A node restarted empty, or flushed, loses the entries and meta copies of its
buckets together. Each copy carries a marker field, `EPOCH_META`, written only together with a
complete set of names; a read that finds no marker `repair`s that bucket first: read every
bucket's copy, take per name the value with the highest sequence, and write it (with
`SET_IF_NEWER`, and the marker) into the bucket — and into home's allocator, which may have
been lost too. So meta survives while any one node keeps its copies, and no counter restarts
below a value entries were stored under. Only when every copy is lost is a new epoch minted
(base.py: the signal that the store was emptied).

With a node down (its breaker open, cluster_nodes.py) a repair reads the copies it can reach:
every completed write reached every copy, so any complete copy (one with its marker) holds them
all, and a bucket is restored from the reachable ones alone. Two repairs need every node: home's
(its allocator must not go below a number handed out to a write whose copies sit on the
missing node) and one that finds no complete copy at all (a new store, or a lost one, cannot be
told apart from copies that only the missing node holds). Those wait for the node
(`NodeUnavailableError`); the buckets of live nodes go on serving meanwhile. A write needs
every node and is refused before it starts while one is skipped.

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
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import redis
from redis.commands.core import Script

from infercache.errors import ConfigError, NodeUnavailableError, StoreError
from infercache.stores.base import EPOCH_META
from infercache.stores.cluster_nodes import ClusterNodes

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


def check_buckets(buckets: int) -> None:
    """A cluster store's bucket count: at least one (ConfigError otherwise)."""
    if buckets < 1:
        raise ConfigError(f"buckets must be >= 1, got {buckets}")


def bucket_of(key: str, buckets: int) -> int:
    """The bucket an entry key lives in. Pure."""
    return zlib.crc32(key.encode()) % buckets


def bucket_tag(prefix: str, bucket: int) -> str:
    """The key prefix, hash tag included, of everything in `bucket`. Pure."""
    return f"{prefix}{{b{bucket}}}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(eq=False, repr=False, slots=True)
class BucketMeta:
    """Meta copied into every bucket of a cluster (see the module docstring). Raises
    `StoreError` (`NodeUnavailableError` when a node it needs is down, cluster_nodes.py)."""

    nodes: ClusterNodes
    _: KW_ONLY
    prefix: str
    buckets: int
    mint_token: Callable[[], str]
    verify_rounds: int = 3
    _repair_lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _lookup: Script = field(init=False)
    _allocate: Script = field(init=False)
    _set_if_newer: Script = field(init=False)
    _restore: Script = field(init=False)

    def __post_init__(self) -> None:
        check_buckets(self.buckets)
        client = self.nodes.client  # the scripts' encoder; each call names the node it runs on
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

    def home_key(self) -> str:
        """A key in home's slot (bucket 0): its node holds the allocator and the layout."""
        return self._values(0)

    # -- reads --

    def lookup(
        self, entry_key: str, bucket: int, names: Sequence[str]
    ) -> tuple[bytes | None, dict[str, str]]:
        """The entry at `entry_key` (in `bucket`) and the bucket's copy of `names`."""
        fields = [*names, EPOCH_META]
        keys = [entry_key, self._values(bucket)]

        def op(node: redis.Redis) -> Any:
            return self._lookup(keys=keys, args=fields, client=node)

        blob, values = self.nodes.call(entry_key, op)
        if values[-1] is None:
            self.repair(bucket)
            blob, values = self.nodes.call(entry_key, op)
        return blob, self._named(names, values)

    def read(self, names: Sequence[str], bucket: int | None = None) -> dict[str, str]:
        """`bucket`'s copy of `names`; without one, home's, or while home's node is skipped
        the first bucket's on a node in use (module docstring: reads outside a lookup)."""
        if bucket is not None:
            return self._read(names, bucket)
        try:
            return self._read(names, 0)
        except NodeUnavailableError:
            other = self._bucket_elsewhere()
            if other is None:
                raise
            return self._read(names, other)

    def _bucket_elsewhere(self) -> int | None:
        """The first bucket on a node in use other than home's; None if there is none."""
        try:
            home: str | None = self.nodes.node_of(self._values(0)).name
        except NodeUnavailableError:  # nobody serves home's slot
            home = None
        for b in range(1, self.buckets):
            key = self._values(b)
            if self.nodes.allows(key) and self.nodes.node_of(key).name != home:
                return b
        return None

    def _read(self, names: Sequence[str], bucket: int) -> dict[str, str]:
        fields = [*names, EPOCH_META]
        key = self._values(bucket)
        values = self.nodes.call(key, lambda node: node.hmget(key, fields))
        if values[-1] is None:
            self.repair(bucket)
            values = self.nodes.call(key, lambda node: node.hmget(key, fields))
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
        # Every node, or nothing: refused before the allocation while one is skipped.
        self.nodes.each_node([self._values(b) for b in range(self.buckets)], _nothing)
        home = self._values(0)
        keys, args = [self._allocator(), home], [name, EPOCH_META]

        def allocate(node: redis.Redis) -> int:
            return int(self._allocate(keys=keys, args=args, client=node))

        seq = self.nodes.call(home, allocate)
        if seq < 0:  # home lost its copy (and so maybe its allocator): rebuild both first
            self.repair(0)
            seq = self.nodes.call(home, allocate)
        text = str(seq) if value is None else value
        pending = list(range(1, self.buckets))
        for _ in range(self.verify_rounds):
            if not pending:
                break
            self._fan_out(pending, seq, name, text)
            pending = self._behind(pending, seq, name)
        if pending:
            raise StoreError(f"meta {name!r} did not reach buckets {pending}: retry the write")
        self.nodes.call(
            home,
            lambda node: self._set_if_newer(
                keys=[home, self._seqs(0)], args=[seq, name, text], client=node
            ),
        )
        return seq

    def _fan_out(self, buckets: Sequence[int], seq: int, name: str, value: str) -> None:
        by_key = {self._values(b): b for b in buckets}

        def op(node: redis.Redis, keys: list[str]) -> list[object]:
            pipe = node.pipeline(transaction=False)
            for key in keys:
                # Plain EVAL: a pipeline cannot reload a script on NOSCRIPT, and writes are
                # rare, so sending the script text costs little.
                pipe.eval(_SET_IF_NEWER, 2, key, self._seqs(by_key[key]), seq, name, value)
            return pipe.execute()

        self.nodes.each_node(list(by_key), op)

    def _behind(self, buckets: Sequence[int], seq: int, name: str) -> list[int]:
        by_key = {self._seqs(b): b for b in buckets}

        def op(node: redis.Redis, keys: list[str]) -> list[object]:
            pipe = node.pipeline(transaction=False)
            for key in keys:
                pipe.hget(key, name)
            return pipe.execute()

        got, _ = self.nodes.each_node(list(by_key), op)
        return [b for key, b in by_key.items() if int(got[key] or 0) < seq]

    # -- repair --

    def repair(self, bucket: int | None = None) -> int:
        """Rebuild the copies that lost their marker (`bucket`'s, or every reachable bucket's)
        from the others, and home's first if it lost its own; return how many were rebuilt.
        `NodeUnavailableError` when the repair needs a node that is down (module docstring)."""
        with self._repair_lock:
            best, markers, reached = self._snapshot()
            wanted = range(self.buckets) if bucket is None else (bucket,)
            targets = [b for b in wanted if b in reached and b not in markers]
            if not targets:
                return 0  # another thread (or process) repaired it meanwhile, or it is down
            home_lost = 0 in reached and 0 not in markers
            if (home_lost or not markers) and len(reached) < self.buckets:
                missing = sorted(set(range(self.buckets)) - reached)
                raise NodeUnavailableError(
                    f"restoring the meta of buckets {targets} waits for the nodes of buckets "
                    f"{missing}: {'home lost its copy' if home_lost else 'no complete copy'}"
                )
            token = markers.get(0)
            if home_lost:  # restored first, with its allocator
                candidate = next(iter(markers.values()), None) or self.mint_token()
                token = self._restore_bucket(0, best, candidate)
                if not markers:
                    log.info(
                        "no copy of the meta under %r: new epoch %s (a new store, or every "
                        "node lost its data)",
                        self.prefix,
                        token,
                    )
            elif token is None:  # home is down: every complete copy holds the same token
                token = next(iter(markers.values()))
            for b in targets:
                if b != 0:
                    self._restore_bucket(b, best, token)
            if markers:
                log.warning("restored the meta of buckets %s from the other buckets", targets)
            return len(targets)

    def _snapshot(self) -> tuple[dict[str, tuple[int, str]], dict[int, str], set[int]]:
        """Over every copy that can be read now: per name, the (seq, value) with the highest
        seq; each bucket's marker, where present; the buckets read."""
        by_key = {self._values(b): b for b in range(self.buckets)}

        def op(node: redis.Redis, keys: list[str]) -> list[tuple[Any, Any]]:
            pipe = node.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(key)
                pipe.hgetall(self._seqs(by_key[key]))
            replies = pipe.execute()
            return list(zip(replies[::2], replies[1::2], strict=True))

        copies, _ = self.nodes.each_node(list(by_key), op, skip_down=True)
        best: dict[str, tuple[int, str]] = {}
        markers: dict[int, str] = {}
        for key, (values, seqs) in copies.items():
            for raw_name, raw_value in values.items():
                name = _text(raw_name)
                if name == EPOCH_META:
                    markers[by_key[key]] = _text(raw_value)
                    continue
                seq = int(seqs.get(raw_name, 0))
                if seq > best.get(name, (0, ""))[0]:
                    best[name] = (seq, _text(raw_value))
        return best, markers, {by_key[key] for key in copies}

    def _restore_bucket(self, bucket: int, best: dict[str, tuple[int, str]], token: str) -> str:
        third = self._allocator() if bucket == 0 else self._seqs(bucket)
        args: list[str | int] = [EPOCH_META, token]
        for name, (seq, value) in best.items():
            args += [name, seq, value]
        keys = [self._values(bucket), self._seqs(bucket), third]
        return _text(
            self.nodes.call(keys[0], lambda node: self._restore(keys=keys, args=args, client=node))
        )

    def ensure_layout(self) -> None:
        """Record the bucket count, or refuse one that differs from the recorded count."""
        key = f"{self.tag(0)}layout"
        mine = f"buckets={self.buckets}"

        def op(node: redis.Redis) -> object:
            node.set(key, mine, nx=True)
            return node.get(key)

        recorded = _text(self.nodes.call(key, op))
        if recorded != mine:
            raise ConfigError(
                f"this cluster's infercache keys under {self.prefix!r} use {recorded}, this "
                f"process {mine}: every process sharing a cluster must use the same count"
            )


def _nothing(node: redis.Redis, keys: list[str]) -> list[None]:
    """No command: `each_node` with it only checks that every node is in use."""
    return [None] * len(keys)
