"""Model swap detection: keep the cache's model versions in step with what the upstream serves.

Two signals, either enough:
- `/v1/models` (polled): an entry carrying a `version` (the built-in engine reports its weights
  digest there) is the model's version.
- `system_fingerprint` on answers: a model's first fingerprint is its version; a different one
  later means the upstream now runs something else.
On a change the tracker calls `Cache.set_model_version` (every older entry unreachable at once)
and logs it. An answer is stored under the version that produced it (its fingerprint) and only
if that version is current, so neither an old answer nor the one revealing a swap is ever served
under the wrong version.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from infercache.cache import Cache
from infercache.errors import StoreError
from infercache.versions import VersionView

log = logging.getLogger(__name__)


class ModelVersionTracker:
    """Keeps no version of its own: the store's is the truth, read on every lookup, so a store
    restarted empty, a version set from the CLI or another gateway, or a failed write is
    repaired by the next answer whose fingerprint differs from what its lookup saw. Does store
    I/O: call it off the event loop."""

    def __init__(self, cache: Cache, *, use_fingerprints: bool = True) -> None:
        self._cache = cache
        self._use_fingerprints = use_fingerprints
        self.swaps = 0

    def observe(self, model: str, version: str, source: str) -> bool:
        """Record that `model` is now served at `version`; True if that is a swap."""
        try:
            changed = self._cache.set_model_version(model, version)
        except StoreError as exc:
            log.warning("could not record version %s of %s: %s", version, model, exc)
            return False
        if changed:
            self.swaps += 1
            log.warning(
                "model %s is now version %s (from %s): older entries retired",
                model,
                version,
                source,
            )
        return changed

    def observe_models(self, models: Iterable[dict[str, Any]]) -> None:
        for m in models:
            if isinstance(m.get("id"), str) and isinstance(m.get("version"), str) and m["version"]:
                self.observe(m["id"], m["version"], "/v1/models")

    def observe_response(
        self, model: str, response: dict[str, Any], seen: VersionView | None
    ) -> str | None:
        """Note the answer's fingerprint; return it as the version that produced the answer.
        `seen`: what the request's lookup read from the store (None: it could not read it).
        The store is written only when the fingerprint differs from what it holds."""
        fingerprint = response.get("system_fingerprint")
        if not (self._use_fingerprints and isinstance(fingerprint, str) and fingerprint):
            return None
        if seen is None or version_of(seen.model_version) != fingerprint:
            self.observe(model, fingerprint, "system_fingerprint")
        return fingerprint


def version_of(token: str) -> str:
    """The version in a model version token `generation:version` (versions.py)."""
    return token.partition(":")[2]
