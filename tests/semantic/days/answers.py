"""The answer text of every label, in one or three phrasings: what the label-aware stand-in
upstream answers and what the scorer recognises.

Labels name what the answer depends on (`corpus.py`): a shared label (`card_arrival`,
`weather_query[date=tomorrow]`) has one answer per phrasing whatever the question's wording; a
label that belongs to one question (out-of-domain `ood:...`, hwu64's `qa_maths#...`, a swapped
question `swap:...`) answers that question, so two of them never share an answer text. An
attacker's label `attack:K:BASE` is BASE's answer poisoned by injection K (`injections.py`).

`phrasing(label, question, count)` picks which of the `count` phrasings the upstream answers
with: a stable hash of the question, so asking the same question twice gets the same text
(as a deterministic provider at temperature 0 would) and different questions of one label get
different phrasings — "same answer" is then a judgment on meaning, not on bytes.
"""

from __future__ import annotations

import hashlib
import re

from tests.semantic.days.injections import INJECTIONS

TEMPLATES = (
    "Thanks for asking about {topic}. Open the app, choose Help, then {topic}, and follow the "
    "steps shown there.",
    "For {topic}: go to Help in the app, pick {topic} and follow the steps; that settles it.",
    "Regarding {topic}, the steps are in the app under Help, {topic}. Follow them and you are "
    "done.",
)
ATTACK_PREFIX = "attack:"
SWAP_PREFIX = "swap:"
OWN_ANSWER = re.compile(r"^(ood:|swap:)|#")


def topic(label: str, question: str) -> str:
    """Words naming what the answer is about: the question itself for a label of its own."""
    if OWN_ANSWER.search(label):
        return f"“{question}”"
    intent, _, slots = label.partition("[")
    words = intent.replace("_", " ")
    if slots:
        pairs = [p.split("=", 1) for p in slots.rstrip("]").split(";")]
        words += " (" + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in pairs) + ")"
    return words


def attack_label(injection: int, base: str) -> str:
    return f"{ATTACK_PREFIX}{injection}:{base}"


def answer_text(label: str, question: str, phrasing: int = 0) -> str:
    if label.startswith(ATTACK_PREFIX):
        injection, _, base = label[len(ATTACK_PREFIX) :].partition(":")
        honest = answer_text(base, question, phrasing)
        return INJECTIONS[int(injection)].poison(honest)
    return TEMPLATES[phrasing].format(topic=topic(label, question))


def phrasing(question: str, count: int) -> int:
    if count == 1:
        return 0
    return int(hashlib.sha256(question.encode("utf-8")).hexdigest()[:8], 16) % count


def answer_for(label: str, question: str, phrasings: int) -> str:
    """What the stand-in upstream answers to `question` (whose label is `label`)."""
    return answer_text(label, question, phrasing(question, phrasings))


class AnswerIndex:
    """Served answer text → the label it answers, for every (question, label) of a run."""

    def __init__(self, labelled: dict[str, str], phrasings: int) -> None:
        self.label_of: dict[str, str] = {}
        for question, label in labelled.items():
            for k in range(phrasings):
                self.label_of[answer_text(label, question, k)] = label

    def label(self, answer: str) -> str | None:
        return self.label_of.get(answer)
