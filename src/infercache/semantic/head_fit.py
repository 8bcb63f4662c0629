"""The fitted matcher's head, learnt: a logistic regression (L2, Newton steps) from candidate
features (matcher.features) to "its answer is right". Used offline by `tune --fit`
(tuning/fit.py) and live by shadow mode's background refit (shadow_fit.py). Pure numpy."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from infercache.errors import InvalidRequestError
from infercache.semantic.matcher import FEATURES, Head


def fit_head(
    x: npt.NDArray[np.float64],
    right: npt.NDArray[np.float64],
    k: int,
    *,
    background: float,
    l2: float = 1e-3,
    min_seen: int = 1,
) -> Head:
    """The head whose probability best predicts `right` (1.0 / 0.0) from the rows of `x`."""
    if len(np.unique(right)) < 2:
        raise InvalidRequestError("the head needs both same- and different-answer candidates")
    design = np.hstack([x, np.ones((len(x), 1))])
    w = np.zeros(design.shape[1])
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ w, -60, 60)))
        gradient = design.T @ (p - right) + l2 * w
        hessian = (design * (p * (1 - p))[:, None]).T @ design + l2 * np.eye(len(w))
        step = np.linalg.solve(hessian, gradient)
        w -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    weights = tuple(float(v) for v in w[:FEATURES])
    return Head(
        weights=weights, bias=float(w[FEATURES]), k=k, background=background, min_seen=min_seen
    )
