"""Cache-aware routing across several upstream replicas: send a request where its prefix is warm.

Each replica keeps its own KV prefix cache, so a conversation's next turn, or a question under a
shared system prompt, is fastest on the replica that served the prefix before. The router keeps,
per replica, an approximate picture of what it has seen: a bounded LRU set of prefix-block
hashes. A prompt (tenant + the serialised messages) is cut into `block_chars`-character blocks
and hashed as a chain (block i's hash covers blocks 0..i, as in nano-vllm's block manager), so a
replica "has" block i only if it saw that exact prefix.

Route: for each replica, count the leading blocks of the prompt it has seen (its match). Take
the replica with the longest match if it covers at least `min_match_blocks` and the replica is
not overloaded (in-flight requests <= `balance_factor` × the least-loaded replica's + 1);
otherwise the least-loaded replica, and among equally loaded ones the one holding the fewest
blocks (so new prefixes spread over the replicas' caches instead of piling onto the first).
Then record the prompt's blocks for the chosen replica, evicting its least recently routed
blocks past `max_blocks_per_replica`.

In-flight accounting has one owner: `lease(tenant, body)` routes and counts the request on its
replica until the `with` block ends, however it ends.

Health: `failed(i)` ejects replica i for a backoff (`eject_s`, doubling on each failure in a
row up to `max_eject_s`); an ejected replica is not routed to (nor are replicas a lease
`exclude`s) until its backoff ends, when the next request probes it: `succeeded(i)` restores
it. When every candidate is ejected, the one whose backoff ends first is tried anyway (a
request with nowhere to go is better sent than refused). Its prefixes are forgotten, so they
move to the replicas that serve them next.

Parameters: `block_chars` (256), `min_match_blocks` (1), `balance_factor` (2.0),
`max_blocks_per_replica` (200_000), `eject_s` (1.0), `max_eject_s` (30.0). Pure: no I/O (the
clock is injected); hashing is sha256 over a chain, never `hash()`. Thread-safety: none; the
gateway uses it from its event loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

R = TypeVar("R")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RouterConfig:
    block_chars: int = 256
    min_match_blocks: int = 1
    balance_factor: float = 2.0
    max_blocks_per_replica: int = 200_000
    eject_s: float = 1.0
    max_eject_s: float = 30.0


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


class _Replica(Generic[R]):
    def __init__(self, target: R) -> None:
        self.target = target
        self.blocks: OrderedDict[bytes, None] = OrderedDict()
        self.in_flight = 0
        self.ejected_until_s: float | None = None
        self.failures = 0  # in a row

    def match(self, hashes: Sequence[bytes]) -> int:
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n


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
        least = min(
            candidates,
            key=lambda i: (self._replicas[i].in_flight, len(self._replicas[i].blocks)),
        )
        least_load = self._replicas[least].in_flight
        best, best_match = least, 0
        for i in candidates:
            m = self._replicas[i].match(hashes)
            if m > best_match:
                best, best_match = i, m
        chosen = best
        overloaded = self._replicas[best].in_flight > cfg.balance_factor * least_load + 1
        if best_match < cfg.min_match_blocks or overloaded:
            chosen = least
        matched = best_match if chosen == best else self._replicas[chosen].match(hashes)
        self._record(self._replicas[chosen], hashes)
        return chosen, matched

    @contextlib.contextmanager
    def lease(
        self, tenant: str, body: Mapping[str, Any], exclude: Collection[int] = ()
    ) -> Iterator[int]:
        """Route the request and count it in flight on its replica for the `with` block."""
        index, _ = self.route(tenant, body, exclude)
        replica = self._replicas[index]
        replica.in_flight += 1
        try:
            yield index
        finally:
            replica.in_flight -= 1

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
        blocks = replica.blocks
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.config.max_blocks_per_replica:
            blocks.popitem(last=False)
