"""`Outcomes`: everything the semantic layer learns from judged answers, in one place.

Verdicts arrive from three sources — live verification of a sample of hits, shadow judgments of
misses' best candidates (both through verify.Verifier), and complaints — and feed:
- the global threshold: in calibrated mode `verify.LiveThreshold` (the configured threshold,
  tightened when verified hits are wrong too often, persisted); in shadow mode
  `shadow.LiveCalibration` (the operating point certified by judged live traffic, None while in
  shadow, persisted);
- per-answer statistics (`answer_stats.AnswerStats`), which move each answer's own threshold
  around the global one.
The layer asks `threshold` (the global one) and `threshold_of(group, base)` on every lookup.
Thread-safe: each part holds its own lock.
"""

from __future__ import annotations

from typing import Any

from infercache.metrics import StrategyMetrics
from infercache.semantic.answer_stats import AnswerStats, GroupKey
from infercache.semantic.layer_config import SemanticConfig
from infercache.semantic.shadow import LiveCalibration
from infercache.semantic.verify import FalseHitMonitor, LiveThreshold, Tightened
from infercache.stores.base import MetaStore


class Outcomes:
    def __init__(
        self,
        meta: MetaStore,
        *,
        config: SemanticConfig,
        embedder_name: str,
        metrics: StrategyMetrics,
        monitor: FalseHitMonitor | None,
    ) -> None:
        self._metrics = metrics
        self.floor = config.floor
        self.answer_stats = AnswerStats(config.answer_stats) if config.answer_stats else None
        self.calibration: LiveCalibration | None = None
        self.live_threshold: LiveThreshold | None = None
        if config.shadow is not None:
            self.calibration = LiveCalibration(
                meta,
                name=f"{config.matcher.name}:{embedder_name}",
                target_false_hit=config.shadow.target_false_hit,
                metrics=metrics,
                min_pairs=config.shadow.min_pairs,
                window=config.shadow.window,
            )
        else:
            assert config.threshold is not None  # SemanticConfig checks it
            self.live_threshold = LiveThreshold(
                meta,
                configured=config.threshold,
                embedder_name=embedder_name,
                metrics=metrics,
                monitor=monitor,
            )

    @property
    def threshold(self) -> float | None:
        """The global threshold served at now (None: in shadow, nothing is served), never
        below the floor."""
        if self.calibration is not None:
            value = self.calibration.operating_point
        else:
            assert self.live_threshold is not None
            value = self.live_threshold.value
        return None if value is None else self._floored(value)

    def _floored(self, value: float) -> float:
        return value if self.floor is None else max(value, self.floor)

    @property
    def learns_from_misses(self) -> bool:
        """Whether a judged miss can change anything (per-answer statistics or calibration)."""
        return self.answer_stats is not None or self.calibration is not None

    def threshold_of(self, group: GroupKey, base: float) -> float:
        """The score a candidate of answer `group` needs when the global threshold is `base`."""
        if self.answer_stats is None:
            return base
        return self._floored(self.answer_stats.threshold(group, base))

    def note_lookup(self) -> None:
        if self.calibration is not None:
            self.calibration.note_lookup()

    def judged(self, score: float, group: GroupKey | None, wrong: bool, *, hit: bool) -> None:
        """A judge's verdict on an answer served (`hit`) or one a miss would have served."""
        self._metrics.count("pairs_judged")
        if wrong:
            self._metrics.count("pairs_judged_wrong")
        if group is not None and self.answer_stats is not None:
            self.answer_stats.record(group, score, wrong)
        if self.calibration is not None:
            self.calibration.record(score, wrong)
        elif hit and self.live_threshold is not None:
            self.live_threshold.on_verdict(score, wrong)

    def complaint(self, score: float, group: GroupKey | None) -> None:
        """A served answer reported wrong: its answer's floor rises above `score`, and it
        counts as a wrong verdict for the global threshold."""
        self._metrics.count("complaints")
        if group is not None and self.answer_stats is not None:
            self.answer_stats.complain(group, score)
        if self.calibration is not None:
            self.calibration.record(score, True)
        elif self.live_threshold is not None:
            self.live_threshold.on_verdict(score, True, complaint=True)

    def tighten(self, event: Tightened) -> None:
        if self.live_threshold is not None:
            self.live_threshold.tighten(event)

    def state(self) -> dict[str, Any]:
        threshold = self.threshold
        return {
            "mode": "shadow" if self.calibration is not None else "calibrated",
            "serving": threshold is not None,
            "threshold": threshold,
            "calibration": self.calibration.state().to_dict() if self.calibration else None,
            "answer_groups": len(self.answer_stats) if self.answer_stats is not None else 0,
        }
