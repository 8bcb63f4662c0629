"""Live verification of semantic hits: is the threshold still right for today's traffic?

A configurable share (`sample_rate`) of semantic hits is also sent upstream in the background;
the client already has its cached answer and never waits. A `Judge` compares the cached answer
with the fresh one. The `FalseHitMonitor` keeps the running count (n verified, k judged
different) and its Wilson score interval at 95% (two-sided, z = 1.96):

    centre = (p̂ + z²/2n) / (1 + z²/n),   half = z·√(p̂(1−p̂)/n + z²/4n²) / (1 + z²/n)

When the interval's LOWER bound exceeds `target_false_hit`, the false-hit rate is above target
with 95% confidence, and the threshold tightens by itself: to just above the similarity of the
closest wrong hit seen in this window, and at least by `step` (capped at `max_threshold`). The
window then restarts, since the new threshold changes the population being measured. Every
tightening is logged and counted; the estimate and its bounds are gauges.

The judges live in judges.py. `LiveThreshold` is the threshold the layer applies: the
configured one, raised by each `Tightened` event and kept in the store's meta under
`semantic:threshold:{embedder name}` as `{"configured", "current"}`, so it survives restarts
until the operator configures a different threshold (then theirs wins).
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from infercache.errors import StoreError
from infercache.intervals import wilson_interval
from infercache.metrics import StrategyMetrics
from infercache.semantic.judges import Judge
from infercache.stores.base import MetaStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Tightened:
    old_threshold: float
    new_threshold: float
    false_hits: int
    verified: int


class FalseHitMonitor:
    """Running false-hit estimate; decides when the threshold must tighten. Thread-safe."""

    def __init__(
        self,
        *,
        target_false_hit: float,
        min_verified: int = 20,
        step: float = 0.01,
        max_threshold: float = 0.999,
    ) -> None:
        if not 0 < target_false_hit < 1:
            raise ValueError(f"target_false_hit must be in (0, 1), got {target_false_hit}")
        self.target_false_hit = target_false_hit
        self._min_verified = min_verified
        self._step = step
        self._max = max_threshold
        self._lock = threading.Lock()
        self.verified = 0
        self.false_hits = 0
        self._closest_wrong: float | None = None

    def interval(self) -> tuple[float, float]:
        with self._lock:
            return wilson_interval(self.false_hits, self.verified)

    def estimate(self) -> float:
        with self._lock:
            return self.false_hits / self.verified if self.verified else 0.0

    def record(self, similarity: float, wrong: bool, threshold: float) -> Tightened | None:
        """Add one verdict; a `Tightened` when the threshold must rise to its new value."""
        with self._lock:
            self.verified += 1
            if wrong:
                self.false_hits += 1
                if self._closest_wrong is None or similarity > self._closest_wrong:
                    self._closest_wrong = similarity
            lower, _ = wilson_interval(self.false_hits, self.verified)
            if self.verified < self._min_verified or lower <= self.target_false_hit:
                return None
            above_wrong = (self._closest_wrong or threshold) + 1e-4
            new = min(self._max, max(threshold + self._step, above_wrong))
            event = Tightened(threshold, new, self.false_hits, self.verified)
            self.verified = self.false_hits = 0
            self._closest_wrong = None
            return event


Fetch = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(eq=False, repr=False)
class Verifier:
    """Judges cached answers against fresh ones, in the background on `executor`: a sampled
    share of hits (`sampled`, then `judge_later` with a fetch: the client already has its
    answer) and the best candidates of misses (`judge_later` with the fresh answer in hand).
    `then(wrong)` hears each verdict on the executor's thread; a judge or fetch that fails
    gives no verdict (logged)."""

    judge: Judge
    monitor: FalseHitMonitor
    _: KW_ONLY
    sample_rate: float
    rng: random.Random
    executor: Executor  # where judgments (and shadow refits) run
    _rng_lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.sample_rate <= 1:
            raise ValueError(f"sample_rate must be in [0, 1], got {self.sample_rate}")

    def sampled(self) -> bool:
        """Whether to verify this hit (true with probability `sample_rate`)."""
        with self._rng_lock:
            return self.rng.random() < self.sample_rate

    def judge_later(
        self,
        request: Mapping[str, Any],
        cached: Mapping[str, Any],
        fresh: Mapping[str, Any] | Fetch,
        then: Callable[[bool], None],
    ) -> None:
        asked = dict(request)  # copied now, on the caller's thread

        def judge() -> None:
            try:
                answer = fresh(asked) if callable(fresh) else fresh
                same = self.judge.same(asked, cached, answer)
            except Exception as exc:  # noqa: BLE001 - a background check must never take down serving
                log.warning("semantic judgment failed (not counted): %r", exc)
                return
            then(not same)

        self.executor.submit(judge)


class LiveThreshold:
    """The configured threshold (on the matcher's score scale) the layer applies, fed by
    verification verdicts (`on_verdict`, from the Verifier's thread) and persisted in the
    store's meta. Thread-safe."""

    def __init__(
        self,
        meta: MetaStore,
        *,
        configured: float,
        embedder_name: str,
        metrics: StrategyMetrics,
        monitor: FalseHitMonitor | None = None,
    ) -> None:
        self.configured = configured
        self.monitor = monitor
        self._meta = meta
        self._meta_name = f"semantic:threshold:{embedder_name}"
        self._metrics = metrics
        self._lock = threading.Lock()
        self._value = self._load()
        metrics.gauge("threshold", self._value)

    @property
    def value(self) -> float:
        return self._value

    def _load(self) -> float:
        """The configured threshold, or the one live verification tightened it to since."""
        try:
            raw = self._meta.read_meta([self._meta_name]).get(self._meta_name)
        except StoreError as exc:
            log.warning("could not read the stored semantic threshold: %s", exc)
            return self.configured
        if raw is None:
            return self.configured
        saved = json.loads(raw)
        if saved.get("configured") != self.configured:
            return self.configured  # the operator re-tuned: their value wins
        return float(saved["current"])

    def on_verdict(self, score: float, wrong: bool, *, complaint: bool = False) -> None:
        """One verified hit at `score` (the matcher's scale), or a `complaint` about one:
        count it, maybe tighten."""
        if not complaint:
            self._metrics.count("verified")
            if wrong:
                self._metrics.count("verified_false_hits")
        if self.monitor is None:
            return
        event = self.monitor.record(score, wrong, self._value)
        lower, upper = self.monitor.interval()
        self._metrics.gauge("false_hit_estimate", self.monitor.estimate())
        self._metrics.gauge("false_hit_lower", lower)
        self._metrics.gauge("false_hit_upper", upper)
        if event is not None:
            self.tighten(event)

    def tighten(self, event: Tightened) -> None:
        with self._lock:
            self._value = max(self._value, event.new_threshold)
            current = self._value
        self._metrics.count("threshold_tightened")
        self._metrics.gauge("threshold", current)
        log.warning(
            "semantic false-hit rate above target (%d of %d verified hits wrong): "
            "threshold %.4f -> %.4f",
            event.false_hits,
            event.verified,
            event.old_threshold,
            current,
        )
        saved = json.dumps({"configured": self.configured, "current": current})
        try:
            self._meta.write_meta(self._meta_name, saved)
        except StoreError as exc:
            log.warning("could not persist the tightened threshold: %s", exc)
