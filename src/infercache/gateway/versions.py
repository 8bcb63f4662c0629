"""Model versions as they change: several live at once, each replica's tracked on its own, a
version retired only when no replica serves it any more (issue 29 items 0, 1, 4, 5).

What counts as a version change (each recorded in `/stats` with its evidence, and logged once,
at INFO, with what it retired):
- a replica's `version` in its `/v1/models` changes (the built-in engine reports its weights
  digest), re-read in the background (version_probe.py);
- for replicas that offer nothing but `system_fingerprint`s: a fingerprint never seen before that
  displaces all earlier ones for a sustained window (fingerprints.py), or one never seen in its
  epoch when the replica comes back after it was unreachable (replica_versions.py). Several
  fingerprints answering at once are one version on several backend configurations: the cache
  keeps hitting across them;
- a version set by hand: `POST /admin/model-version` for one upstream, or for the whole model
  (with `set-model-version` from the CLI: every older entry retired, every replica taken to
  serve it; later answers' fingerprints do not undo it), or a declared rollout's version;
- a rollout promoted or rolled back (rollout_control.py).

Each replica's version is tracked on its own (replica_versions.py); a request is looked up under
the version of the replica it would be sent to (placement.py), so several versions of one model
are live at once, each with its own entries. When a replica moves to another version and no
replica serves the old one any more, the old one is retired for every layer (its entries are
not served: versions.py in the library, one O(1) write every gateway on the store reads); a move
to a retired version (a replica rolled back by a redeploy) revives it: its entries still within
their TTL are hits again. When every replica serves one version it is recorded as the model's
(`Cache.model_version`), retiring nothing; while several are live the model has no label, so a
gateway that has not heard from a replica yet does not serve another replica's version.

The store's state is the truth for every gateway on it: retired versions are read on every
lookup (a lookup that finds its version retired tells `saw_retired`) and in the background
(`sync`), with writes that failed retried there. Does store I/O: call it off the event loop.
Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from infercache.cache import Cache
from infercache.errors import StoreError
from infercache.gateway.fingerprints import SwapWindow
from infercache.gateway.replica_versions import (
    ADMIN,
    MODELS,
    Move,
    ReplicaState,
    ReplicaVersions,
)
from infercache.gateway.version_traffic import VersionTraffic
from infercache.versions import VersionView

log = logging.getLogger(__name__)

_CHANGES_KEPT = 20


class VersionChange(NamedTuple):
    """One recorded change, for /stats."""

    model: str
    version: str
    previous: str | None
    source: str  # "/v1/models", "admin", "system_fingerprint", "rollout"
    evidence: str
    at_s: float
    retired: tuple[str, ...] = ()
    revived: tuple[str, ...] = ()


class ModelVersionTracker:
    """Keeps no version of the store's own: the store's retired flags and model generation
    are the truth (a store restarted empty, a change made by another gateway or the CLI, a
    failed write: repaired by the evidence that follows)."""

    def __init__(
        self,
        cache: Cache,
        names: Sequence[str] = (),
        *,
        use_fingerprints: bool = True,
        window: SwapWindow | None = None,
    ) -> None:
        self._cache = cache
        self._window = window or SwapWindow()
        self.replicas = ReplicaVersions(names, self._window, use_fingerprints=use_fingerprints)
        self.traffic = VersionTraffic()
        self._retired: dict[str, frozenset[str]] = {}  # per model, as last known
        self._unwritten: dict[tuple[str, str], bool] = {}  # (model, version) → retire?
        self._changes: deque[VersionChange] = deque(maxlen=_CHANGES_KEPT)
        self._lock = threading.Lock()
        self.swaps = 0
        self.generation = 0  # moves on every change placement.py depends on

    # -- observations --

    def answered(
        self, replica: int, model: str, response: dict[str, Any], seen: VersionView | None
    ) -> ReplicaState:
        """An answer `replica` gave for `model`: its fingerprint noted; the replica's state
        after it (the version the answer belongs to). `seen`: the view its lookup read."""
        fingerprint = response.get("system_fingerprint")
        if isinstance(fingerprint, str) and fingerprint:
            token = seen.model_version if seen is not None else None
            now_s = self._now_s()
            move = self.replicas.fingerprint(replica, model, fingerprint, now_s, token)
            if move is not None:
                self._moved(move)
        return self.replicas.state(replica, model)

    def listed(
        self, replica: int, model: str, version: str, source: str = MODELS, evidence: str = ""
    ) -> bool:
        """`replica` reports (or was set by hand) to serve `model` at `version`; True if that
        moved it."""
        move = self.replicas.listed(replica, model, version, source, self._now_s(), evidence)
        if move is None:
            self.changed()  # a version in doubt may be known again
            return False
        self._moved(move)
        return True

    def observe_models(self, replica: int, models: Iterable[dict[str, Any]]) -> None:
        """`replica` listed `models` (its /v1/models answered)."""
        if self.replicas.reachable(replica, self._now_s()):
            self.changed()
        for m in models:
            if isinstance(m.get("id"), str) and isinstance(m.get("version"), str) and m["version"]:
                self.listed(replica, m["id"], m["version"], MODELS)

    def unreachable(self, replica: int) -> None:
        """`replica` did not answer: its versions are in doubt until read again."""
        if self.replicas.unreachable(replica):
            name = self.replicas.names[replica]
            log.info("replica %s is unreachable: its cached answers wait for its version", name)
            self.changed()

    def observe(self, model: str, version: str, source: str, evidence: str = "") -> bool:
        """The whole model is now `version` (the admin API or the CLI, for every replica): every
        older entry is retired (a new model generation) and every replica serves `version`
        until a /v1/models version says otherwise; True if the model's version changed."""
        try:
            previous = self._cache.model_version(model)
            changed = self._cache.set_model_version(model, version)
        except StoreError as exc:
            log.warning("could not record version %s of %s: %s", version, model, exc)
            return False
        for replica in range(len(self.replicas.names)):
            self.replicas.listed(replica, model, version, ADMIN, self._now_s(), evidence)
        self.changed()
        if not changed:
            return False
        self._record(VersionChange(model, version, previous, source, evidence, self._now_s()))
        log.info(
            "model %s is now version %s, was %s (from %s%s): entries stored before are retired",
            model, version, previous or "unversioned", source, f": {evidence}" if evidence else "",
        )  # fmt: skip
        return True

    # -- what a move retires --

    def _moved(self, move: Move) -> None:
        serving = self.replicas.serving(move.model)
        # One version everywhere: the model's label (a gateway that has not heard from a
        # replica yet looks up under it, cache.py); several: none, so such a gateway asks.
        self._relabel(move.model, move.new if len(serving) == 1 else "")
        if move.old is None:
            log.debug(
                "%s serves %s at version %s (%s)",
                self.replicas.names[move.replica], move.model, move.new, move.evidence,
            )  # fmt: skip
            self.changed()
            return
        retired = self.retire(move.model, [move.old]) if move.old not in serving else []
        revived = self.revive(move.model, [move.new])
        change = VersionChange(
            move.model, move.new, move.old, move.source, move.evidence, self._now_s(),
            tuple(retired), tuple(revived),
        )  # fmt: skip
        self._record(change)
        log.info("%s", self._describe(change, self.replicas.names[move.replica], serving))

    def retire(self, model: str, versions: Iterable[str]) -> list[str]:
        """Retire each of `versions` not retired yet (for every gateway on the store)."""
        return self._flag(model, versions, retire=True)

    def revive(self, model: str, versions: Iterable[str]) -> list[str]:
        """Revive each of `versions` that is retired: its fresh entries are hits again."""
        return self._flag(model, versions, retire=False)

    def _flag(self, model: str, versions: Iterable[str], *, retire: bool) -> list[str]:
        known = self.retired(model)
        done = [v for v in dict.fromkeys(versions) if (v in known) != retire]
        if not done:
            return []
        with self._lock:
            now = set(self._retired.get(model, ()))
            now.update(done) if retire else now.difference_update(done)
            self._retired[model] = frozenset(now)
            for v in done:
                self._unwritten[(model, v)] = retire
        self._write_flags()
        self.changed()
        return done

    def _write_flags(self) -> None:
        with self._lock:
            pending = list(self._unwritten.items())
        for (model, version), retire in pending:
            try:
                if retire:
                    self._cache.retire_version(model, version)
                else:
                    self._cache.revive_version(model, version)
            except StoreError as exc:  # retried by `sync`; this gateway routes as it decided
                log.warning("could not record %s of %s in the store: %s", version, model, exc)
                continue
            with self._lock:
                if self._unwritten.get((model, version)) is retire:
                    del self._unwritten[(model, version)]

    def _relabel(self, model: str, version: str) -> None:
        try:
            self._cache.exact.versions.relabel(model, version)
        except StoreError as exc:
            log.warning("could not record %s as the version of %s: %s", version, model, exc)

    # -- the store's state --

    def retired(self, model: str) -> frozenset[str]:
        return self._retired.get(model, frozenset())

    def saw_retired(self, model: str, version: str) -> None:
        """A lookup found `version` retired in the store (another gateway retired it)."""
        with self._lock:
            known = self._retired.get(model, frozenset())
            if version in known:
                return
            self._retired[model] = known | {version}
        log.info("model %s version %s was retired by another gateway", model, version)
        self.changed()

    def sync(self) -> None:
        """The background read (version_probe.py): writes that failed retried, then which of
        the versions the replicas serve (or this gateway retired) the store holds retired."""
        self._write_flags()
        for model in self.replicas.models():
            versions = set(self.replicas.serving(model)) | set(self.retired(model))
            if not versions:
                continue
            try:
                retired = self._cache.exact.versions.retired(model, sorted(versions))
            except StoreError as exc:
                log.debug("could not read the versions of %s: %s", model, exc)
                continue
            with self._lock:
                retired |= {v for (m, v), r in self._unwritten.items() if m == model and r}
                retired -= {v for (m, v), r in self._unwritten.items() if m == model and not r}
                changed = frozenset(retired) != self._retired.get(model, frozenset())
                self._retired[model] = frozenset(retired)
            if changed:
                self.changed()

    # -- records --

    def record_rollout(self, change: VersionChange) -> None:
        """A rollout declared, promoted or rolled back (rollout_control.py)."""
        self._record(change)
        log.info("%s", self._describe(change, None, None))

    def _record(self, change: VersionChange) -> None:
        with self._lock:
            self._changes.append(change)
            self.swaps += 1

    def changed(self) -> None:
        """Something placement.py depends on changed: its plans are computed again."""
        with self._lock:
            self.generation += 1

    def _describe(
        self, change: VersionChange, replica: str | None, serving: dict[str, list[int]] | None
    ) -> str:
        where = f" on {replica}" if replica else ""
        text = (
            f"model {change.model} is now version {change.version}{where}, was "
            f"{change.previous or 'unversioned'} (from {change.source}"
            f"{': ' + change.evidence if change.evidence else ''})"
        )
        stored = self.traffic.snapshot().get(change.model, {})
        for version in change.retired:
            n = stored.get(version, {}).get("entries_stored", 0)
            text += f"; retired {version}: its entries are not served ({n} stored here)"
        for version in change.revived:
            text += f"; revived {version}: its entries still fresh are served again"
        if serving is not None:
            live = ", ".join(f"{v} on {len(r)}" for v, r in sorted(serving.items()))
            text += f"; live: {live}"
        return text

    def snapshot(self) -> dict[str, Any]:
        """/stats: what counts as a change, each replica's versions and fingerprints, each live
        version's traffic, the retired versions, the recent changes."""
        now_s = self._now_s()
        traffic = self.traffic.snapshot()
        with self._lock:
            retired = {m: sorted(v) for m, v in self._retired.items() if v}
            changes = [c._asdict() for c in self._changes]
        live: dict[str, dict[str, Any]] = {}
        for model in sorted(self.replicas.models()):
            for version, replicas in self.replicas.serving(model).items():
                live.setdefault(model, {})[version] = {
                    "replicas": [self.replicas.names[r] for r in replicas],
                    "retired": version in retired.get(model, ()),
                    **traffic.get(model, {}).get(version, {}),
                }
        return {
            "fingerprints_are_versions": False,
            "fingerprint_swap_window": {
                "seconds": self._window.seconds,
                "answers": self._window.answers,
            },
            "live": live,
            "traffic": traffic,
            "retired": retired,
            "replicas": self.replicas.snapshot(now_s),
            "changes": changes,
        }

    def _now_s(self) -> float:
        return self._cache.clock.now_s()
