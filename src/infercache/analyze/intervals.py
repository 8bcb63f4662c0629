"""Confidence intervals for the shares the analyzer estimates from a sample.

`wilson_interval(k, n)`: the two-sided Wilson score interval for a proportion seen as k of n,
(p̂ + z²/2n ± z·√(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n), z = Φ⁻¹(1 − (1 − confidence)/2). It keeps
its coverage near 0 and 1, where the plain normal interval collapses.
`sample_size(half_width)`: requests to check so that the 95% interval of any share is at most
± `half_width` (the worst case, p = 1/2): ⌈z² / (4·half_width²)⌉, 9,604 for ± 1 point.
"""

from __future__ import annotations

import math
from statistics import NormalDist


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got {k}/{n}")
    z = _z(confidence)
    p = k / n
    z2n = z * z / n
    centre = p + z2n / 2
    spread = z * math.sqrt(p * (1 - p) / n + z2n / (4 * n))
    return max(0.0, (centre - spread) / (1 + z2n)), min(1.0, (centre + spread) / (1 + z2n))


def sample_size(half_width: float, confidence: float = 0.95) -> int:
    if not 0 < half_width < 0.5:
        raise ValueError(f"half_width must be in (0, 0.5), got {half_width}")
    z = _z(confidence)
    return math.ceil(z * z / (4 * half_width * half_width))
