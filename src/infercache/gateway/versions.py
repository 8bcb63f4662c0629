"""Model swap detection: keep the cache's model versions in step with what the upstream serves.

What counts as a version change (each recorded in the store, so every gateway on it agrees, and
in `/stats` with its evidence):
- a `version` in the upstream's `/v1/models` (the built-in engine reports its weights digest);
- a version set by the admin API (`POST /admin/model-version`) or the CLI (`set-model-version`);
- for upstreams that offer nothing but `system_fingerprint`s: a fingerprint never seen before
  that displaces every earlier one for a sustained window (fingerprints.py). Several
  fingerprints answering at once are one model on several backend configurations: the cache
  keeps hitting across them.
A change made anywhere else (another gateway, the CLI) is seen in the store's version token on
the next lookup; the fingerprints after it belong to it, so it is never undone by the next
answer. A change logs one INFO line, with what was retired.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any, NamedTuple

from infercache.cache import Cache
from infercache.errors import StoreError
from infercache.gateway.fingerprints import Displacement, FingerprintWatch, SwapWindow
from infercache.versions import VersionView

log = logging.getLogger(__name__)

_CHANGES_KEPT = 20


class VersionChange(NamedTuple):
    """One recorded change, for /stats."""

    model: str
    version: str
    previous: str | None
    source: str  # "/v1/models", "admin", "system_fingerprint"
    evidence: str
    at_s: float


class ModelVersionTracker:
    """Keeps no version of its own: the store's is the truth, read on every lookup, so a store
    restarted empty, a version set from the CLI or another gateway, or a failed write is
    repaired by the evidence that follows. Does store I/O: call it off the event loop.
    Thread-safe."""

    def __init__(
        self, cache: Cache, *, use_fingerprints: bool = True, window: SwapWindow | None = None
    ) -> None:
        self._cache = cache
        self._use_fingerprints = use_fingerprints
        self._window = window or SwapWindow()
        self._watches: dict[str, FingerprintWatch] = {}
        self._changes: deque[VersionChange] = deque(maxlen=_CHANGES_KEPT)
        self._lock = threading.Lock()
        self.swaps = 0

    def observe(self, model: str, version: str, source: str, evidence: str = "") -> bool:
        """Record that `model` is now served at `version`; True if that changed it."""
        try:
            previous = self._cache.model_version(model)
            changed = self._cache.set_model_version(model, version)
        except StoreError as exc:
            log.warning("could not record version %s of %s: %s", version, model, exc)
            return False
        if not changed:
            return False
        self.swaps += 1
        with self._lock:
            self._changes.append(
                VersionChange(model, version, previous, source, evidence, self._now_s())
            )
        log.info(
            "model %s is now version %s, was %s (from %s%s): entries stored before are retired",
            model, version, previous or "unversioned", source, f": {evidence}" if evidence else "",
        )  # fmt: skip
        return True

    def observe_models(self, models: Iterable[dict[str, Any]]) -> None:
        for m in models:
            if isinstance(m.get("id"), str) and isinstance(m.get("version"), str) and m["version"]:
                self.observe(m["id"], m["version"], "/v1/models")

    def observe_response(
        self, model: str, response: dict[str, Any], seen: VersionView | None
    ) -> None:
        """Note the answer's fingerprint (fingerprints.py decides whether newcomers displaced
        the earlier ones). `seen`: what the request's lookup read from the store (None: it could
        not read it)."""
        fingerprint = response.get("system_fingerprint")
        if not (self._use_fingerprints and isinstance(fingerprint, str) and fingerprint):
            return
        now_s = self._now_s()
        with self._lock:
            watch = self._watches.setdefault(model, FingerprintWatch(self._window))
            displacement = watch.observe(
                fingerprint, now_s, seen.model_version if seen is not None else None
            )
        if displacement is not None:
            self._record_displacement(model, watch, displacement, now_s)

    def _record_displacement(
        self, model: str, watch: FingerprintWatch, displacement: Displacement, now_s: float
    ) -> None:
        self.observe(model, displacement.version, "system_fingerprint", displacement.describe())
        try:
            token: str | None = self._cache.exact.versions.view(model, ()).model_version
        except StoreError:
            token = None  # the next lookup's token starts the next epoch
        with self._lock:
            watch.swapped(displacement, token, now_s)

    def snapshot(self) -> dict[str, Any]:
        """/stats: what counts as a change, each model's fingerprints, the recent changes."""
        now_s = self._now_s()
        with self._lock:
            return {
                "fingerprints_are_versions": False,
                "fingerprint_swap_window": {
                    "seconds": self._window.seconds,
                    "answers": self._window.answers,
                },
                "models": {m: w.snapshot(now_s) for m, w in self._watches.items()},
                "changes": [c._asdict() for c in self._changes],
            }

    def _now_s(self) -> float:
        return self._cache.clock.now_s()
