"""One breaker per node of a Redis Cluster: a node that fails is skipped at once while the
others serve at full speed, and a watcher (cluster_nodes.py), never a request, finds it back.

    allow(node)              closed: True (no lock); open: False, counted as a skip
    failed(node, definite)   a definite failure (connection refused or reset, CLUSTERDOWN,
                             LOADING, a slot nobody serves) opens the node at once; a timeout
                             (a busy node answers late, a dead host never does) opens it after
                             `timeouts_to_open` in a row
    succeeded(node)          clears the node's timeouts (no lock unless it had some)
    close(node)              the watcher saw the node serve again: its keys are read again

Why not the whole-store breaker (store_guard.py): with one master of three down, a third of the
calls fail and the rest succeed, so counting consecutive failures either never opens (every
call to the dead master pays its failure) or, by chance, opens for every key. Why not probes
made by requests: each probe of a dead node costs the request that makes it.

`on_open` is called (outside the lock) whenever a node opens, to wake the watcher. Thread-safe;
the injected clock stamps when each node opened.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infercache.clock import Clock

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class NodeBreakerSettings:
    timeouts_to_open: int = 3
    watch_every_s: float = 0.1  # how often the watcher looks at the open nodes

    def __post_init__(self) -> None:
        if self.timeouts_to_open < 1:
            raise ValueError(f"timeouts_to_open must be >= 1, got {self.timeouts_to_open}")
        if self.watch_every_s <= 0:
            raise ValueError(f"watch_every_s must be > 0, got {self.watch_every_s}")


class NodeBreakers:
    def __init__(
        self,
        clock: Clock,
        settings: NodeBreakerSettings | None = None,
        *,
        on_open: Callable[[], object] | None = None,
    ) -> None:
        self.settings = settings or NodeBreakerSettings()
        self._clock = clock
        self._on_open = on_open
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._open: dict[str, float] = {}  # node → when it opened (monotonic)
        self._timeouts: dict[str, int] = {}
        self._skipped: Counter[str] = Counter()
        self._opened: Counter[str] = Counter()

    def allow(self, node: str) -> bool:
        if node not in self._open:  # the hot path takes no lock
            return True
        with self._lock:
            self._skipped[node] += 1
        return False

    def failed(self, node: str, *, definite: bool, why: object = "") -> None:
        with self._lock:
            if node in self._open:
                return
            if not definite:
                self._timeouts[node] = self._timeouts.get(node, 0) + 1
                if self._timeouts[node] < self.settings.timeouts_to_open:
                    return
            self._timeouts.pop(node, None)
            self._open[node] = self._clock.monotonic_s()
            self._opened[node] += 1
        log.warning(
            "cache store node %s failing (%s): its keys are skipped until it serves again",
            node,
            why,
        )
        if self._on_open is not None:
            self._on_open()

    def is_open(self, node: str) -> bool:
        """Like `allow`, without counting a skip."""
        return node in self._open

    def succeeded(self, node: str) -> None:
        if node in self._timeouts:
            with self._lock:
                self._timeouts.pop(node, None)

    def close(self, node: str) -> bool:
        """The node serves again; False if it was not open."""
        with self._lock:
            since = self._open.pop(node, None)
            self._changed.notify_all()
        if since is None:
            return False
        log.warning(
            "cache store node %s serves again after %.1f s: its keys are read again",
            node,
            self._clock.monotonic_s() - since,
        )
        return True

    def wait_closed(self, node: str, timeout_s: float) -> bool:
        """Wait (in real time) until `node` is closed; False at the timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: node not in self._open, timeout_s)

    def open_nodes(self) -> list[str]:
        with self._lock:
            return list(self._open)

    def health(self) -> dict[str, dict[str, Any]]:
        """Per node that ever failed: its state, how often it opened, calls skipped."""
        with self._lock:
            now = self._clock.monotonic_s()
            return {
                node: {
                    "breaker": "open" if node in self._open else "closed",
                    "open_for_s": round(now - self._open[node], 3) if node in self._open else 0,
                    "opened": self._opened[node],
                    "skipped": self._skipped[node],
                }
                for node in sorted(set(self._opened) | set(self._timeouts))
            }
