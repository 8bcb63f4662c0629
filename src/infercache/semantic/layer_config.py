"""What the semantic layer is built with: `SemanticConfig` (and `ShadowConfig` for shadow mode).
Frozen values passed down from settings (setup.py) or built by a library caller; re-exported by
layer.py.

Two ways to decide the global threshold:
- calibrated (`threshold` set, `shadow` None): serve from the start at the threshold `tune`
  chose; live verification may only tighten it (verify.LiveThreshold).
- shadow (`shadow` set): serve nothing until judged live traffic shows an operating point whose
  false-hit upper bound meets the target (shadow.LiveCalibration); `threshold` is unused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infercache.semantic.answer_stats import AnswerStatsConfig
from infercache.semantic.matcher import CosineMatcher, Matcher


@dataclass(frozen=True, slots=True)
class ShadowConfig:
    target_false_hit: float = 0.01
    min_pairs: int = 300  # judged pairs at the operating point before serving
    window: int = 5000  # judged pairs kept (the most recent)
    refit_every: int = 0  # judged pairs between background refits of the head (0: never)

    def __post_init__(self) -> None:
        if not 0 < self.target_false_hit < 1:
            raise ValueError(f"target_false_hit must be in (0, 1), got {self.target_false_hit}")
        if not 1 <= self.min_pairs <= self.window:
            raise ValueError(f"need 1 <= min_pairs <= window, got {self.min_pairs}, {self.window}")


@dataclass(frozen=True, slots=True)
class SemanticConfig:
    threshold: float | None  # on the matcher's score scale, from `infercache tune`; never a default
    k: int = 4  # neighbours examined per lookup (at least what the matcher needs)
    max_vectors: int = 1_000_000  # in-process index bound (oldest dropped first)
    store_hits_as_exact: bool = False  # also store a semantic hit under the new wording's key
    matcher: Matcher = field(default_factory=CosineMatcher)
    shadow: ShadowConfig | None = None
    answer_stats: AnswerStatsConfig | None = field(default_factory=AnswerStatsConfig)
    """Per-answer thresholds (answer_stats.py); None: one global threshold for every answer."""
    floor: float | None = None
    """On the matcher's scale: what unrelated questions reach (`tune`, tuning/replay.py). No
    threshold — calibrated, tightened, shadow's operating point or an answer's own — is
    applied below it."""
    judge_margin: float = 0.1
    """Serving, a miss's best candidate is judged when it scored within this of the threshold
    (its verdict can move its answer's threshold); in shadow every best candidate is."""

    def __post_init__(self) -> None:
        if self.threshold is None and self.shadow is None:
            raise ValueError("a semantic threshold is needed unless the layer runs in shadow")
        if self.threshold is not None and not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must lie in [-1, 1], got {self.threshold}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.judge_margin < 0:
            raise ValueError(f"judge_margin must be >= 0, got {self.judge_margin}")
