"""KV for testing the tiers without a model: the K/V of position p is a value derived from
the tokens up to p (as real KV depends on the whole prefix), so a test can check that whatever
a tier loads is exactly the KV of that prompt's prefix."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from infercache.clock import ManualClock
from infercache.engine.config import TierSettings
from infercache.engine.kv import KVShape, KVWorkspace
from infercache.engine.kv_tiers import TierBackends
from infercache.engine.prefix_cache import Lease, PrefixCache
from infercache.metrics import StrategyMetrics

SHAPE = KVShape(layers=2, kv_heads=2, head_dim=4, dtype=torch.float32)
BLOCK = 8
FINGERPRINT = "fp_test"


def kv_of(prompt: Sequence[int], start: int, end: int) -> torch.Tensor:
    """The fake KV of positions [start, end) of `prompt`: [layers, 2, n, heads, dim]."""
    data = np.asarray(prompt[:end], dtype="<i4").tobytes()
    seeds = [zlib.crc32(data[: 4 * (p + 1)]) % 100_003 for p in range(start, end)]
    per_token = SHAPE.layers * 2 * SHAPE.kv_heads * SHAPE.head_dim
    values = torch.tensor(seeds, dtype=torch.float32)[:, None] + torch.arange(per_token)
    shaped = values.view(end - start, SHAPE.layers, 2, SHAPE.kv_heads, SHAPE.head_dim)
    return shaped.permute(1, 2, 0, 3, 4).contiguous()


class Replica:
    """A prefix cache over tiers, as one engine process holds it (`restart` is a new one)."""

    def __init__(
        self,
        tmp: Path,
        *,
        disk_bytes: int = 1 << 20,
        max_kv_bytes: int = 64 * 128,
        shared_url: str | None = None,
        shared_bytes: int = 1 << 20,
        fingerprint: str = FINGERPRINT,
        clock: ManualClock | None = None,
        prefix: str = "infercache:kv:",
    ) -> None:
        self.tmp = tmp
        self.options: dict[str, Any] = {
            "disk_bytes": disk_bytes,
            "max_kv_bytes": max_kv_bytes,
            "shared_url": shared_url,
            "shared_bytes": shared_bytes,
            "fingerprint": fingerprint,
            "prefix": prefix,
        }
        self.clock = clock if clock is not None else ManualClock()
        self.events = StrategyMetrics("prefix")
        settings = TierSettings(
            disk_bytes=disk_bytes,
            disk_dir=tmp / "kv",
            shared_url=shared_url,
            shared_bytes=shared_bytes,
            block_tokens=BLOCK,
            shared_prefix=prefix,
        )
        self.backends = TierBackends(settings, clock=self.clock, events=self.events)
        self.tiers = self.backends.for_model(fingerprint, SHAPE)
        self.cache = PrefixCache(SHAPE, max_kv_bytes=max_kv_bytes, tiers=self.tiers)

    def ask(self, prompt: Sequence[int], namespace: str = "ns") -> Lease:
        """Admit `prompt`, check every reused position holds its prefix's KV, compute the
        rest (fake), release."""
        ws = KVWorkspace(SHAPE, len(prompt))
        lease = self.cache.acquire(namespace, prompt, ws)
        reused = lease.reused_tokens
        assert ws.length == reused
        assert torch.equal(ws.data[:, :, :reused], kv_of(prompt, 0, reused))
        with torch.inference_mode():
            ws.data[:, :, reused : len(prompt)] = kv_of(prompt, reused, len(prompt))
        ws.length = len(prompt)
        self.cache.release(lease, prompt, ws)
        return lease

    def counters(self) -> dict[str, float]:
        counters: dict[str, float] = self.events.snapshot()["counters"]
        return counters

    def close(self) -> None:
        self.backends.close()

    def restart(self, **changes: Any) -> Replica:
        """This replica stopped, and a new one started on the same directory."""
        self.close()
        return Replica(self.tmp, **{**self.options, **changes})
