"""The answer text of every label, in one or three phrasings: what the label-aware stand-in
upstream answers and what the scorer recognises.

Labels name what the answer depends on (`corpus.py`): a shared label (`card_arrival`,
`weather_query[date=tomorrow]`) has one answer per phrasing whatever the question's wording; a
label that belongs to one question (out-of-domain `ood:...`, hwu64's `qa_maths#...`, a swapped
question `swap:...`) answers that question, so two of them never share an answer text. An
attacker's label `attack:K:BASE` is BASE's answer poisoned by injection K (`injections.py`).

Each label's answer states its own facts (a team, a number of days, three nouns: drawn from
the label's hash), so answers of different labels differ in meaning as real ones do, and its
three phrasings say the same facts in other words. With MiniLM, measured on 400 labels per
corpus: phrasings of one answer have cosine 0.77–0.99 (5th percentile 0.86 banking77, 0.84
hwu64); the nearest other label's answer reaches 0.76 on banking77 and up to 0.94 on hwu64,
where labels that differ in one slot value (`date=today` / `date=tomorrow`) share most words —
as real answers about the weather today and tomorrow would.

`phrasing(label, question, count)` picks which of the `count` phrasings the upstream answers
with: a stable hash of the question, so asking the same question twice gets the same text
(as a deterministic provider at temperature 0 would) and different questions of one label get
different phrasings — "same answer" is then a judgment on meaning, not on bytes.
"""

from __future__ import annotations

import hashlib
import re

from tests.semantic.days.injections import INJECTIONS


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


TEMPLATES = (
    "About {topic}: the {team} team handles it within {days} days. Keep your {w0} and {w1} "
    "ready, and mention the {w2}.",
    "{topic}? Our {team} team sorts that out in {days} days; have the {w0} and the {w1} at hand "
    "and say {w2}.",
    "For {topic}, expect {days} days with the {team} team. You will need your {w0} and {w1}; "
    "the {w2} helps too.",
)
# What makes one label's answer differ from another's in meaning and not only in its topic
# words: a team, a number of days and three nouns, drawn from the label's hash.
NOUNS = _words(
    "receipt passport invoice ledger voucher token badge ticket folder notebook calendar compass "
    "lantern anchor harbor canyon meadow orchard glacier volcano violin trumpet piano guitar drum "
    "cello flute harp banjo organ tomato lemon cherry walnut pepper carrot onion ginger mango "
    "olive falcon otter badger heron beaver rabbit salmon turtle walrus penguin copper marble "
    "granite velvet cotton linen silver bronze timber crystal ladder hammer chisel bucket kettle "
    "blanket pillow mirror candle basket bicycle tractor scooter trolley canoe glider carriage "
    "ferry rocket wagon museum library bakery pharmacy stadium garage chapel castle factory "
    "lighthouse sunrise thunder blizzard rainbow drizzle monsoon breeze tornado frost eclipse "
    "diploma certificate warranty contract license permit coupon manual sticker stamp keyboard "
    "printer scanner router antenna battery charger speaker headset monitor"
)
TEAMS = _words(
    "billing security logistics onboarding compliance fraud payments cards travel savings "
    "lending support rewards identity disputes transfers"
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
    nouns = [NOUNS[_hash(label, f"noun{i}") % len(NOUNS)] for i in range(3)]
    return TEMPLATES[phrasing].format(
        topic=topic(label, question),
        team=TEAMS[_hash(label, "team") % len(TEAMS)],
        days=2 + _hash(label, "days") % 12,
        w0=nouns[0], w1=nouns[1], w2=nouns[2],
    )  # fmt: skip


def _hash(label: str, salt: str) -> int:
    return int(hashlib.sha256(f"{salt}\x00{label}".encode()).hexdigest()[:8], 16)


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
