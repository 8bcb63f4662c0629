"""The census: every request in exactly one class, checked in this order:

1. `exact_repeat`: its exact identity (prepared_request.py: the cache's exact key) was seen before;
2. `near_duplicate`: an earlier request of the same semantic scope is accepted as its
   near-duplicate at the calibrated threshold (near_duplicates.py);
3. `shared_prefix`: at least `min_prefix_tokens` of its prompt equal an earlier prompt's
   prefix in the same KV namespace (simulated_prefix_cache.py, the engine's radix tree, unbounded);
4. `unique`.
Beside the classes: `prefix_token_share`, the share of all prompt tokens an unbounded prefix
cache would have reused (every request counts, repeats included; the last prompt token is
always recomputed, as the engine does); the same per tenant and per model; the distribution of
reuse distances (seconds since the request it repeats, or shares a prefix with, was last
seen) by class; the distribution of per-request reused shares; and the share of requests the
cache would not serve (prepared_request.py `not_cacheable`).

Memory: one 16-byte digest and a float per distinct exact identity (at most
`census_max_identities`, ~110 bytes each), the prefix tree (bounded by
`census_capacity_tokens`), the near-duplicate index (bounded by `max_vectors`), at most
`max_groups` tenants and models (later ones are pooled as "(other)").
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np

from infercache.analyze.near_duplicates import NearDuplicates
from infercache.analyze.options import AnalyzeOptions
from infercache.analyze.prefix_breakers import BreakerFinder
from infercache.analyze.prepared_request import PreparedRequest
from infercache.analyze.simulated_prefix_cache import (
    PrefixStats,
    SimulatedPrefixCache,
    kv_namespace,
)

OTHER = "(other)"
# Reuse distances: 4 bins a decade, 0.1 s to ~37 days, then everything longer.
DISTANCE_BOUNDS_S = tuple(round(10 ** (i / 4), 3) for i in range(-4, 27))
SHARE_BOUNDS = tuple(round(0.05 * i, 2) for i in range(1, 21))  # per-request reused share


class Class(StrEnum):
    EXACT_REPEAT = "exact_repeat"
    NEAR_DUPLICATE = "near_duplicate"
    SHARED_PREFIX = "shared_prefix"
    UNIQUE = "unique"


class RecentIdentities:
    """Last-seen time of each exact identity, for at most ~`max_identities` of them.

    Two generations (a cheap LRU approximation with plain dicts): identities go to `new`;
    when it holds `max_identities / 2` it becomes `old` and a new `new` starts, dropping the
    previous `old`. A repeat found in `old` moves back to `new`. `forgot` says whether any
    identity was ever dropped (then exact repeats are a lower bound)."""

    def __init__(self, max_identities: int) -> None:
        self._half = max(1, max_identities // 2)
        self._new: dict[bytes, float | None] = {}
        self._old: dict[bytes, float | None] = {}
        self.forgot = False

    def see(self, identity: bytes, now_s: float | None) -> tuple[bool, float | None]:
        """(seen before, when it was last seen) — and remember it as seen now."""
        new = self._new
        if identity in new:
            previous, seen = new[identity], True
        elif identity in self._old:
            previous, seen = self._old.pop(identity), True
        else:
            previous, seen = None, False
        new[identity] = now_s
        if len(new) >= self._half:
            self.forgot = self.forgot or bool(self._old)
            self._old, self._new = new, {}
        return seen, previous


class Bins:
    """Counts of values by upper bucket bound (the last bucket is unbounded)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)

    def add(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1

    def to_dict(self) -> dict[str, Any]:
        return {"bounds": list(self.bounds), "counts": list(self.counts)}


@dataclass
class Tally:
    """Figures of one group of requests (all, one tenant, one model)."""

    requests: int = 0
    classes: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0  # of requests whose prompt is known
    reused_tokens: int = 0
    not_cacheable: int = 0
    long_prefix: int = 0  # requests reusing at least `min_prefix_tokens` (any class)

    def add(
        self, cls: Class, prompt_tokens: int, reused_tokens: int, cacheable: bool, long: bool
    ) -> None:
        self.requests += 1
        self.classes[cls] += 1
        self.prompt_tokens += prompt_tokens
        self.reused_tokens += reused_tokens
        self.not_cacheable += not cacheable
        self.long_prefix += long

    @property
    def prefix_token_share(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        n = self.requests or 1
        return {
            "requests": self.requests,
            "census": {c.value: self.classes[c] / n for c in Class},
            "prompt_tokens": self.prompt_tokens,
            "prefix_token_share": self.prefix_token_share,
            "long_prefix_share": self.long_prefix / n,
            "not_cacheable_share": self.not_cacheable / n,
        }


@dataclass
class CensusResult:
    total: Tally
    by_tenant: dict[str, Tally]
    by_model: dict[str, Tally]
    distances: dict[Class, Bins]
    within_ttl: Counter[Class]
    reused_share: Bins
    not_cacheable: Counter[str]
    prefix: PrefixStats
    prefix_bounded: bool
    identities_bounded: bool  # some exact identities were forgotten: repeats a lower bound
    without_prompt: int  # redacted requests: exact repeats only
    timed: int  # requests with a timestamp
    first_s: float | None
    last_s: float | None
    layers: Counter[str]  # what the gateway did live, from its log
    near_duplicates_measured: bool


class Census:
    def __init__(
        self,
        options: AnalyzeOptions,
        *,
        near: NearDuplicates | None = None,
        breakers: BreakerFinder | None = None,
        max_groups: int = 1000,
    ) -> None:
        self._options = options
        self._near = near
        self._breakers = breakers
        self._max_groups = max_groups
        self._prefix = SimulatedPrefixCache(capacity_tokens=options.census_capacity_tokens)
        self._identities = RecentIdentities(options.census_max_identities)
        self._total = Tally()
        self._by_tenant: dict[str, Tally] = {}
        self._by_model: dict[str, Tally] = {}
        self._distances: dict[Class, Bins] = {
            c: Bins(DISTANCE_BOUNDS_S) for c in Class if c is not Class.UNIQUE
        }
        self._within_ttl: Counter[Class] = Counter()
        self._reused_share = Bins(SHARE_BOUNDS)
        self._not_cacheable: Counter[str] = Counter()
        self._layers: Counter[str] = Counter()
        self._without_prompt = 0
        self._timed = 0
        self._first_s: float | None = None
        self._last_s: float | None = None

    def observe(self, event: PreparedRequest, vector: np.ndarray | None = None) -> Class:
        """Classify one request (in time order) and count it."""
        now = event.timestamp_s
        self._clock(now)
        seen, previous = self._identities.see(event.exact_id, now)
        cls, since = (Class.EXACT_REPEAT, previous) if seen else (None, None)
        namespace = kv_namespace(
            event.tenant,
            event.model,
            share_across_tenants=self._options.share_prefix_across_tenants,
        )
        matched = reused = 0
        if event.units is not None and event.prompt_tokens is not None:
            reuse = self._prefix.observe(
                namespace,
                event.units,
                unit_tokens=event.unit_tokens,
                prompt_tokens=event.prompt_tokens,
                now_s=now if now is not None else 0.0,
            )
            matched, reused = reuse.matched_tokens, reuse.reused_tokens
            self._reused_share.add(reused / event.prompt_tokens if event.prompt_tokens else 0.0)
            prefix_seen_s = reuse.last_seen_s
        else:
            self._without_prompt += 1
            prefix_seen_s = None
        if self._near is not None and event.query is not None and vector is not None:
            near = self._near.observe(event.query, vector, now, check=cls is None)
            if near is not None:
                cls, since = Class.NEAR_DUPLICATE, near.last_seen_s
        if cls is None and matched >= self._options.min_prefix_tokens:
            cls, since = Class.SHARED_PREFIX, prefix_seen_s if now is not None else None
        if cls is None:
            cls = Class.UNIQUE
        elif now is not None and since is not None:
            self._distance(cls, now - since)
        if self._breakers is not None and event.first_message is not None:
            role, text = event.first_message
            self._breakers.observe(namespace, event.tenant, event.model, role, text)
        self._count(event, cls, reused, matched >= self._options.min_prefix_tokens)
        return cls

    def _clock(self, now: float | None) -> None:
        if now is None:
            return
        self._timed += 1
        if self._first_s is None:
            self._first_s = now
        self._last_s = now if self._last_s is None else max(self._last_s, now)

    def _distance(self, cls: Class, seconds: float) -> None:
        self._distances[cls].add(max(0.0, seconds))
        if seconds <= self._options.ttl_s:
            self._within_ttl[cls] += 1

    def _count(self, event: PreparedRequest, cls: Class, reused: int, long: bool) -> None:
        prompt = event.prompt_tokens if event.units is not None and event.prompt_tokens else 0
        cacheable = event.not_cacheable is None
        if not cacheable:
            self._not_cacheable[event.not_cacheable or ""] += 1
        if event.layer is not None:
            self._layers[event.layer] += 1
        for tally in (
            self._total,
            self._group(self._by_tenant, event.tenant),
            self._group(self._by_model, event.model),
        ):
            tally.add(cls, prompt, reused, cacheable, long)

    def _group(self, groups: dict[str, Tally], name: str) -> Tally:
        tally = groups.get(name)
        if tally is None:
            if len(groups) >= self._max_groups:
                name = OTHER
            tally = groups.setdefault(name, Tally())
        return tally

    def result(self) -> CensusResult:
        return CensusResult(
            total=self._total,
            by_tenant=self._by_tenant,
            by_model=self._by_model,
            distances=self._distances,
            within_ttl=self._within_ttl,
            reused_share=self._reused_share,
            not_cacheable=self._not_cacheable,
            prefix=self._prefix.stats(),
            prefix_bounded=self._prefix.evicted,
            identities_bounded=self._identities.forgot,
            without_prompt=self._without_prompt,
            timed=self._timed,
            first_s=self._first_s,
            last_s=self._last_s,
            layers=self._layers,
            near_duplicates_measured=self._near is not None,
        )
