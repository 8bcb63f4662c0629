"""Confidence intervals for a share seen as k of n: one Wilson score interval for every caller.

`wilson_interval(k, n)`: the two-sided Wilson score interval at `confidence` (95% by default),

    (p̂ + z²/2n ± z·√(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n),   p̂ = k/n,   z = Φ⁻¹(1 − (1 − c)/2)

It keeps its coverage near 0 and 1, where the plain normal interval collapses. With n = 0
nothing is known: (0, 1). `wilson_upper(k, n)` is the one-sided upper bound (z = Φ⁻¹(c)).
`sample_size(half_width)`: trials so that the two-sided interval of any share is at most
± `half_width` (the worst case, p = 1/2): ⌈z² / (4·half_width²)⌉, 9,604 for ± 1 point at 95%.

Callers: the semantic layer's live verification (semantic/verify.py: is the false-hit rate above
target?) and the traffic analyzer (analyze/: the near-duplicate share of a sample, and how
large a sample to check).
"""

from __future__ import annotations

import functools
import math
from statistics import NormalDist


@functools.lru_cache(maxsize=32)
def z_score(confidence: float, *, two_sided: bool = True) -> float:
    """The standard normal quantile for `confidence` (two-sided: both tails share the rest)."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2 if two_sided else confidence)


def _bounds(k: int, n: int, z: float) -> tuple[float, float]:
    if n < 0 or not 0 <= k <= max(n, 0):
        raise ValueError(f"need 0 <= k <= n, got {k}/{n}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    z2n = z * z / n
    centre = p + z2n / 2
    spread = z * math.sqrt(p * (1 - p) / n + z2n / (4 * n))
    return max(0.0, (centre - spread) / (1 + z2n)), min(1.0, (centre + spread) / (1 + z2n))


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """(lower, upper): the two-sided Wilson score interval on a share seen as `k` of `n`."""
    return _bounds(k, n, z_score(confidence))


def wilson_upper(k: int, n: int, confidence: float = 0.95) -> float:
    """The one-sided Wilson score upper bound on a share seen as `k` of `n`."""
    return _bounds(k, n, z_score(confidence, two_sided=False))[1]


def sample_size(half_width: float, confidence: float = 0.95) -> int:
    """Trials for a two-sided interval of at most ± `half_width` whatever the share."""
    if not 0 < half_width < 0.5:
        raise ValueError(f"half_width must be in (0, 0.5), got {half_width}")
    z = z_score(confidence)
    return math.ceil(z * z / (4 * half_width * half_width))
