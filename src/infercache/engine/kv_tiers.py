"""The KV tiers below the radix tree, a disk directory (kv_disk.py) and a shared Redis
(kv_shared.py), behind the two calls the prefix cache (prefix_cache.py) makes: `load` when a
request is admitted, `save` when it ends.

    load (admission)                           save (end of the request): write-through
    the RAM match ends at m; from block m // B,  every whole block of the tokens that went
    while whole blocks end before the last       through the model, last block first:
    prompt token:                                  on disk? touch it : write it
      on disk?   read it → verify                  in Redis lately? skip : touch, and put
      else in Redis?  get it → verify              the absent ones
      else stop
      copy the verified block into the workspace

Loading verifies each block (kv_blocks.verify: exact length, header, the whole prefix token by
token, checksum) before the request uses it. A block from disk is read straight into its
workspace positions, which the request would otherwise compute itself (a block that fails ends
the load there, and prefill overwrites them), except a block RAM partly covered, which is read
into one block-sized scratch buffer and copied from m on; a block from Redis is copied from the
value read. So no byte that failed verification is ever attended to, and the tiers add about
one block to the engine's memory. A block
that fails is removed from its tier and counted `corrupt`; one the disk listed but that is
gone, `missing`; a tier's error (an OSError, Redis down or slow) is counted and the next tier,
or recomputation, takes over. A fault costs prefill, never an error or a different token.

Why write-through, not write-on-evict: a killed engine never evicts, so only blocks written as
they are computed survive a kill; and a replica can load a prefix as soon as the request that
computed it has ended. Tail blocks are written and touched before head blocks, so the head of
a chain is the most recent and LRU takes tails first (a tail is useless without its head).
Writes are synchronous on the worker thread: about a millisecond per block to the page cache.

Redis round trips: blocks confirmed in Redis (loaded, put or touched) in the last `ttl_s / 8`
are not touched again, so a hot prefix costs no round trip per request.

Events (the prefix strategy's metrics; prometheus.py names them): per tier (`:disk`,
`:shared`), `kv_blocks_loaded`, `kv_blocks_written`, `kv_blocks_corrupt`, `kv_blocks_missing`,
`kv_blocks_evicted`, `kv_tier_errors`, `kv_load_bytes`; gauges `kv_tier_bytes`.
`kv_tier_errors:unforeseen` counts a load or save that raised what no tier foresaw. Tokens and
seconds per request are in `TierLoad`, for accounting.py. Not thread-safe: the engine's worker
thread owns it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from infercache.clock import Clock
from infercache.engine import kv_blocks
from infercache.engine.config import TierSettings
from infercache.engine.kv import KVShape, KVWorkspace
from infercache.engine.kv_blocks import BlockGeometry, BlockNames, PromptBlocks
from infercache.engine.kv_disk import DiskRoot, DiskTier
from infercache.engine.kv_shared import SharedTier
from infercache.errors import BlockRejectedError, KVTierError

log = logging.getLogger(__name__)

CONFIRMED_MAX = 10_000  # names remembered as present in Redis (~1.5 MB)
IN_PLACE = memoryview(b"")  # a fetched block already in the workspace


class TierEvents(Protocol):
    """Where the tiers count (a `StrategyMetrics`)."""

    def count(self, name: str, amount: float = 1) -> None: ...

    def gauge(self, name: str, value: float) -> None: ...


@dataclass(frozen=True, slots=True)
class TierLoad:
    """What `load` added: the workspace's KV now covers [0, `end`); `disk_tokens` and
    `shared_tokens` of it came from those tiers, in `disk_s` and `shared_s`."""

    end: int
    disk_tokens: int = 0
    shared_tokens: int = 0
    disk_s: float = 0.0
    shared_s: float = 0.0


class KVTiers:
    def __init__(
        self,
        names: BlockNames,
        *,
        disk: DiskTier | None,
        shared: SharedTier | None,
        clock: Clock,
        events: TierEvents,
    ) -> None:
        self.names = names
        self.geometry: BlockGeometry = names.geometry
        self.disk = disk
        self.shared = shared
        self._clock = clock
        self._events = events
        self._scratch = np.empty(self.geometry.kv_bytes, dtype=np.uint8)  # a block read from disk
        self._confirmed: OrderedDict[str, float] = OrderedDict()
        self._disk_evicted = 0
        self._shared_evicted = 0
        self._gauges()

    # -- admission ------------------------------------------------------------------------

    def load(self, namespace: str, prompt: Sequence[int], start: int, ws: KVWorkspace) -> TierLoad:
        """Extend the workspace's KV, valid for [0, `start`), with whole blocks of `prompt`
        from the tiers, up to before its last token (whose logits start generation)."""
        b = self.geometry.block_tokens
        first, last = start // b, (len(prompt) - 1) // b
        if first >= last:
            return TierLoad(start)
        blocks = self.names.blocks(namespace, prompt, last)
        end, got = start, {"disk": [0, 0.0], "shared": [0, 0.0]}
        for index in range(first, last):
            started = self._clock.monotonic_s()
            tier = self._load_block(blocks, index, end - index * b, ws)
            if tier is None:
                break
            got[tier][0] += (index + 1) * b - end
            got[tier][1] += self._clock.monotonic_s() - started
            end = (index + 1) * b
        ws.length = max(ws.length, end)
        disk, shared = got["disk"], got["shared"]
        return TierLoad(end, int(disk[0]), int(shared[0]), disk[1], shared[1])

    def _load_block(
        self, blocks: PromptBlocks, index: int, skip: int, ws: KVWorkspace
    ) -> str | None:
        """Block `index` into the workspace (from `skip` tokens into it) from the first tier
        that holds it intact; the tier's name, or None."""
        b = self.geometry.block_tokens
        for tier in ("disk", "shared"):
            try:
                kv = (
                    self._fetch_disk(blocks, index, ws, skip)
                    if tier == "disk"
                    else self._fetch_shared(blocks, index)
                )
                if kv is None:
                    continue
            except BlockRejectedError as e:
                log.warning("KV block %s from %s rejected: %s", blocks.name(index), tier, e)
                self._events.count(f"kv_blocks_corrupt:{tier}")
                self._discard(tier, blocks.name(index))
                continue
            except KVTierError as e:
                log.warning("KV %s tier: %s", tier, e)
                self._events.count(f"kv_tier_errors:{tier}")
                continue
            if kv is not IN_PLACE:
                ws.put_block(index * b, kv, b, skip)
            self._events.count(f"kv_blocks_loaded:{tier}")
            self._events.count(f"kv_load_bytes:{tier}", self.geometry.block_bytes(index))
            return tier
        return None

    def _fetch_disk(
        self, blocks: PromptBlocks, index: int, ws: KVWorkspace, skip: int
    ) -> kv_blocks.Buffer | None:
        """Block `index`'s KV from disk, verified; None if the disk does not have it. A block
        RAM covered nothing of (`skip` 0) is read straight into its workspace positions, the
        ones the request computes itself should the block fail (`IN_PLACE`); one RAM partly
        covered is staged in the scratch buffer."""
        disk, name = self.disk, blocks.name(index)
        if disk is None or name not in disk:
            return None
        header = bytearray(kv_blocks.HEADER_BYTES)
        tokens = bytearray(self.geometry.tokens_bytes(index))
        b = self.geometry.block_tokens
        kv = [self._scratch] if skip else ws.runs(index * b, (index + 1) * b)
        if not disk.read(name, [header, tokens, *kv]):
            self._events.count("kv_blocks_missing:disk")
            return None
        kv_blocks.verify(self.geometry, blocks, index, header, tokens, kv)
        return self._scratch if skip else IN_PLACE

    def _fetch_shared(self, blocks: PromptBlocks, index: int) -> kv_blocks.Buffer | None:
        """Block `index`'s KV from Redis, verified (a view of the value read); None if not
        there."""
        shared, name = self.shared, blocks.name(index)
        if shared is None or not shared.available:
            return None
        value = shared.get(name)
        if value is None:
            return None
        header, tokens, kv = kv_blocks.split(self.geometry, index, value)
        kv_blocks.verify(self.geometry, blocks, index, header, tokens, kv)
        self._confirm(name)
        return kv

    def _discard(self, tier: str, name: str) -> None:
        try:
            if tier == "disk" and self.disk is not None:
                self.disk.discard(name)
            elif tier == "shared" and self.shared is not None:
                self.shared.discard(name)
        except KVTierError as e:
            log.warning("KV %s tier: could not discard a rejected block: %s", tier, e)

    # -- end of a request -----------------------------------------------------------------

    def save(self, namespace: str, tokens: Sequence[int], ws: KVWorkspace) -> None:
        """Write through every whole block of `tokens` (whose KV the workspace holds) that a
        tier lacks; refresh the recency of those it has."""
        count = min(len(tokens), ws.length) // self.geometry.block_tokens
        if count == 0:
            return
        blocks = self.names.blocks(namespace, tokens, count)
        if self.disk is not None:
            self._save_disk(self.disk, blocks, ws)
        if self.shared is not None and self.shared.available:
            self._save_shared(self.shared, blocks, ws)
        self._gauges()

    def _parts(self, blocks: PromptBlocks, index: int, ws: KVWorkspace) -> list[kv_blocks.Buffer]:
        b = self.geometry.block_tokens
        return kv_blocks.encode(self.geometry, blocks, index, ws.runs(index * b, (index + 1) * b))

    def _save_disk(self, disk: DiskTier, blocks: PromptBlocks, ws: KVWorkspace) -> None:
        for index in reversed(range(len(blocks))):  # tails first: heads end most recent
            name = blocks.name(index)
            if name in disk:
                disk.touch(name)
                continue
            try:
                if disk.write(name, self._parts(blocks, index, ws)):
                    self._events.count("kv_blocks_written:disk")
            except KVTierError as e:
                log.warning("KV disk tier: %s", e)
                self._events.count("kv_tier_errors:disk")
                return  # the directory is read-only or full: not once per block

    def _save_shared(self, shared: SharedTier, blocks: PromptBlocks, ws: KVWorkspace) -> None:
        now_s = self._clock.monotonic_s()
        indexes = [i for i in reversed(range(len(blocks))) if not self._recent(blocks.name(i))]
        try:
            present = shared.touch([blocks.name(i) for i in indexes])
            for index, there in zip(indexes, present, strict=True):
                name = blocks.name(index)
                if not there and shared.put(name, b"".join(self._parts(blocks, index, ws))):
                    self._events.count("kv_blocks_written:shared")
                self._confirm(name, now_s)
        except KVTierError as e:
            log.warning("KV shared tier: %s", e)
            self._events.count("kv_tier_errors:shared")

    def _recent(self, name: str) -> bool:
        assert self.shared is not None
        seen = self._confirmed.get(name)
        fresh_s = self.shared.ttl_ms / 8000
        return seen is not None and self._clock.monotonic_s() - seen < fresh_s

    def _confirm(self, name: str, now_s: float | None = None) -> None:
        self._confirmed[name] = self._clock.monotonic_s() if now_s is None else now_s
        self._confirmed.move_to_end(name)
        if len(self._confirmed) > CONFIRMED_MAX:
            self._confirmed.popitem(last=False)

    # -- figures --------------------------------------------------------------------------

    def _gauges(self) -> None:
        for tier, present in (("disk", self.disk), ("shared", self.shared)):
            if present is not None:
                self._events.gauge(f"kv_tier_enabled:{tier}", 1)
        if self.disk is not None:
            self._events.gauge("kv_tier_bytes:disk", self.disk.used_bytes)
            self._events.gauge("kv_tier_blocks:disk", len(self.disk))
            self._count_evictions("disk", self.disk.evicted_files)
        if self.shared is not None:
            if self.shared.used_bytes is not None:
                self._events.gauge("kv_tier_bytes:shared", self.shared.used_bytes)
            self._count_evictions("shared", self.shared.evicted_blocks)

    def _count_evictions(self, tier: str, total: int) -> None:
        seen = self._disk_evicted if tier == "disk" else self._shared_evicted
        if total > seen:
            self._events.count(f"kv_blocks_evicted:{tier}", total - seen)
        if tier == "disk":
            self._disk_evicted = total
        else:
            self._shared_evicted = total

    def count_unforeseen(self) -> None:
        """A `load` or `save` raised what no tier counts (a bug, not a fault): the caller logs
        it and goes on without the tiers; counted as `kv_tier_errors:unforeseen` (the tier is
        not known) beside the faults each tier counts itself."""
        self._events.count("kv_tier_errors:unforeseen")

    def stats(self) -> dict[str, object]:
        """For `/stats`: each tier's place, budget, use and state."""
        out: dict[str, object] = {"block_tokens": self.geometry.block_tokens}
        if self.disk is not None:
            out["disk"] = {
                "directory": str(self.disk.directory),
                "max_bytes": self.disk.max_bytes,
                "used_bytes": self.disk.used_bytes,
                "blocks": len(self.disk),
            }
        if self.shared is not None:
            out["shared"] = {
                "url": self.shared.url,
                "max_bytes": self.shared.max_bytes,
                "used_bytes": self.shared.used_bytes,
                "ttl_s": self.shared.ttl_ms / 1000,
                "state": self.shared.state(),
            }
        return out


class TierBackends:
    """The tiers' engine-wide parts, opened once per engine: the locked disk root and the
    Redis client. `for_model` gives one model's tiers (after a swap, the new model's
    directory; the old one is reclaimed). A root another process holds, or any error opening
    it, leaves the engine without a disk tier (logged and counted), never without an engine."""

    def __init__(self, settings: TierSettings, *, clock: Clock, events: TierEvents) -> None:
        self.settings = settings
        self._clock = clock
        self._events = events
        self._root: DiskRoot | None = None
        self._shared: SharedTier | None = None
        if settings.disk_bytes > 0 and settings.disk_dir is not None:
            root = DiskRoot(settings.disk_dir)
            try:
                root.open()
            except KVTierError as e:
                log.warning("running without a KV disk tier: %s", e)
                events.count("kv_tier_errors:disk")
            else:
                self._root = root
        if settings.shared_url is not None:
            self._shared = SharedTier(
                settings.shared_url,
                max_bytes=settings.shared_bytes,
                ttl_s=settings.shared_ttl_s,
                clock=clock,
                prefix=settings.shared_prefix,
            )

    def for_model(self, fingerprint: str, shape: KVShape) -> KVTiers | None:
        """The tiers of the model whose version (`Engine.model_version`: weights, config,
        tokenizer) is `fingerprint` and whose KV has `shape`; None without any tier. Everything
        that changes the K/V a prompt yields must be in `fingerprint` or `shape` (the KV dtype
        is): a weight format (issue 28) belongs in the version the loader passes."""
        if self._root is None and self._shared is None:
            return None
        s = shape
        geometry = BlockGeometry(
            self.settings.block_tokens, s.layers, s.kv_heads, s.head_dim, s.itemsize
        )
        names = BlockNames(fingerprint, str(s.dtype), geometry)
        disk = None
        if self._root is not None:
            key = names.directory_key
            disk = self._root.tier(key, max_bytes=self.settings.disk_bytes, clock=self._clock)
        shared, clock = self._shared, self._clock
        return KVTiers(names, disk=disk, shared=shared, clock=clock, events=self._events)

    def close(self) -> None:
        if self._root is not None:
            self._root.close()
        if self._shared is not None:
            self._shared.close()
