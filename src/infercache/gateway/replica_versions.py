"""Which version of each model each replica serves, tracked replica by replica (issue 29 item 1).

Several versions of one model are live at once while a new one rolls out (a canary, a rolling
deploy): each replica answers with its own. Per replica and model this keeps one `ServedVersion`:

    version    the label of what it serves, from the best evidence so far:
                 "/v1/models"          a `version` its model listing reports (the built-in
                                       engine's weights digest), re-read in the background
                 "admin"               set by hand (the admin API; a declared rollout's version):
                                       fingerprints never move it, a /v1/models version that
                                       changes does
                 "system_fingerprint"  for replicas that offer nothing else: its first
                                       fingerprint labels its version; several fingerprints at
                                       once stay that one version (fingerprints.py's watch,
                                       one per replica and model), and newcomers that displace
                                       the founders for the window are a new version
               None: it never said (an unversioned replica: its requests are unversioned)
    in_doubt   the replica was unreachable since its version was last confirmed (a restart
               may have brought a new one): its version is read again, and until then its
               cached answers are not served. A fingerprint-labelled replica that comes back
               answering a fingerprint never seen in its epoch serves a new version at once
               (a restart is a deploy boundary); one of its known fingerprints confirms it.

Every observation returns the `Move` it made (a replica's version known for the first time, or
changed), or None; the tracker (versions.py) decides what a move retires. Pure: no store, no
clock of its own (callers pass the time); thread-safe (one lock), `state` lock-free for the
request path.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from infercache.gateway.fingerprints import FingerprintWatch, SwapWindow

MODELS = "/v1/models"
ADMIN = "admin"
FINGERPRINT = "system_fingerprint"


class Move(NamedTuple):
    """A replica's version, known for the first time (`old` None) or changed."""

    replica: int
    model: str
    old: str | None
    new: str
    source: str
    evidence: str


class ReplicaState(NamedTuple):
    """What the request path needs: the version (None: unversioned) and whether it is known
    right now (False: in doubt)."""

    version: str | None
    known: bool


UNVERSIONED = ReplicaState(None, True)


@dataclass(slots=True)
class ServedVersion:
    """One replica's one model (the module docstring)."""

    watch: FingerprintWatch
    version: str | None = None
    source: str | None = None
    pinned: bool = False  # set by hand: fingerprints never move it
    listed: str | None = None  # the last version its /v1/models reported
    in_doubt: bool = False
    confirmed_s: float = 0.0
    fingerprints: int = 0  # answers that carried one (the prober asks those for one)

    def state(self) -> ReplicaState:
        return ReplicaState(self.version, not self.in_doubt)


class ReplicaVersions:
    def __init__(
        self, names: Sequence[str], window: SwapWindow, *, use_fingerprints: bool = True
    ) -> None:
        self.names = list(names)
        self._window = window
        self._use_fingerprints = use_fingerprints
        self._served: list[dict[str, ServedVersion]] = [{} for _ in self.names]
        self._declared: dict[int, ReplicaState] = {}  # a rollout's version for the silent ones
        self._lock = threading.Lock()

    # -- the request path --

    def state(self, replica: int, model: str) -> ReplicaState:
        served = self._served[replica].get(model)
        if served is None or served.version is None:
            return self._declared.get(replica, UNVERSIONED)
        return served.state()

    def declare(self, versions: dict[int, str]) -> None:
        """The version a declared rollout gives replicas that report none of their own."""
        self._declared = {i: ReplicaState(v, True) for i, v in versions.items()}

    def label(self, replica: int, model: str) -> str | None:
        """The version replica `replica` serves `model` at (None: unversioned or unknown)."""
        return self.state(replica, model).version

    def reported(self, replica: int, model: str) -> str | None:
        """`label`, when it was reported or set (its /v1/models, the admin API, a rollout)
        rather than read off its answers' fingerprints: what the KV salt and the derived
        prompt_cache_key include, so they do not change between a replica's first answer and
        the next (None: no such version)."""
        served = self._served[replica].get(model)
        if served is None or served.version is None:
            return self._declared.get(replica, UNVERSIONED).version
        return served.version if served.source != FINGERPRINT else None

    # -- observations --

    def fingerprint(
        self, replica: int, model: str, fingerprint: str, now_s: float, token: str | None
    ) -> Move | None:
        """An answer of `replica` for `model` carried `fingerprint`; `token`: the store's
        version token its lookup saw (None: not read)."""
        if not self._use_fingerprints:
            return None
        with self._lock:
            served = self._get(replica, model)
            served.fingerprints += 1
            if served.pinned or served.source == MODELS:
                served.watch.observe(fingerprint, now_s, token)  # for /stats only
                if served.pinned:  # it answers: the admin's word stands
                    self._confirm(served, now_s)
                return None
            if served.version is None or served.in_doubt:
                return self._restarted(replica, model, served, fingerprint, now_s, token)
            displacement = served.watch.observe(fingerprint, now_s, token)
            self._confirm(served, now_s)
            if displacement is None:
                return None
            served.watch.swapped(displacement, token, now_s)
            return self._move(
                replica, model, served, displacement.version, FINGERPRINT, displacement.describe()
            )

    def _restarted(
        self,
        replica: int,
        model: str,
        served: ServedVersion,
        fingerprint: str,
        now_s: float,
        token: str | None,
    ) -> Move | None:
        """The first fingerprint since the replica was first seen or came back."""
        watch = served.watch
        known = served.version is not None and (
            fingerprint in watch.answers or fingerprint in watch.founders
        )
        self._confirm(served, now_s)
        if known:
            served.watch.observe(fingerprint, now_s, token)
            return None
        first = served.version is None
        served.watch = FingerprintWatch(self._window)
        served.watch.observe(fingerprint, now_s, token)
        evidence = (
            "its first answer"
            if first
            else f"after it was unreachable, it answers {fingerprint}, never seen in its epoch"
        )
        return self._move(replica, model, served, fingerprint, FINGERPRINT, evidence)

    def listed(
        self,
        replica: int,
        model: str,
        version: str,
        source: str,
        now_s: float,
        evidence: str = "",
    ) -> Move | None:
        """`replica` reports (`MODELS`) or was set (`ADMIN`) to serve `model` at `version`."""
        with self._lock:
            served = self._get(replica, model)
            self._confirm(served, now_s)
            if source == MODELS:
                if served.pinned and served.listed in (None, version):
                    served.listed = version  # what it said before: the admin's word stands
                    return None
                served.listed = version
            served.pinned = source == ADMIN
            if served.version == version:
                served.source = source
                return None
            served.watch = FingerprintWatch(self._window)  # its answers found a new epoch
            return self._move(replica, model, served, version, source, evidence)

    def unreachable(self, replica: int) -> bool:
        """`replica` did not answer: every version it was known to serve is in doubt. True if
        that changed anything."""
        with self._lock:
            changed = False
            for served in self._served[replica].values():
                if served.version is not None and not served.in_doubt:
                    served.in_doubt = changed = True
            return changed

    def reachable(self, replica: int, now_s: float) -> bool:
        """`replica` answered (its model listing): a version set by hand is confirmed (the
        others need their own evidence). True if that changed anything."""
        with self._lock:
            changed = False
            for served in self._served[replica].values():
                if served.pinned and served.in_doubt:
                    self._confirm(served, now_s)
                    changed = True
            return changed

    def _get(self, replica: int, model: str) -> ServedVersion:
        served = self._served[replica].get(model)
        if served is None:
            served = self._served[replica][model] = ServedVersion(FingerprintWatch(self._window))
        return served

    def _confirm(self, served: ServedVersion, now_s: float) -> None:
        served.in_doubt = False
        served.confirmed_s = now_s

    def _move(
        self, replica: int, model: str, served: ServedVersion, new: str, source: str, evidence: str
    ) -> Move:
        old, served.version, served.source = served.version, new, source
        served.in_doubt = False
        return Move(replica, model, old, new, source, evidence)

    # -- what the tracker and the prober read --

    def serving(self, model: str) -> dict[str, list[int]]:
        """Each version of `model` a replica serves (or served before it fell in doubt): the
        replicas serving it."""
        out: dict[str, list[int]] = {}
        with self._lock:
            for replica in range(len(self._served)):
                version = self.state(replica, model).version
                if version is not None:
                    out.setdefault(version, []).append(replica)
        return out

    def models(self) -> set[str]:
        with self._lock:
            return {m for models in self._served for m in models}

    def to_probe(self, replica: int, *, due: bool) -> list[str]:
        """The models to ask `replica` a fingerprint of: those whose version only its answers
        tell, when in doubt or when the probe is `due`."""
        with self._lock:
            return [
                m
                for m, s in self._served[replica].items()
                if s.source == FINGERPRINT and s.fingerprints and (s.in_doubt or due)
            ]

    def snapshot(self, now_s: float) -> list[dict[str, Any]]:
        """For /stats: each replica's models, versions, evidence and fingerprints."""
        with self._lock:
            return [
                {
                    "name": name,
                    "models": {
                        m: {
                            "version": s.version,
                            "source": s.source,
                            "in_doubt": s.in_doubt,
                            "pinned": s.pinned,
                            "confirmed_s_ago": round(now_s - s.confirmed_s, 1),
                            **s.watch.snapshot(now_s),
                        }
                        for m, s in models.items()
                    },
                }
                for name, models in zip(self.names, self._served, strict=True)
            ]
