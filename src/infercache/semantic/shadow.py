"""Shadow mode: the layer calibrates itself on live traffic and serves only once it has shown,
on that traffic, that its answers stay within the error bound.

In shadow, every exact miss that reaches the layer still goes upstream; the layer notes its best
candidate (score on the matcher's scale, the candidate's stored answer) and, when the fresh
answer arrives, a judge (judges.py: exact, equality, embedding or llm) labels the pair: would
serving the candidate have been right? Each label is a judged pair (score, wrong).

`LiveCalibration` keeps the last `window` judged pairs. At an operating point t the would-be
hits are the pairs scoring ≥ t and the false-hit rate is the share of them judged wrong (the
share of served answers that would be wrong). The operating point is found by fixed-sequence
testing: starting at the strictest t with pairs enough scoring ≥ t (at least `min_pairs`, and
enough that the bound could be met with none wrong) and walking down the scores, each t is
accepted while the one-sided 95% Wilson upper bound of its rate is ≤
`target_false_hit` (calibrate.wilson_upper); the walk stops at the first t that fails, and the
last accepted one is the operating point. (Taking the lowest of all the points that pass would
pick the luckiest of many tests: measured, a point found that way served 6 wrong answers in 41
at a 5% target. Stopping at the first failure keeps the 95% level for the point chosen.) While
one exists the layer serves at it; the
moment it first exists is logged and counted (`calibration_started_serving`). Serving, the
layer keeps judging: every miss's best candidate (free: the request went upstream anyway) and a
sample of hits (live verification). When no operating point meets the bound any more, the
layer returns to shadow (`calibration_back_to_shadow`) until one does again.

Pairs judged while serving under-sample hits (only a share is verified) and keep every
lower-scoring miss: at thresholds below the one served, the measured rate leans towards the
lower-scoring, more error-prone pairs — a cautious bias. The window and the counts persist in
the store's meta (`semantic:calibration:{matcher name}`), written every `persist_every` pairs
and at every switch, so a restart resumes where it stopped. Thread-safe (one lock).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from infercache.errors import StoreError
from infercache.metrics import StrategyMetrics
from infercache.stores.base import MetaStore

log = logging.getLogger(__name__)


def wilson_uppers(
    failures: npt.NDArray[np.int64], trials: npt.NDArray[np.int64], confidence: float
) -> npt.NDArray[np.float64]:
    """`calibrate.wilson_upper`, vectorised over arrays of counts (trials ≥ 1)."""
    z = NormalDist().inv_cdf(confidence)
    n = trials.astype(np.float64)
    p = failures / n
    z2n = z * z / n
    spread = z * np.sqrt(p * (1 - p) / n + z2n / (4 * n))
    return np.minimum(1.0, (p + z2n / 2 + spread) / (1 + z2n))


class OperatingPoint(NamedTuple):
    serving_at: float | None  # the certified score threshold (None: no point meets the bound)
    at: float | None  # where the walk stopped or served
    rate: float | None
    upper: float | None


def operating_point(
    scores: npt.NDArray[np.float64],
    wrong: npt.NDArray[np.bool_],
    target: float,
    min_pairs: int,
    confidence: float = 0.95,
) -> OperatingPoint:
    """Fixed-sequence testing over judged pairs (module docstring): from the strictest point
    with pairs enough that it could pass with none wrong, walk down while each point's one-sided
    Wilson upper bound is <= `target`; the last accepted point is served."""
    none = OperatingPoint(None, None, None, None)
    if len(scores) < min_pairs:
        return none
    order = np.argsort(-scores, kind="stable")
    scores, wrong = scores[order], wrong[order]
    served = np.arange(1, len(scores) + 1)
    wrong_served = np.cumsum(wrong.astype(np.int64))
    at = np.flatnonzero(np.append(scores[1:] < scores[:-1], True) & (served >= min_pairs))
    if len(at) == 0:
        return none
    upper = wilson_uppers(wrong_served[at], served[at], confidence)
    rate = wrong_served[at] / served[at]
    # `at` runs from the strictest point down. The walk starts at the first point with pairs
    # enough that it could pass at all (with none wrong): a rule on counts alone, not on the
    # verdicts, so it does not spend the test.
    clean_upper = wilson_uppers(np.zeros_like(served[at]), served[at], confidence)
    start = int(np.argmax(clean_upper <= target))
    fails = upper[start:] > target
    accepted = int(np.argmax(fails)) if fails.any() else len(fails)
    if clean_upper[start] > target:
        accepted = 0  # no point has pairs enough yet
    if accepted:
        i = start + accepted - 1
    else:  # in shadow: the bound where the walk stopped (or the lowest, before it can start)
        i = start if clean_upper[start] <= target else int(np.argmin(upper))
    point = float(scores[at[i]])
    return OperatingPoint(point if accepted else None, point, float(rate[i]), float(upper[i]))


@dataclass(frozen=True, slots=True)
class CalibrationState:
    serving: bool
    operating_point: float | None
    """Score threshold served at (None: in shadow)."""
    pairs_judged: int
    """Judged pairs since the calibration began (the window holds the latest of them)."""
    window_pairs: int
    would_be_hit_rate: float | None
    """Share of recent lookups whose best candidate scores ≥ the (best) operating point."""
    false_hit_rate: float | None
    false_hit_upper: float | None
    """95% upper bound at the operating point; in shadow, at the point where the walk down
    stopped (or the lowest bound over ≥ min_pairs pairs before any point has pairs enough)."""
    target_false_hit: float
    min_pairs: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LiveCalibration:
    def __init__(
        self,
        meta: MetaStore,
        *,
        name: str,
        target_false_hit: float,
        metrics: StrategyMetrics,
        min_pairs: int = 300,
        window: int = 5000,
        confidence: float = 0.95,
        persist_every: int = 50,
    ) -> None:
        if not 0 < target_false_hit < 1 or min_pairs < 1 or window < min_pairs:
            raise ValueError(
                f"need 0 < target < 1 and 1 <= min_pairs <= window, got {target_false_hit}, "
                f"{min_pairs}, {window}"
            )
        self.target_false_hit = target_false_hit
        self.min_pairs = min_pairs
        self._confidence = confidence
        self._meta = meta
        self._meta_name = f"semantic:calibration:{name}"
        self._metrics = metrics
        self._persist_every = persist_every
        self._lock = threading.Lock()
        self._pairs: deque[tuple[float, bool, int]] = deque(maxlen=window)  # + lookup seq
        self._judged = 0
        self._lookups = 0
        self._operating_point: float | None = None
        self._best: tuple[float | None, float | None, float | None] = (None, None, None)
        self._load()
        self._publish()

    @property
    def operating_point(self) -> float | None:
        """The score threshold to serve at, or None while in shadow."""
        return self._operating_point

    def note_lookup(self) -> None:
        """A lookup reached the layer (the would-be hit rate's denominator)."""
        with self._lock:
            self._lookups += 1

    def record(self, score: float, wrong: bool) -> None:
        """One judged pair; may start serving or return to shadow."""
        with self._lock:
            self._pairs.append((score, wrong, self._lookups))
            self._judged += 1
            before = self._operating_point
            self._recompute()
            switched = (before is None) != (self._operating_point is None)
            persist = switched or self._judged % self._persist_every == 0
            state = self._state()
        if switched:
            self._announce(state)
        if persist:
            self._save()
        self._publish(state)

    def state(self) -> CalibrationState:
        with self._lock:
            return self._state()

    def _recompute(self) -> None:
        """The lowest score reached walking down while each meets the bound (module docstring)."""
        scores = np.array([p[0] for p in self._pairs])
        wrong = np.array([p[1] for p in self._pairs], dtype=bool)
        point = operating_point(
            scores, wrong, self.target_false_hit, self.min_pairs, self._confidence
        )
        self._operating_point = point.serving_at
        self._best = (point.at, point.rate, point.upper)

    def reset(self, pairs: list[tuple[float, bool]], name: str) -> None:
        """Replace the judged pairs by `pairs` (the same judgments rescored on a new matcher's
        scale, shadow_fit.py) and persist under `name` from now on (a restart, back on the
        configured matcher, must not read them)."""
        with self._lock:
            before = self._operating_point
            # Both windows hold the latest judgments in time order: the rescored ones keep the
            # lookup positions of the ones they replace, aligned from the newest (the would-be
            # hit rate's denominator), the oldest position for any beyond this window's.
            kept = [seq for _, _, seq in self._pairs][-len(pairs) :] if pairs else []
            oldest = kept[0] if kept else self._lookups
            seqs = [oldest] * (len(pairs) - len(kept)) + kept
            self._pairs.clear()
            self._pairs.extend(
                (score, wrong, seq) for (score, wrong), seq in zip(pairs, seqs, strict=True)
            )
            self._meta_name = f"semantic:calibration:{name}"
            self._recompute()
            switched = (before is None) != (self._operating_point is None)
            state = self._state()
        if switched:
            self._announce(state)
        self._save()
        self._publish(state)

    def _state(self) -> CalibrationState:
        best_point, rate, upper = self._best
        would_be = None
        if best_point is not None and self._pairs:
            span = self._lookups - self._pairs[0][2] + 1
            would_be = sum(1 for s, _, _ in self._pairs if s >= best_point) / max(1, span)
        return CalibrationState(
            serving=self._operating_point is not None,
            operating_point=self._operating_point,
            pairs_judged=self._judged,
            window_pairs=len(self._pairs),
            would_be_hit_rate=min(1.0, would_be) if would_be is not None else None,
            false_hit_rate=rate,
            false_hit_upper=upper,
            target_false_hit=self.target_false_hit,
            min_pairs=self.min_pairs,
        )

    def _announce(self, state: CalibrationState) -> None:
        if state.serving:
            self._metrics.count("calibration_started_serving")
            log.warning(
                "semantic layer leaves shadow: serving at score >= %.4f (%d pairs judged, "
                "false-hit upper bound %.4f <= %.4f)",
                state.operating_point,
                state.pairs_judged,
                state.false_hit_upper,
                self.target_false_hit,
            )
        else:
            self._metrics.count("calibration_back_to_shadow")
            log.warning(
                "semantic layer back in shadow: no operating point keeps the false-hit upper "
                "bound <= %.4f any more (%d pairs judged)",
                self.target_false_hit,
                state.pairs_judged,
            )

    def _publish(self, state: CalibrationState | None = None) -> None:
        s = state or self.state()
        m = self._metrics
        m.gauge("calibration_serving", float(s.serving))
        m.gauge("calibration_pairs_judged", s.pairs_judged)
        for name, value in (
            ("calibration_operating_point", s.operating_point),
            ("calibration_false_hit_upper", s.false_hit_upper),
            ("calibration_would_be_hit_rate", s.would_be_hit_rate),
        ):
            if value is not None:
                m.gauge(name, value)

    def _save(self) -> None:
        with self._lock:
            # Each pair's lookup position relative to now (<= 0): a restart resumes the would-be
            # hit rate over the lookups the pairs came from.
            now = self._lookups
            body = {"judged": self._judged, "pairs": [[s, w, q - now] for s, w, q in self._pairs]}
        try:
            self._meta.write_meta(self._meta_name, json.dumps(body, separators=(",", ":")))
        except StoreError as exc:
            log.warning("could not persist the semantic calibration: %s", exc)

    def _load(self) -> None:
        try:
            raw = self._meta.read_meta([self._meta_name]).get(self._meta_name)
        except StoreError as exc:
            log.warning("could not read the semantic calibration: %s", exc)
            return
        if raw is None:
            return
        body = json.loads(raw)
        self._pairs.extend(
            (float(p[0]), bool(p[1]), int(p[2]) if len(p) > 2 else 0) for p in body["pairs"]
        )
        self._judged = int(body["judged"])
        self._recompute()
