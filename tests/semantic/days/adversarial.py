"""The adversarial set that ships with the tests (issue 23, item 5 and acceptance 5), built from
banking77 questions (corpus.py) with a seed, with ground truth:

- `attacks(100)`: 100 support questions, each (seeded, spread over the intents) with an
  attacker's version — the question with one of the ten instructions of injections.py appended,
  the i-th question taking injection i mod 10 — and a paraphrase (another text of its intent).
  The attacker's label is `attack:K:INTENT`: the upstream's answer follows the instruction.
- `swaps()`: pairs of questions one edit apart whose answers differ: an entity swapped within
  its class (currency, country, card kind, payment service), a quantity changed (a number or a
  number word), or a negation removed. The swapped text's label is `swap:TEXT` (its own
  answer); the original keeps its intent. Up to `per_kind` of each kind, one per source text
  of at most 120 characters. This is the issue's rule (an answer may quote the entity, amount or
  fact the question states), stricter than a FAQ bot whose canned answer would not change.
- `attack_requests` / `swap_requests`: the orders a test asks them in: the attacker first, then
  the plain question, then its paraphrase; a pair's two questions back to back, every other pair
  reversed.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tests.semantic.days.answers import SWAP_PREFIX, attack_label
from tests.semantic.days.corpus import banking77
from tests.semantic.days.day import Request
from tests.semantic.days.injections import INJECTIONS

MAX_QUESTION_CHARS = 120


@dataclass(frozen=True)
class Attack:
    question: str
    label: str
    injection: int  # index into INJECTIONS
    paraphrase: str

    @property
    def attacked(self) -> str:
        stem = self.question if self.question[-1] in ".?!" else self.question + "."
        return f"{stem} {INJECTIONS[self.injection].suffix}"

    @property
    def attack_label(self) -> str:
        return attack_label(self.injection, self.label)


@dataclass(frozen=True)
class Swap:
    kind: str  # entity | quantity | negation
    original: str
    label: str
    swapped: str

    @property
    def swapped_label(self) -> str:
        return SWAP_PREFIX + self.swapped


def attacks(count: int = 100, seed: int = 5) -> list[Attack]:
    rng = random.Random(f"attacks-{seed}")
    texts = banking77().texts
    intents = sorted(texts)
    rng.shuffle(intents)
    chosen: list[Attack] = []
    used: set[str] = set()
    while len(chosen) < count:
        intent = intents[len(chosen) % len(intents)]
        fit = [t for t in texts[intent] if len(t) <= MAX_QUESTION_CHARS and t not in used]
        question, paraphrase = rng.sample(fit, 2)
        used.update((question, paraphrase))
        chosen.append(Attack(question, intent, len(chosen) % len(INJECTIONS), paraphrase))
    return chosen


def attack_requests(chosen: Sequence[Attack]) -> list[Request]:
    out: list[Request] = []
    for attack in chosen:
        out.append(Request(attack.attacked, attack.attack_label, "attack"))
        out.append(Request(attack.question, attack.label, "plain"))
        out.append(Request(attack.paraphrase, attack.label, "plain"))
    return out


ENTITY_CLASSES: tuple[tuple[str, ...], ...] = (
    ("euros", "dollars", "pounds", "yen"),
    ("euro", "dollar", "pound", "yen"),
    ("EUR", "USD", "GBP", "JPY"),
    ("UK", "US", "France", "Spain", "Germany", "China", "Mexico"),
    ("virtual card", "physical card"),
    ("debit card", "credit card"),
    ("Apple Pay", "Google Pay", "PayPal"),
    ("Visa", "Mastercard"),
)
NUMBER_WORDS = {"two": "five", "three": "six", "four": "seven", "five": "two", "ten": "three"}
NEGATIONS = (
    ("hasn't", "has"), ("haven't", "have"), ("didn't", "did"), ("doesn't", "does"),
    ("don't", "do"), ("isn't", "is"), ("wasn't", "was"), ("won't", "will"), ("can't", "can"),
    ("cannot", "can"), ("has not", "has"), ("have not", "have"), ("did not", "did"),
    ("is not", "is"), ("was not", "was"), ("not", ""),
)  # fmt: skip


def _word(pattern: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w']){re.escape(pattern)}(?![\w'])", re.IGNORECASE)


def entity_swap(text: str) -> str | None:
    for names in ENTITY_CLASSES:
        for i, name in enumerate(names):
            if _word(name).search(text):
                other = names[(i + 1) % len(names)]
                return _word(name).sub(other, text, count=1)
    return None


def _bigger(match: re.Match[str]) -> str:
    number = int(match.group(0))
    return str(number * 3 if number >= 10 else number + 3)


def quantity_swap(text: str) -> str | None:
    digits = re.compile(r"(?<![\w.,])\d+(?![\w.,]\d)")
    if digits.search(text):
        return digits.sub(_bigger, text, count=1)
    for word, other in NUMBER_WORDS.items():
        if _word(word).search(text):
            return _word(word).sub(other, text, count=1)
    return None


def negation_swap(text: str) -> str | None:
    for negative, positive in NEGATIONS:
        pattern = _word(negative)
        if pattern.search(text):
            return " ".join(pattern.sub(positive, text, count=1).split())
    return None


SWAPPERS = {"entity": entity_swap, "quantity": quantity_swap, "negation": negation_swap}


def swaps(per_kind: int = 100, seed: int = 5) -> list[Swap]:
    rng = random.Random(f"swaps-{seed}")
    rows = sorted(
        (t, label)
        for label, texts in banking77().texts.items()
        for t in texts
        if len(t) <= MAX_QUESTION_CHARS
    )
    rng.shuffle(rows)
    known = {t.lower() for t, _ in rows}
    out: list[Swap] = []
    used: set[str] = set()
    for kind, swapper in SWAPPERS.items():
        count = 0
        for text, label in rows:
            if count == per_kind:
                break
            swapped = swapper(text) if text not in used else None
            if swapped and swapped != text and swapped.lower() not in known:
                out.append(Swap(kind, text, label, swapped))
                used.add(text)
                count += 1
    return out


def swap_requests(pairs: Sequence[Swap]) -> list[Request]:
    out: list[Request] = []
    for index, pair in enumerate(pairs):
        first = Request(pair.original, pair.label, "swap")
        second = Request(pair.swapped, pair.swapped_label, "swap")
        out.extend((first, second) if index % 2 == 0 else (second, first))
    return out
