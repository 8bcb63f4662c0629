"""Declaring, promoting and rolling back a rollout (issue 29 items 2, 4), shared by every gateway
on the store.

    declare(rollout)   the canary upstreams (some of this gateway's), their share, the shadow
                       share (rollout.py); stored as the store's `rollout` meta, so every
                       gateway on it assigns alike; `serve --canary` and `POST /admin/rollout`
    promote()          the canary's version is the model's: each version only the other
                       upstreams serve is retired at once (one O(1) write per version, read by
                       every gateway's next lookup), and the rollout ends: requests go to the
                       upstreams whose version is not retired (the old ones rejoin once they
                       report the new version)
    rollback()         the canary's versions that no other upstream serves are retired, the
                       other upstreams' versions revived if a promotion retired them (their
                       entries still within their TTL are hits again at once), and the rollout
                       ends
    sync()             the background read of the store's declaration (version_probe.py)

Old upstreams that report no version of their own cannot be retired by version: promoting over
them starts a new model generation (every older entry retired, the canary's included). A
canary that reports no version needs one declared (`version`), or its answers could not be told
from the old ones'. Does store I/O: call it off the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from infercache.cache import Cache
from infercache.errors import InvalidRequestError, StoreError
from infercache.gateway.placement import Placer
from infercache.gateway.rollout import Rollout
from infercache.gateway.versions import ModelVersionTracker, VersionChange

log = logging.getLogger(__name__)

ROLLOUT_META = "rollout"


class RolloutControl:
    def __init__(
        self, cache: Cache, tracker: ModelVersionTracker, placer: Placer, names: Sequence[str]
    ) -> None:
        self._cache = cache
        self._tracker = tracker
        self._placer = placer
        self._names = list(names)
        self.rollout: Rollout | None = None

    def declare(self, rollout: Rollout) -> None:
        """Put `rollout` in force here and in the store (a 400 when it names unknown upstreams
        or leaves none for the stable arm, or when the canary's version is unknowable)."""
        self._check(rollout)
        self._store(rollout)
        self._apply(rollout)
        evidence = (
            f"canary {', '.join(rollout.canary)} at {rollout.share:.0%} of "
            f"{rollout.sticky}s, shadow {rollout.shadow:.0%}"
        )
        self._tracker.record_rollout(
            VersionChange("*", rollout.version or "(as reported)", None, "rollout", evidence,
                          self._now_s())
        )  # fmt: skip

    def promote(self) -> dict[str, list[str]]:
        """The canary's version wins: the versions only the others serve, retired; per model."""
        canary = self._require()
        retired: dict[str, list[str]] = {}
        for model in sorted(self._tracker.replicas.models()):
            mine, others = self._versions(model, canary)
            if None in others:  # old upstreams without a version: a new model generation
                label = next((v for v in mine if v is not None), "promoted")
                self._tracker.observe(model, label, "rollout", "promoted over unversioned")
                retired[model] = ["(every older entry)"]
                continue
            done = self._tracker.retire(model, [v for v in others - mine if v is not None])
            self._tracker.revive(model, [v for v in mine if v is not None])
            retired[model] = done
            self._record(model, mine, others, "promoted", retired=done)
        self._end()
        return retired

    def rollback(self) -> dict[str, list[str]]:
        """The canary's version loses: retired; the others' revived; per model."""
        canary = self._require()
        out: dict[str, list[str]] = {}
        for model in sorted(self._tracker.replicas.models()):
            mine, others = self._versions(model, canary)
            done = self._tracker.retire(model, [v for v in mine - others if v is not None])
            revived = self._tracker.revive(model, [v for v in others if v is not None])
            out[model] = done
            self._record(model, others, mine, "rolled back", retired=done, revived=revived)
        self._end()
        return out

    def sync(self) -> None:
        """Take the store's declaration (another gateway, or the CLI, may have changed it)."""
        try:
            text = self._cache.backend.read_meta([ROLLOUT_META]).get(ROLLOUT_META, "")
        except StoreError as exc:
            log.debug("could not read the rollout: %s", exc)
            return
        try:
            rollout = Rollout.from_json(text)
            if rollout is not None:
                self._check(rollout)
        except (InvalidRequestError, ValueError) as exc:
            log.warning("the store's rollout does not apply to this gateway: %s", exc)
            rollout = None
        if rollout != self.rollout:
            self._apply(rollout)

    def snapshot(self) -> dict[str, Any] | None:
        rollout = self.rollout
        if rollout is None:
            return None
        return {
            "canary": list(rollout.canary),
            "share": rollout.share,
            "shadow": rollout.shadow,
            "sticky": rollout.sticky,
            "version": rollout.version,
        }

    # -- steps --

    def _check(self, rollout: Rollout) -> None:
        unknown = [c for c in rollout.canary if c not in self._names]
        if unknown:
            raise InvalidRequestError(
                f"the canary names upstreams this gateway does not have: {unknown}",
                param="canary",
            )
        if len(rollout.canary) >= len(set(self._names)):
            raise InvalidRequestError(
                "a rollout needs upstreams outside the canary (the stable arm)", param="canary"
            )

    def _apply(self, rollout: Rollout | None) -> None:
        canary = [i for i, n in enumerate(self._names) if rollout and n in rollout.canary]
        version = rollout.version if rollout is not None else None
        self._tracker.replicas.declare({i: version for i in canary} if version else {})
        self._placer.declare(rollout, canary)
        self.rollout = rollout
        self._tracker.changed()  # the plans depend on it

    def _store(self, rollout: Rollout | None) -> None:
        try:
            self._cache.backend.write_meta(ROLLOUT_META, rollout.to_json() if rollout else "")
        except StoreError as exc:
            log.warning("the rollout holds here only: the store did not take it: %s", exc)

    def _require(self) -> frozenset[int]:
        if self.rollout is None:
            raise InvalidRequestError("no rollout is declared")
        return self._placer.canary

    def _versions(
        self, model: str, canary: frozenset[int]
    ) -> tuple[set[str | None], set[str | None]]:
        """The versions the canary serves `model` at, and the others'."""
        state = self._tracker.replicas.state
        everyone = range(len(self._names))
        return (
            {state(i, model).version for i in everyone if i in canary},
            {state(i, model).version for i in everyone if i not in canary},
        )

    def _end(self) -> None:
        self._store(None)
        self._apply(None)

    def _record(
        self,
        model: str,
        winners: set[str | None],
        losers: set[str | None],
        what: str,
        *,
        retired: list[str],
        revived: Sequence[str] = (),
    ) -> None:
        won = ", ".join(sorted(v or "unversioned" for v in winners))
        lost = ", ".join(sorted(v or "unversioned" for v in losers))
        change = VersionChange(
            model, won, lost, "rollout", f"{what}", self._now_s(), tuple(retired), tuple(revived)
        )
        self._tracker.record_rollout(change)

    def _now_s(self) -> float:
        return self._cache.clock.now_s()
