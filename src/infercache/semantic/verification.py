"""Verdicts on the layer's answers, in the background: what feeds `outcomes.Outcomes`.

- a served hit (`verify`): a sampled share (`Verifier.sampled`) is fetched upstream again and
  judged; the verdict is recorded at the hit's own score and answer group — the `SemanticHit`
  the lookup returned is passed in, so nothing is guessed from a similarity;
- a miss's noted best candidate (`judge_noted`): its stored answer is judged against the fresh
  one the miss just fetched (free: the request went upstream anyway), and in shadow kept for
  the background refit of the matcher's head (shadow_fit.py);
- a complaint (`complaint`): a served answer reported wrong, recorded as a wrong verdict.
Judging runs on the verifier's executor; the request path only submits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

import orjson

from infercache.metrics import StrategyMetrics
from infercache.semantic.answer_stats import GroupKey
from infercache.semantic.lookup_result import Noted, SemanticHit
from infercache.semantic.matcher import Matcher
from infercache.semantic.outcomes import Outcomes
from infercache.semantic.shadow_fit import ShadowFit
from infercache.semantic.verify import Fetch, Verifier


@dataclass(eq=False, repr=False, slots=True)
class Verification:
    verifier: Verifier | None
    outcomes: Outcomes
    metrics: StrategyMetrics
    _: KW_ONLY
    matcher: Callable[[], Matcher]
    learn: ShadowFit | None = None

    def verify(
        self, hit: SemanticHit, body: Mapping[str, Any], cached: Mapping[str, Any], fetch: Fetch
    ) -> None:
        """Maybe check the served `hit` (its answer `cached`) against a fresh answer."""
        if self.verifier is None or not self.verifier.sampled():
            return
        self.metrics.count("verifications_scheduled")
        score, group = hit.score, hit.group
        self.verifier.judge_later(
            body,
            cached,
            fetch,
            lambda wrong: self.outcomes.judged(score, group, wrong, hit=True),
        )

    def judge_noted(self, body: Mapping[str, Any], noted: Noted, fresh: bytes) -> None:
        """Judge a miss's noted candidate against the answer the miss fetched; the verdict is
        recorded at the candidate's score under the matcher served when it arrives (a shadow
        refit may have switched it meanwhile) and kept for the next refit."""
        if self.verifier is None:
            return
        self.verifier.judge_later(
            body,
            orjson.loads(noted.cached),
            orjson.loads(fresh),
            lambda wrong: self._noted_verdict(noted, wrong),
        )

    def _noted_verdict(self, noted: Noted, wrong: bool) -> None:
        score = noted.score
        if noted.neighbours:
            score = self.matcher().scores(noted.neighbours)[noted.position]
        self.outcomes.judged(score, noted.group, wrong, hit=False)
        if self.learn is not None and noted.neighbours:
            self.learn.add(noted.neighbours, noted.position, wrong)

    def complaint(self, score: float, group: GroupKey | None) -> None:
        self.outcomes.complaint(score, group)
