"""Per-answer acceptance statistics: each cached answer earns or loses its own threshold.

After vCache (arXiv 2502.03771): one global threshold is too strict for answers no other
question resembles and too loose for answers that sit next to a confusable one. Every judged
outcome — a shadow judgment of a miss's best candidate, a verified hit, a complaint — is an
observation (score, wrong) of the candidate's answer group: (scope, answer digest). Entries
with equal answers in one scope share a group (a support bot's intent); an answer of its own
is a group of one (an entry). Tenants never share groups (the scope holds the tenant).

The global threshold `base` (the calibrated or live operating point, on the matcher's score
scale) is the prior: a group without observations uses it. A group's threshold moves from it
by its own evidence:
- raise: every wrong observation at score s ≥ base − `band` lifts the group's threshold to at
  least s + `epsilon`; a complaint does so at any score. Never serving that answer at a score
  where it was judged wrong is what makes a reported answer stay unserved.
- lower: to the lowest right observation's score t ≥ base − `max_lower` such that at least
  `min_right` right observations lie in [t, base) and no wrong one lies at or above t − band
  (the threshold only ever drops to where right answers were actually seen).
The configured error bound stays the guarantee: the live monitors (verify.py, shadow.py)
measure every served answer and tighten or stop serving when it is exceeded.

Bounded memory: the last `max_observations` per group, the `max_groups` most recently touched
groups. Thread-safe (one lock); thresholds are cached per group until it changes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import NamedTuple


class GroupKey(NamedTuple):
    scope: str
    answer: str


@dataclass(frozen=True, slots=True)
class AnswerStatsConfig:
    band: float = 0.05
    max_lower: float = 0.02
    min_right: int = 8
    epsilon: float = 1e-4
    max_observations: int = 256
    max_groups: int = 100_000

    def __post_init__(self) -> None:
        if self.band < 0 or self.max_lower < 0 or self.min_right < 1:
            raise ValueError(f"bad answer statistics settings: {self}")


class _Group:
    __slots__ = ("cached", "complaint_floor", "observations")

    def __init__(self, size: int) -> None:
        self.observations: deque[tuple[float, bool]] = deque(maxlen=size)
        self.complaint_floor: float | None = None
        self.cached: tuple[float, float] | None = None  # (base, threshold)


class AnswerStats:
    def __init__(self, config: AnswerStatsConfig | None = None) -> None:
        self.config = config or AnswerStatsConfig()
        self._groups: OrderedDict[GroupKey, _Group] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._groups)

    def clear(self) -> None:
        """Forget every group (the matcher's scale changed: shadow_fit.py)."""
        with self._lock:
            self._groups.clear()

    def record(self, key: GroupKey, score: float, wrong: bool) -> None:
        with self._lock:
            group = self._group(key)
            group.observations.append((score, wrong))
            group.cached = None

    def complain(self, key: GroupKey, score: float) -> None:
        """A served answer was reported wrong at `score`: never serve it at that score again."""
        with self._lock:
            group = self._group(key)
            group.observations.append((score, True))
            floor = score + self.config.epsilon
            group.complaint_floor = max(group.complaint_floor or floor, floor)
            group.cached = None

    def threshold(self, key: GroupKey, base: float) -> float:
        """The score this group's candidates need, given the global threshold `base`."""
        with self._lock:
            group = self._groups.get(key)
            if group is None:
                return base
            if group.cached is not None and group.cached[0] == base:
                return group.cached[1]
            value = self._threshold(group, base)
            group.cached = (base, value)
            return value

    def observations(self, key: GroupKey) -> list[tuple[float, bool]]:
        with self._lock:
            group = self._groups.get(key)
            return list(group.observations) if group is not None else []

    def _threshold(self, group: _Group, base: float) -> float:
        c = self.config
        wrong = [s for s, w in group.observations if w and s >= base - c.band]
        floor = max([s + c.epsilon for s in wrong], default=-2.0)
        if group.complaint_floor is not None:
            floor = max(floor, group.complaint_floor)
        highest_wrong = max((s for s, w in group.observations if w), default=-2.0)
        right = sorted(
            (s for s, w in group.observations if not w and base - c.max_lower <= s < base),
            reverse=True,
        )
        value = base
        for count, score in enumerate(right, start=1):
            if highest_wrong >= score - c.band:
                break  # a wrong outcome this close below: no lower
            if count >= c.min_right:
                value = score
        return max(value, floor)

    def _group(self, key: GroupKey) -> _Group:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(self.config.max_observations)
            while len(self._groups) > self.config.max_groups:
                self._groups.popitem(last=False)
        else:
            self._groups.move_to_end(key)
        return group
