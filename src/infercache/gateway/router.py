"""Cache-aware routing across several upstream replicas: send a request where its prefix is warm,
unless that replica is far busier than another.

Each replica keeps its own KV prefix cache, so a conversation's next turn, or a question under a
shared system prompt, is fastest on the replica that served the prefix before. The router keeps,
per replica, an approximate picture of what it has seen: a bounded LRU set of prefix-block
hashes. A prompt (tenant + the serialised messages) is cut into `block_chars`-character blocks
and hashed as a chain (block i's hash covers blocks 0..i, as in nano-vllm's block manager), so a
replica "has" block i only if it saw that exact prefix.

Load. A replica's load is the larger of the requests this router has in flight on it (`lease`
owns that count) and what the replica itself last reported on its `/metrics` (requests running
+ waiting, read in the background by replica_load.py), while that report is fresher than
`load_stale_s`: the replica's own figure also counts other gateways' requests. A report that
could not be read is "unknown": the router's own count stands alone.

Route: for each replica, count the leading blocks of the prompt it has seen (its match). The
warm replica is the one with the longest match; among equal matches, the least loaded. The
least-loaded replica is the one with the lowest load, then the lowest reported KV usage, then
the fewest requests routed to it so far (so new prefixes spread over the replicas instead of
piling onto the first, and the totals stay even). The request goes to the warm replica when
its match covers at least `min_match_blocks` and the two are not imbalanced; otherwise to the
least-loaded one. The imbalance rule is SGLang's (its router switches to the shortest queue
when max - min > 64 and max > 1.5 x min), applied to the pair: warm load - least load >
`imbalance_abs` and warm load > `imbalance_rel` x least load. Then the prompt's blocks are
recorded for the chosen replica, evicting its least recently routed blocks past
`max_blocks_per_replica`.

Thresholds, tuned on bench/routing.py (bench/README.md, "Routing"):
- `block_chars` 64: about 16 tokens, llm-d's prefix-block size.
- `min_match_blocks` 4: 256 characters, so a common opening ("You are a helpful assistant")
  is no reason to go anywhere.
- `imbalance_abs` 8 requests, `imbalance_rel` 1.5: a replica batches its requests (the
  built-in engine runs 16 together), so a few more in flight on the warm one cost it little,
  while sending a conversation elsewhere recomputes its whole prefix. On the bench (3 engines,
  6 concurrent clients) a gap of 4 kept 94.5% of the oracle's cached tokens, 8 kept 96.5%;
  both kept the request counts within 1.3x. SGLang's 64 suits GPUs running hundreds.
- `load_poll_s` 1.0, `load_stale_s` 3.0: a report older than three polls is unknown.

In-flight accounting has one owner: `lease(tenant, body)` routes and counts the request on its
replica until the `with` block ends, however it ends.

A shared KV tier (the built-in engine's `--kv-shared-url`: every replica that reports one on
its `/metrics` is assumed to share the same Redis) makes a prefix warm anywhere: a replica that
has not seen it loads it instead of recomputing it. The router keeps one more LRU set of
blocks, those routed to any sharing replica (each wrote them through), and a sharing replica's
warmth is the larger of its own match and that shared match. The replica holding the prefix in
RAM still wins among equals (a load costs more than a RAM hit), but when the least-loaded
replica is as warm through the shared tier, a smaller imbalance sends the request there:
`shared_imbalance_abs` (2 requests) instead of `imbalance_abs`, since moving now costs a load,
not a recomputation.

Health: `failed(i)` ejects replica i for a backoff (`eject_s`, doubling on each failure in a
row up to `max_eject_s`); an ejected replica is not routed to (nor are replicas a lease
`exclude`s) until its backoff ends, when the next request probes it: `succeeded(i)` restores
it. When every candidate is ejected, the one whose backoff ends first is tried anyway (a
request with nowhere to go is better sent than refused). Its prefixes are forgotten, so they
move to the replicas that serve them next. A load report never ejects: only a failed request
does.

Pure: no I/O (the clock is injected); hashing is sha256 over a chain, never `hash()`.
Thread-safety: none; the gateway uses it from its event loop.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

R = TypeVar("R")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RouterConfig:
    block_chars: int = 64
    min_match_blocks: int = 4  # 256 characters: more than a prompt's common opening
    imbalance_abs: float = 8.0  # requests
    imbalance_rel: float = 1.5
    max_blocks_per_replica: int = 200_000
    eject_s: float = 1.0
    max_eject_s: float = 30.0
    load_poll_s: float = 1.0  # how often each replica's /metrics is read (replica_load.py)
    load_stale_s: float = 3.0  # a report older than this is unknown load
    shared_imbalance_abs: float = 2.0  # requests, when the idler replica is warm via shared KV

    def __post_init__(self) -> None:
        if self.block_chars < 1 or self.min_match_blocks < 1:
            raise ValueError("block_chars and min_match_blocks must be >= 1")
        if self.imbalance_abs < 0 or self.imbalance_rel < 1:
            raise ValueError("imbalance_abs must be >= 0 and imbalance_rel >= 1")
        if self.load_poll_s <= 0 or self.load_stale_s <= 0:
            raise ValueError("load_poll_s and load_stale_s must be > 0")


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """What a replica reports about itself (its `/metrics`); None where it does not say."""

    waiting: float  # requests queued, not yet running
    running: float | None = None
    kv_usage: float | None = None  # fraction of its KV blocks in use, 0..1
    shared_kv: bool = False  # it loads and writes through a shared KV tier

    @property
    def requests(self) -> float:
        return self.waiting + (self.running or 0.0)


def prompt_text(tenant: str, body: Mapping[str, Any]) -> str:
    """What a replica's prefix cache is keyed on, approximately: tenant and the messages."""
    messages = json.dumps(body.get("messages", []), separators=(",", ":"), ensure_ascii=False)
    return f"{tenant}\x00{body.get('model', '')}\x00{messages}"


def block_hashes(text: str, block_chars: int) -> list[bytes]:
    """Chained hashes of the full `block_chars` blocks of `text` (a partial tail is ignored)."""
    out: list[bytes] = []
    previous = b""
    data = text.encode()
    for start in range(0, len(data) - block_chars + 1, block_chars):
        previous = hashlib.sha256(previous + data[start : start + block_chars]).digest()[:16]
        out.append(previous)
    return out


class _Blocks:
    """A bounded LRU set of prefix-block hashes."""

    def __init__(self) -> None:
        self.blocks: OrderedDict[bytes, None] = OrderedDict()

    def match(self, hashes: Sequence[bytes]) -> int:
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n

    def record(self, hashes: Sequence[bytes], limit: int) -> None:
        blocks = self.blocks
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > limit:
            blocks.popitem(last=False)


class _Replica(_Blocks, Generic[R]):
    def __init__(self, target: R) -> None:
        super().__init__()
        self.target = target
        self.in_flight = 0
        self.ejected_until_s: float | None = None
        self.failures = 0  # in a row
        self.reported: ReplicaLoad | None = None
        self.reported_at_s = 0.0
        self.routed = 0  # requests sent here, ever


class PrefixRouter(Generic[R]):
    def __init__(
        self,
        targets: Sequence[R],
        config: RouterConfig | None = None,
        *,
        monotonic_s: Callable[[], float] = time.monotonic,
    ) -> None:
        if not targets:
            raise ValueError("a router needs at least one target")
        self.config = config or RouterConfig()
        self._replicas = [_Replica(t) for t in targets]
        self._shared = _Blocks()  # routed to a replica that writes through a shared KV tier
        self._now_s = monotonic_s

    @property
    def targets(self) -> list[R]:
        return [r.target for r in self._replicas]

    def _candidates(self, exclude: Collection[int]) -> list[int]:
        """Replicas that may take a request: not excluded, and not ejected (or, when every one
        is, the one whose backoff ends first)."""
        allowed = [i for i in range(len(self._replicas)) if i not in exclude] or list(
            range(len(self._replicas))
        )
        now_s = self._now_s()
        healthy = [
            i
            for i in allowed
            if (until := self._replicas[i].ejected_until_s) is None or until <= now_s
        ]
        if healthy:
            return healthy
        return [min(allowed, key=lambda i: self._replicas[i].ejected_until_s or 0.0)]

    def route(
        self, tenant: str, body: Mapping[str, Any], exclude: Collection[int] = ()
    ) -> tuple[int, int]:
        """(index of the chosen replica, matched prefix blocks); records the prompt there."""
        candidates = self._candidates(exclude)
        if len(candidates) == 1:
            return candidates[0], 0  # nothing to choose: skip hashing the prompt
        cfg = self.config
        hashes = block_hashes(prompt_text(tenant, body), cfg.block_chars)
        now_s = self._now_s()
        load = {i: self._load(i, now_s) for i in candidates}
        own = {i: self._replicas[i].match(hashes) for i in candidates}
        shared = self._shared.match(hashes) if self._shared.blocks else 0
        warmth = {i: max(own[i], shared) if self._shares(i, now_s) else own[i] for i in candidates}
        least = min(candidates, key=lambda i: (load[i], self._kv_usage(i, now_s), self._routed(i)))
        warm = min(candidates, key=lambda i: (-warmth[i], -own[i], load[i], self._routed(i)))
        # A replica as warm through the shared tier is left for a smaller imbalance.
        gap = cfg.shared_imbalance_abs if warmth[least] >= warmth[warm] else None
        chosen = warm
        if warmth[warm] < cfg.min_match_blocks or self._imbalanced(load[warm], load[least], gap):
            chosen = least
        self._record(self._replicas[chosen], hashes)
        if self._shares(chosen, now_s):
            self._shared.record(hashes, cfg.max_blocks_per_replica)
        self._replicas[chosen].routed += 1
        return chosen, warmth[chosen]

    def _imbalanced(self, busy: float, idle: float, absolute: float | None = None) -> bool:
        cfg = self.config
        gap = cfg.imbalance_abs if absolute is None else absolute
        return busy - idle > gap and busy > cfg.imbalance_rel * idle

    def _shares(self, index: int, now_s: float) -> bool:
        """Whether replica `index` said (lately) that it loads from a shared KV tier."""
        reported = self._fresh(self._replicas[index], now_s)
        return reported is not None and reported.shared_kv

    def _load(self, index: int, now_s: float) -> float:
        """Requests on the replica: ours in flight, or its own fresh report when that is more."""
        replica = self._replicas[index]
        reported = self._fresh(replica, now_s)
        own = float(replica.in_flight)
        return own if reported is None else max(own, reported.requests)

    def _kv_usage(self, index: int, now_s: float) -> float:
        reported = self._fresh(self._replicas[index], now_s)
        return 0.0 if reported is None or reported.kv_usage is None else reported.kv_usage

    def _fresh(self, replica: _Replica[R], now_s: float) -> ReplicaLoad | None:
        if replica.reported is None or now_s - replica.reported_at_s > self.config.load_stale_s:
            return None
        return replica.reported

    def _routed(self, index: int) -> int:
        return self._replicas[index].routed

    def report_load(self, index: int, load: ReplicaLoad | None) -> None:
        """Replica `index`'s own load, just read (None: unknown, e.g. its /metrics failed)."""
        replica = self._replicas[index]
        replica.reported = load
        replica.reported_at_s = self._now_s()

    def loads(self) -> list[float]:
        """Each replica's load as routing sees it now."""
        now_s = self._now_s()
        return [self._load(i, now_s) for i in range(len(self._replicas))]

    def lease(
        self, tenant: str, body: Mapping[str, Any], exclude: Collection[int] = ()
    ) -> AbstractContextManager[int]:
        """Route the request and count it in flight on its replica for the `with` block."""
        index, _ = self.route(tenant, body, exclude)
        return _Lease(self._replicas[index], index)

    def lease_at(self, index: int) -> AbstractContextManager[int]:
        """Count a request in flight on replica `index`, routed already (`route`)."""
        return _Lease(self._replicas[index], index)

    def in_flight(self) -> list[int]:
        return [r.in_flight for r in self._replicas]

    def failed(self, index: int) -> None:
        """Replica `index` failed or timed out: eject it for a backoff, forget its prefixes."""
        replica = self._replicas[index]
        replica.failures += 1
        cfg = self.config
        backoff_s = min(cfg.eject_s * 2 ** (replica.failures - 1), cfg.max_eject_s)
        replica.ejected_until_s = self._now_s() + backoff_s
        replica.blocks.clear()
        log.warning("upstream replica %d ejected for %.1f s", index, backoff_s)

    def succeeded(self, index: int) -> None:
        replica = self._replicas[index]
        if replica.ejected_until_s is not None:
            log.warning("upstream replica %d answers again", index)
        replica.failures = 0
        replica.ejected_until_s = None

    def health(self) -> list[str]:
        now_s = self._now_s()
        return [
            "ejected" if r.ejected_until_s is not None and r.ejected_until_s > now_s
            else "probing" if r.ejected_until_s is not None
            else "healthy"
            for r in self._replicas
        ]  # fmt: skip

    def _record(self, replica: _Replica[R], hashes: Sequence[bytes]) -> None:
        replica.record(hashes, self.config.max_blocks_per_replica)


class _Lease:
    """`PrefixRouter.lease`'s context (a class: it runs on every upstream call)."""

    __slots__ = ("_index", "_replica")

    def __init__(self, replica: _Replica[Any], index: int) -> None:
        self._replica = replica
        self._index = index

    def __enter__(self) -> int:
        self._replica.in_flight += 1
        return self._index

    def __exit__(self, *exc_info: object) -> None:
        self._replica.in_flight -= 1
