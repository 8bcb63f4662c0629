"""The recommendation's thresholds, and how its figures are written: `RecommendRules`, the
formats every table and reason of the report share (`pct`, `seconds`, ...), and `at(report,
path)`, the report's value at a path of keys (what a reason's quote points to), in the figures'
tree (report_tree.py) or in the JSON document alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PathKey = str | int


@dataclass(frozen=True, slots=True)
class RecommendRules:
    min_exact_request_share: float = 0.05
    min_semantic_request_share: float = 0.05
    min_prefix_saving: float = 0.10
    alarm_fraction: float = 0.5
    ttl_coverage: float = 0.8  # advise a longer TTL when fewer repeats than this come back in it


def pct(value: float) -> str:
    """A share as every table of the report shows it."""
    return f"{100 * value:.1f}%"


def seconds(value: float) -> str:
    return f"{value:,.0f} s" if value >= 10 else f"{value:,.2f} s"


def milliseconds(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 10 else f"{value:,.2f} ms"


def duration(value: float) -> str:
    """A span of time: seconds, minutes, hours or days, whichever reads best."""
    if value >= 86_400:
        return f"{value / 86_400:.1f} d"
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.3g} s"


def dollars(value: float) -> str:
    return f"${value:,.2f}"


def tokens(value: float) -> str:
    return f"{value:,.0f} tokens"


def at(report: object, path: Sequence[PathKey]) -> Any:
    """The report's value at `path` (keys and list indexes): a key names a tree node's field,
    or a mapping's entry."""
    node: Any = report
    for key in path:
        if isinstance(key, str) and dataclasses.is_dataclass(node):
            node = getattr(node, key)
        else:
            node = node[key]
    return node
