"""The census: every request in exactly one class, checked in this order:

1. `exact_repeat`: its exact identity (prepared_request.py: the cache's exact key) was seen
   before;
2. `near_duplicate`: an earlier request of the same semantic scope is accepted as its
   near-duplicate at the calibrated threshold (near_duplicates/finder.py);
3. `shared_prefix`: it reuses at least `min_prefix_share` of its prompt from earlier prompts'
   prefixes in the same KV namespace (simulated_prefix_cache.py, the engine's radix tree,
   unbounded); how many tokens it shares is reported beside, not used as a bar;
4. `unique`.
Beside the classes: `prefix_token_share`, the share of all prompt tokens an unbounded prefix
cache would have reused (every request counts, repeats included; the last prompt token is
always recomputed, as the engine does), and the reuse at every smaller KV budget (kv_sweep.py);
the same per tenant, per model and, with `by`, per window of time; the distribution of reuse
distances (seconds since the request it repeats, or shares a prefix with, was last seen) by
class; the distribution of per-request reused shares and of shared-prefix lengths; and the
share of requests the cache would not serve (prepared_request.py `not_cacheable`).

Near-duplicates on a sample. When the near-duplicate pass checks only a uniform sample of the
requests (large logs), a request outside it falls through to classes 3-4. Exact repeats are
known for every request and are never near-duplicates, so the near-duplicate share is
estimated among the other requests: p̂ = near / checked, scaled by their count; the shared-
prefix and unique counts give back what the unchecked requests would have lost to it, in the
proportions the sample shows (`Tally.shares`). With every request checked these are counts.

Memory: one 16-byte digest and a float per distinct exact identity (at most
`census_max_identities`, ~110 bytes each), the prefix tree (bounded by
`census_capacity_tokens`), at most `max_groups` tenants, models and windows (later ones are
pooled as "(other)").
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import KW_ONLY, dataclass, field, fields
from enum import StrEnum
from typing import NamedTuple

from infercache.analyze.kv_sweep import BudgetSweep
from infercache.analyze.near_duplicates.finder import NearCheck
from infercache.analyze.options import AnalyzeOptions
from infercache.analyze.prepared_request import PreparedRequest
from infercache.analyze.simulated_prefix_cache import PrefixStats, SimulatedPrefixCache
from infercache.engine.kv_namespace import logged_namespace
from infercache.intervals import wilson_interval
from infercache.prefix_breakers import BreakerFinder

OTHER = "(other)"
# Reuse distances: 4 bins a decade, 0.1 s to ~37 days, then everything longer.
DISTANCE_BOUNDS_S = tuple(round(10 ** (i / 4), 3) for i in range(-4, 27))
SHARE_BOUNDS = tuple(round(0.05 * i, 2) for i in range(1, 21))  # per-request reused share
SHARED_TOKEN_BOUNDS = tuple(float(1 << i) for i in range(4, 21))  # shared-prefix lengths
NOT_CHECKED = NearCheck(False, None)


class Class(StrEnum):
    EXACT_REPEAT = "exact_repeat"
    NEAR_DUPLICATE = "near_duplicate"
    SHARED_PREFIX = "shared_prefix"
    UNIQUE = "unique"


class Repeat(NamedTuple):
    seen: bool  # its exact identity was seen before
    previous_s: float | None  # when it was last seen


class Observation(NamedTuple):
    cls: Class
    reused_tokens: int  # what an unbounded prefix cache reuses of its prompt


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

    def see(self, identity: bytes, now_s: float | None) -> Repeat:
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
        return Repeat(seen, previous)


class Bins:
    """Counts of values by upper bucket bound (the last bucket is unbounded)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)

    def add(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1


@dataclass
class Tally:
    """Figures of one group of requests (all, one tenant, one model, one window)."""

    requests: int = 0
    classes: Counter[str] = field(default_factory=Counter)
    prompt_tokens: int = 0  # of requests whose prompt is known
    reused_tokens: int = 0
    not_cacheable: int = 0
    shared_tokens: int = 0  # tokens `shared_prefix` requests reuse
    non_exact: int = 0  # requests that are not exact repeats
    checked: int = 0  # ... whose near-duplicate status was checked
    near: int = 0  # ... of which near-duplicates
    near_instead: Counter[str] = field(default_factory=Counter)  # their class otherwise

    def add(self, cls: Class, prompt: int, reused: int, cacheable: bool) -> None:
        self.requests += 1
        self.classes[cls] += 1
        self.prompt_tokens += prompt
        self.reused_tokens += reused
        self.not_cacheable += not cacheable
        if cls is Class.SHARED_PREFIX:
            self.shared_tokens += reused

    def near_check(self, checked: bool, near_instead: Class | None) -> None:
        """A request that is not an exact repeat; `near_instead`: its class had it not been a
        near-duplicate (None: it is none)."""
        self.non_exact += 1
        self.checked += checked
        if near_instead is not None:
            self.near += 1
            self.near_instead[near_instead] += 1

    @property
    def prefix_token_share(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def all_checked(self) -> bool:
        return self.checked == self.non_exact

    def shares(self) -> dict[str, float]:
        """The class shares, estimated from the sample when not every request was checked."""
        n = self.requests or 1
        if self.all_checked or not self.checked:
            return {c.value: self.classes[c] / n for c in Class}
        unchecked = self.non_exact - self.checked
        moved = {c: unchecked * self.near_instead[c] / self.checked for c in Class}
        near = self.near_rate * self.non_exact
        return {
            Class.EXACT_REPEAT.value: self.classes[Class.EXACT_REPEAT] / n,
            Class.NEAR_DUPLICATE.value: near / n,
            Class.SHARED_PREFIX.value: (
                self.classes[Class.SHARED_PREFIX] - moved[Class.SHARED_PREFIX]
            )
            / n,
            Class.UNIQUE.value: (self.classes[Class.UNIQUE] - moved[Class.UNIQUE]) / n,
        }

    @property
    def near_rate(self) -> float:
        """Near-duplicates among the checked requests that are not exact repeats."""
        return self.near / self.checked if self.checked else 0.0

    def near_interval(self, confidence: float = 0.95) -> tuple[float, float] | None:
        """The near-duplicate share of all requests: its `confidence` interval (Wilson), over
        the requests checked: the sample's uncertainty, or, when every request was checked,
        how well this day measures the traffic it comes from."""
        if not self.checked or not self.requests:
            return None
        low, high = wilson_interval(self.near, self.checked, confidence)
        scale = self.non_exact / self.requests
        return low * scale, high * scale


@dataclass
class CensusCounts:
    """What the census counts as requests go by (its result's figures, but the prefix cache's
    and the identities')."""

    total: Tally = field(default_factory=Tally)
    by_tenant: dict[str, Tally] = field(default_factory=dict)
    by_model: dict[str, Tally] = field(default_factory=dict)
    by_window: dict[int, Tally] = field(default_factory=dict)  # timestamp // window_s → figures
    tenant_names: dict[str, str] = field(default_factory=dict)  # tenant → its configured name
    distances: dict[Class, Bins] = field(
        default_factory=lambda: {c: Bins(DISTANCE_BOUNDS_S) for c in Class if c is not Class.UNIQUE}
    )
    within_ttl: Counter[Class] = field(default_factory=Counter)
    reused_share: Bins = field(default_factory=lambda: Bins(SHARE_BOUNDS))
    # reused tokens of `shared_prefix` requests
    shared_tokens: Bins = field(default_factory=lambda: Bins(SHARED_TOKEN_BOUNDS))
    not_cacheable: Counter[str] = field(default_factory=Counter)
    without_prompt: int = 0  # requests without a known prompt: exact repeats only
    timed: int = 0  # requests with a timestamp
    first_s: float | None = None
    last_s: float | None = None
    layers: Counter[str] = field(default_factory=Counter)  # what the gateway did live, from its log


@dataclass(kw_only=True)
class CensusResult(CensusCounts):
    prefix: PrefixStats
    kv_sweep: BudgetSweep | None
    prefix_bounded: bool
    identities_bounded: bool  # some exact identities were forgotten: repeats a lower bound
    near_duplicates_measured: bool


@dataclass(eq=False, repr=False, slots=True)
class Census:
    options: AnalyzeOptions
    _: KW_ONLY
    breakers: BreakerFinder | None = None
    near_measured: bool = False
    max_groups: int = 1000
    _prefix: SimulatedPrefixCache = field(init=False)
    _identities: RecentIdentities = field(init=False)
    _counts: CensusCounts = field(init=False, default_factory=CensusCounts)

    def __post_init__(self) -> None:
        capacity = self.options.census_capacity_tokens
        self._prefix = SimulatedPrefixCache(capacity_tokens=capacity, sweep=True)
        self._identities = RecentIdentities(self.options.census_max_identities)

    def remember(self, event: PreparedRequest) -> Repeat:
        """Whether `event` repeats an earlier request exactly; call once per request, in time
        order, before `observe` (the analysis learns this first, to embed only what it must)."""
        return self._identities.see(event.exact_id, event.timestamp_s)

    def observe(
        self,
        event: PreparedRequest,
        *,
        repeat: Repeat | None = None,
        near: NearCheck = NOT_CHECKED,
    ) -> Observation:
        """Classify one request (in time order) and count it."""
        now = event.timestamp_s
        self._clock(now)
        if repeat is None:
            repeat = self.remember(event)
        namespace = logged_namespace(
            event.tenant,
            event.model,
            event.body,
            share_across_tenants=self.options.share_prefix_across_tenants,
        )
        reused, prefix_seen_s = self._prefix_reuse(event, namespace, now)
        prompt = event.prompt_tokens if event.units is not None and event.prompt_tokens else 0
        shares = prompt and reused >= self.options.min_prefix_share * prompt
        fallback = Class.SHARED_PREFIX if shares else Class.UNIQUE
        if repeat.seen:
            cls, since = Class.EXACT_REPEAT, repeat.previous_s
        elif near.match is not None:
            cls, since = Class.NEAR_DUPLICATE, near.match.last_seen_s
        else:
            cls, since = fallback, prefix_seen_s if fallback is Class.SHARED_PREFIX else None
        if cls is Class.SHARED_PREFIX:
            self._counts.shared_tokens.add(reused)
        if now is not None and since is not None:
            self._distance(cls, now - since)
        if self.breakers is not None and event.first_message is not None:
            role, text = event.first_message
            self.breakers.observe(namespace, event.tenant, event.model, role, text)
        self._count(event, cls, prompt, reused, repeat, near, fallback)
        return Observation(cls, reused)

    def _prefix_reuse(
        self, event: PreparedRequest, namespace: str, now: float | None
    ) -> tuple[int, float | None]:
        if event.units is None or event.prompt_tokens is None:
            self._counts.without_prompt += 1
            return 0, None
        reuse = self._prefix.observe(
            namespace,
            event.units,
            unit_tokens=event.unit_tokens,
            prompt_tokens=event.prompt_tokens,
            now_s=now if now is not None else 0.0,
        )
        prompt = event.prompt_tokens
        self._counts.reused_share.add(reuse.reused_tokens / prompt if prompt else 0.0)
        return reuse.reused_tokens, reuse.last_seen_s if now is not None else None

    def _clock(self, now: float | None) -> None:
        if now is None:
            return
        self._counts.timed += 1
        if self._counts.first_s is None:
            self._counts.first_s = now
        self._counts.last_s = now if self._counts.last_s is None else max(self._counts.last_s, now)

    def _distance(self, cls: Class, seconds: float) -> None:
        self._counts.distances[cls].add(max(0.0, seconds))
        if seconds <= self.options.ttl_s:
            self._counts.within_ttl[cls] += 1

    def _count(
        self,
        event: PreparedRequest,
        cls: Class,
        prompt: int,
        reused: int,
        repeat: Repeat,
        near: NearCheck,
        fallback: Class,
    ) -> None:
        cacheable = event.not_cacheable is None
        if not cacheable:
            self._counts.not_cacheable[event.not_cacheable or ""] += 1
        if event.layer is not None:
            self._counts.layers[event.layer] += 1
        if event.tenant_name and event.tenant not in self._counts.tenant_names:
            self._counts.tenant_names[event.tenant] = event.tenant_name
        groups = [
            self._counts.total,
            self._group(self._counts.by_tenant, event.tenant),
            self._group(self._counts.by_model, event.model),
        ]
        window_s = self.options.window_s
        if window_s is not None and event.timestamp_s is not None:
            window = int(event.timestamp_s // window_s)
            groups.append(self._counts.by_window.setdefault(window, Tally()))
        for tally in groups:
            tally.add(cls, prompt, reused, cacheable)
            if not repeat.seen:
                tally.near_check(near.checked, fallback if near.match is not None else None)

    def _group(self, groups: dict[str, Tally], name: str) -> Tally:
        tally = groups.get(name)
        if tally is None:
            if len(groups) >= self.max_groups:
                name = OTHER
            tally = groups.setdefault(name, Tally())
        return tally

    def result(self) -> CensusResult:
        counts = {f.name: getattr(self._counts, f.name) for f in fields(CensusCounts)}
        return CensusResult(
            **counts,
            prefix=self._prefix.stats(),
            kv_sweep=self._prefix.sweep,
            prefix_bounded=self._prefix.evicted,
            identities_bounded=self._identities.forgot,
            near_duplicates_measured=self.near_measured,
        )
