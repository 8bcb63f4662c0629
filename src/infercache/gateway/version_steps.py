"""The request path's model-version steps, in the order service.py takes them (issue 29).

    place(tenant, body)               before the lookup: the replica's version it is looked up
                                      under, the replica when several versions are live, the
                                      rollout's arm (placement.py)
    replan(outcome, placement)        the lookup found that version retired (another gateway
                                      promoted or rolled back): tell the tracker, place again
    count(body, placement, layer)     each version's traffic (version_traffic.py)
    mirror(tenant, body, placement)   a shadow-traffic callback for the answer, or None
                                      (shadow_mirror.py)

and what stands beside it: the tracker (versions.py), the rollout control (rollout_control.py),
the shadow mirror, the background prober (version_probe.py, started by the app's lifespan).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from infercache.cache import Cache
from infercache.completion import Completion
from infercache.gateway.placement import Placement, Placer
from infercache.gateway.requestlog import RequestLog
from infercache.gateway.rollout_control import RolloutControl
from infercache.gateway.router import PrefixRouter
from infercache.gateway.shadow_mirror import ShadowMirror
from infercache.gateway.upstream_protocols import Upstream
from infercache.gateway.versions import ModelVersionTracker
from infercache.metrics import MissReason
from infercache.miss import Miss
from infercache.semantic.judges import (
    EmbeddingJudge,
    ExactAnswerJudge,
    Judge,
    NormalisedEqualityJudge,
)


class VersionSteps:
    def __init__(
        self,
        cache: Cache,
        tracker: ModelVersionTracker,
        router: PrefixRouter[Any],
        upstreams: Sequence[Upstream],
        request_log: RequestLog | None,
    ) -> None:
        self._cache = cache
        self.tracker = tracker
        self.placer = Placer(tracker, router)
        self.rollout = RolloutControl(cache, tracker, self.placer, [u.name for u in upstreams])
        self.shadow = ShadowMirror(
            upstreams, router, tracker, self._judges, cache.clock, request_log=request_log
        )

    def place(self, tenant: str, body: dict[str, Any]) -> Placement:
        return self.placer.place(tenant, body)

    def replan(self, outcome: Completion | Miss, placement: Placement) -> bool:
        """True when the lookup found its version retired in the store and this gateway did
        not know: the tracker knows now, and the request is to be placed again."""
        if not isinstance(outcome, Miss) or placement.version is None:
            return False
        lookup = outcome.lookup
        if lookup is None or lookup.miss_reason is not MissReason.RETIRED_VERSION:
            return False
        model = outcome.request.model
        if placement.version in self.tracker.retired(model):
            return False  # known: it was sent there for want of anywhere else
        self.tracker.saw_retired(model, placement.version)
        return True

    def count(self, body: dict[str, Any], placement: Placement, layer: str) -> None:
        if placement.version is not None:
            self.tracker.traffic.request(body.get("model"), placement.version, layer)

    def mirror(
        self, tenant: str, body: dict[str, Any], placement: Placement
    ) -> Callable[[dict[str, Any]], None] | None:
        """What to do with this request's answer: mirror it (shadow traffic), or nothing."""
        if not placement.mirrored:
            return None
        canary = self.placer.canary

        def offer(answer: dict[str, Any]) -> None:
            self.shadow.offer(tenant, body, answer, placement.version, canary)

        return offer

    def _judges(self) -> list[Judge]:
        judges: list[Judge] = [ExactAnswerJudge(), NormalisedEqualityJudge()]
        semantic = self._cache.semantic
        if semantic is not None:
            judges.append(EmbeddingJudge(semantic.embedder))
        return judges
