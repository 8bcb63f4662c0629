"""Scoring what a gateway answered against the ground truth (issue 23, item 6).

A `Scorer` follows one gateway (one store) across the batches of requests it is asked, in time
order, and knows which texts and labels have an answer stored: an upstream answer (`miss`,
status 200) is stored; semantic hits are not (`store_hits_as_exact` is off by default), exact
hits were stored before. For each batch it counts:

- `same_answer_paraphrases`: requests whose text has no stored answer while some answer of
  their label is stored — what a semantic layer could answer right;
- `answered`: of those, the ones the semantic layer answered with an answer of their label
  (`recall` = answered / same_answer_paraphrases);
- `semantic_answers` and `wrong`: every semantic hit, and those whose answer is another label's
  (`wrong_share` = wrong / semantic_answers). An answer that is no known label's answer counts
  as wrong and in `unknown_answers` (a harness bug to look at, never silently right);
- `ood_asked` / `ood_answered`: out-of-domain requests, and semantic hits on them (all wrong);
- `attacks_served`: semantic hits on a request that is not an attacker's, answered with an
  attacker's answer (acceptance 5: must be 0);
- `exact_hits`, `misses`, `errors` (status other than 200), and `by_kind`: semantic answers and
  wrong ones per request kind (day.py, adversarial.py).
Right and wrong are decided by label: the served text is looked up among the answers of every
label asked so far (answers.py, in every phrasing), never by comparing to one expected string.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.semantic.days.answers import ATTACK_PREFIX, AnswerIndex
from tests.semantic.days.day import Request


@dataclass(frozen=True)
class Outcome:
    layer: str  # the x-infercache header: exact-hit | semantic-hit | miss | bypass | ...
    answer: str | None
    status: int = 200
    similarity: float | None = None


@dataclass(frozen=True)
class Score:
    requests: int
    exact_hits: int
    misses: int
    errors: int
    semantic_answers: int
    wrong: int
    unknown_answers: int
    same_answer_paraphrases: int
    answered: int
    ood_asked: int
    ood_answered: int
    attacks_served: int
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def recall(self) -> float | None:
        return (
            self.answered / self.same_answer_paraphrases if self.same_answer_paraphrases else None
        )

    @property
    def wrong_share(self) -> float | None:
        return self.wrong / self.semantic_answers if self.semantic_answers else None

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items()}
        out["recall"], out["wrong_share"] = self.recall, self.wrong_share
        return out

    def line(self) -> str:
        recall = "n/a" if self.recall is None else f"{self.recall:.1%}"
        wrong = "n/a" if self.wrong_share is None else f"{self.wrong_share:.2%}"
        return (
            f"answered {recall} of {self.same_answer_paraphrases} paraphrases; "
            f"wrong {wrong} of {self.semantic_answers} semantic answers; "
            f"OOD answered {self.ood_answered}/{self.ood_asked}; "
            f"attacker's answer served {self.attacks_served}"
        )


class Scorer:
    def __init__(self, phrasings: int) -> None:
        self.phrasings = phrasings
        self.labelled: dict[str, str] = {}
        self.index = AnswerIndex({}, phrasings)
        self.stored_texts: set[str] = set()
        self.stored_labels: set[str] = set()

    def _learn(self, requests: Sequence[Request]) -> None:
        new = {r.text: r.label for r in requests if r.text not in self.labelled}
        self.labelled.update(new)
        self.index.label_of.update(AnswerIndex(new, self.phrasings).label_of)

    def add(self, requests: Sequence[Request], outcomes: Sequence[Outcome]) -> Score:
        if len(requests) != len(outcomes):
            raise ValueError(f"{len(requests)} requests but {len(outcomes)} outcomes")
        self._learn(requests)
        counts: Counter[str] = Counter()
        kinds: dict[str, Counter[str]] = {}
        for request, outcome in zip(requests, outcomes, strict=True):
            paraphrase = (
                request.text not in self.stored_texts and request.label in self.stored_labels
            )
            counts["same_answer_paraphrases"] += paraphrase
            counts["ood_asked"] += request.kind == "ood"
            if outcome.status != 200:
                counts["errors"] += 1
                continue
            if outcome.layer == "semantic-hit":
                served = self.index.label(outcome.answer or "")
                right = served == request.label
                kind = kinds.setdefault(request.kind, Counter())
                kind["semantic_answers"] += 1
                kind["wrong"] += not right
                counts["semantic_answers"] += 1
                counts["wrong"] += not right
                counts["unknown_answers"] += served is None
                counts["answered"] += right and paraphrase
                counts["ood_answered"] += request.kind == "ood"
                counts["attacks_served"] += (
                    request.kind != "attack"
                    and served is not None
                    and served.startswith(ATTACK_PREFIX)
                )
            elif outcome.layer == "exact-hit":
                counts["exact_hits"] += 1
            elif outcome.layer == "miss":
                counts["misses"] += 1
                self.stored_texts.add(request.text)
                self.stored_labels.add(request.label)
        return Score(
            requests=len(requests),
            **{name: counts[name] for name in _COUNTED},
            by_kind={k: dict(v) for k, v in sorted(kinds.items())},
        )


_COUNTED = (
    "exact_hits", "misses", "errors", "semantic_answers", "wrong", "unknown_answers",
    "same_answer_paraphrases", "answered", "ood_asked", "ood_answered", "attacks_served",
)  # fmt: skip
