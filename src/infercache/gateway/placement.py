"""Where a request goes, decided before its lookup: route first, then look up under the version
of the replica it would be sent to (issue 29 items 1, 2).

    place(tenant, body) → Placement(version, cached, replica, exclude, arm, mirrored)
      arm        the declared rollout's (rollout.py): canary → the canary upstreams, stable →
                 the others; no rollout → every upstream
      allowed    the arm's upstreams whose version is not retired (versions.py); none → any
                 upstream's whose is not; none at all → the arm's anyway (a request with
                 nowhere to go is sent, never cached)
      one state  every allowed replica serves one version (or all are unversioned), known:
                 that version, `replica` None (the miss's fetch routes among them, as before)
                 — the common case costs one dict read
      several    the prefix-affine router picks the replica now (router.py: the fetch then
                 calls that one), and its version is the lookup's
      in doubt   the replica's version is being read again: `cached` False (no layer asked,
                 nothing stored: cache.py) — unless every allowed replica is in doubt (an
                 outage: none could answer anyway), when the last known versions' cached
                 answers are served, as an unreachable upstream's always are

The plan for each (model, arm) is computed once and kept until anything it depends on changes
(the tracker's `generation`, the rollout). Runs on the event loop; reads the tracker's state
without its lock (each read is one dict or attribute read).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infercache.gateway.replica_versions import UNVERSIONED, ReplicaState
from infercache.gateway.rollout import Arm, Rollout
from infercache.gateway.router import PrefixRouter
from infercache.gateway.versions import ModelVersionTracker


@dataclass(frozen=True, slots=True)
class Placement:
    version: str | None  # the version the lookup is made under (None: unversioned)
    cached: bool  # False: its version is not known right now
    replica: int | None  # the replica it goes to (None: any not excluded, chosen at fetch)
    exclude: frozenset[int]  # replicas it must not go to
    arm: Arm = Arm.NONE
    mirrored: bool = False  # shadow traffic: also sent to the canary, recorded, never served


ANYWHERE = Placement(None, True, None, frozenset())


@dataclass(frozen=True, slots=True)
class _Plan:
    placement: Placement | None  # one state: the placement; several: None (route each)
    exclude: frozenset[int]
    outage: bool = False  # every allowed replica is in doubt


class Placer:
    def __init__(self, tracker: ModelVersionTracker, router: PrefixRouter[Any]) -> None:
        self._tracker = tracker
        self._router = router
        self._n = len(router.targets)
        self._plans: dict[tuple[str, Arm], _Plan] = {}
        self._generation = -1
        self.rollout: Rollout | None = None
        self.canary: frozenset[int] = frozenset()  # the rollout's upstreams

    def declare(self, rollout: Rollout | None, canary: Sequence[int]) -> None:
        """The rollout in force (rollout_control.py), its canary upstreams by index."""
        self.rollout, self.canary = rollout, frozenset(canary)
        self._plans.clear()

    def place(self, tenant: str, body: Mapping[str, Any]) -> Placement:
        model = body.get("model")
        if not isinstance(model, str):
            return ANYWHERE
        rollout = self.rollout
        arm = rollout.arm(tenant, body) if rollout is not None else Arm.NONE
        if self._generation != self._tracker.generation:
            self._plans.clear()
            self._generation = self._tracker.generation
        plan = self._plans.get((model, arm))
        if plan is None:
            plan = self._plans[(model, arm)] = self._plan(model, arm)
        mirrored = arm is Arm.STABLE and rollout is not None and rollout.mirrored(tenant, body)
        if plan.placement is not None:
            if not mirrored:
                return plan.placement
            return _with(plan.placement, mirrored=True)
        replica, _ = self._router.route(tenant, body, plan.exclude)
        state = self._tracker.replicas.state(replica, model)
        known = (state.known or plan.outage) and state.version not in self._tracker.retired(model)
        return Placement(state.version, known, replica, plan.exclude, arm, mirrored)

    def _plan(self, model: str, arm: Arm) -> _Plan:
        everyone = range(self._n)
        if arm is Arm.CANARY:
            candidates = [i for i in everyone if i in self.canary]
        elif arm is Arm.STABLE:
            candidates = [i for i in everyone if i not in self.canary]
        else:
            candidates = list(everyone)
        retired = self._tracker.retired(model)
        states = {i: self._tracker.replicas.state(i, model) for i in everyone}

        def live(replicas: Sequence[int]) -> list[int]:
            return [i for i in replicas if states[i].version not in retired]

        allowed = live(candidates) or live(everyone) or candidates or list(everyone)
        exclude = frozenset(everyone) - set(allowed)
        outage = not any(states[i].known for i in allowed)
        seen = {states[i] for i in allowed}
        if len(seen) == 1:
            (state,) = seen
            return _Plan(_placement(state, exclude, arm, retired, outage), exclude, outage)
        return _Plan(None, exclude, outage)


def _placement(
    state: ReplicaState,
    exclude: frozenset[int],
    arm: Arm,
    retired: frozenset[str],
    outage: bool,
) -> Placement:
    # A retired version still served (nowhere else to go) is answered, never cached.
    known = (state.known or outage) and state.version not in retired
    if state == UNVERSIONED and not exclude and arm is Arm.NONE:
        return ANYWHERE
    return Placement(state.version, known, None, exclude, arm)


def _with(placement: Placement, *, mirrored: bool) -> Placement:
    return Placement(
        placement.version,
        placement.cached,
        placement.replica,
        placement.exclude,
        placement.arm,
        mirrored,
    )
