"""Generated support-bot days (issue 23, item 6): a bot built from an intent corpus, and its days
of traffic in time order, every request carrying its ground-truth label.

The bot (`support_bot`, seeded): `faq_labels` labels drawn from the corpus' FAQ candidates are
its FAQs, in a seeded popularity order; each has a canonical question (a seeded text of
middling length) and its other texts are split by a salted hash into two disjoint pools, one
per day, so day 2 asks the same FAQs in phrasings day 1 never saw. Every other label of the
corpus is an "other" question (asked rarely, its answer differs from every FAQ's); its texts
are split the same way. The held-out out-of-domain texts are split in two as well.

A day (`bot_day`, seeded per day): each of `requests` requests is, independently,
- an FAQ (share `faq_share`): the FAQ is drawn from a Zipf(`zipf_s`) law over the popularity
  order; it is asked in its canonical words (share `canonical_share`), or as an exact repeat of
  a paraphrase asked earlier that day (share `repeat_share` of the rest), or in a phrasing not
  asked yet (from the day's pool; a repeat when the pool is spent);
- out-of-domain (share `ood_share`): a held-out text not asked yet;
- otherwise another label's question: a text of the day's "other" pool not asked yet, drawn
  uniformly, so a label is as likely as it has texts (hwu64's long tail of slot values is
  mostly asked once).
`kind` says which: canonical, paraphrase, repeat, other, ood.

`phrasings` (1 or 3) is how many phrasings the upstream answers a label with (answers.py); with
3, "same answer" must be judged on the answers' meaning.
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tests.semantic.days.corpus import Corpus, corpus, heldout_ood, ood_label

DAYS = 2  # disjoint phrasing pools per bot


@dataclass(frozen=True)
class Request:
    text: str
    label: str
    kind: str  # canonical | paraphrase | repeat | other | ood | attack | plain | swap


@dataclass(frozen=True)
class DaySpec:
    requests: int = 3000
    faq_share: float = 0.70
    ood_share: float = 0.10
    canonical_share: float = 0.25
    repeat_share: float = 0.30
    zipf_s: float = 1.0


@dataclass(frozen=True)
class Bot:
    name: str
    corpus: Corpus
    faqs: tuple[str, ...]  # most popular first
    canonical: dict[str, str]
    pools: dict[str, tuple[tuple[str, ...], ...]]  # label → texts of each day, canonical apart
    other_pools: tuple[tuple[str, ...], ...]  # every other label's texts, per day
    ood_pools: tuple[tuple[str, ...], ...]
    phrasings: int
    seed: int
    system: str = field(default="")

    def label_of(self) -> dict[str, str]:
        """Every question this bot can be asked → its label."""
        labels = self.corpus.label_of()
        labels.update({text: ood_label(text) for pool in self.ood_pools for text in pool})
        return labels


@dataclass(frozen=True)
class Day:
    bot: Bot
    number: int
    seed: int
    spec: DaySpec
    requests: tuple[Request, ...]

    def labelled(self) -> list[tuple[str, str]]:
        """The distinct (text, label) pairs asked, in first-asked order: a labelled file for
        `tune` built from this day."""
        seen: dict[str, str] = {}
        for request in self.requests:
            seen.setdefault(request.text, request.label)
        return list(seen.items())


def _day_of(text: str, salt: str) -> int:
    digest = hashlib.sha256(f"{salt}\x00{text}".encode()).hexdigest()
    return int(digest[:8], 16) % DAYS


def _split(texts: Sequence[str], salt: str) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(t for t in texts if _day_of(t, salt) == d) for d in range(DAYS))


def _canonical(texts: Sequence[str], rng: random.Random) -> str:
    by_length = sorted(texts, key=lambda t: (len(t), t))
    middle = by_length[len(by_length) // 4 : max(len(by_length) * 3 // 4, 1)]
    return rng.choice(middle)


def support_bot(name: str, *, seed: int = 0, faq_labels: int = 40, phrasings: int = 1) -> Bot:
    source = corpus(name)
    rng = random.Random(f"{name}-bot-{seed}")
    candidates = list(source.faq_candidates)
    if faq_labels > len(candidates):
        raise ValueError(f"{name} has {len(candidates)} FAQ candidates, not {faq_labels}")
    faqs = tuple(rng.sample(candidates, faq_labels))
    salt = f"{name}-{seed}"
    canonical = {label: _canonical(source.texts[label], rng) for label in faqs}
    pools = {
        label: _split([t for t in source.texts[label] if t != canonical[label]], salt)
        for label in faqs
    }
    others = [t for label, texts in source.texts.items() if label not in canonical for t in texts]
    ood = [text for text, _ in heldout_ood()]
    return Bot(
        name=name, corpus=source, faqs=faqs, canonical=canonical, pools=pools,
        other_pools=_split(others, salt), ood_pools=_split(ood, salt), phrasings=phrasings,
        seed=seed, system=f"You are {source.domain}. Answer in one short paragraph.",
    )  # fmt: skip


def bot_day(bot: Bot, number: int, spec: DaySpec | None = None, *, seed: int | None = None) -> Day:
    """Day `number` (1 or 2: which phrasing pool it asks) of `bot`."""
    spec = spec or DaySpec()
    if number not in range(1, DAYS + 1):
        raise ValueError(f"a bot has days 1..{DAYS}, not {number}")
    day_seed = seed if seed is not None else bot.seed * 100 + number
    rng = random.Random(f"{bot.name}-day{number}-{day_seed}")
    part = number - 1
    pools = {label: list(bot.pools[label][part]) for label in bot.faqs}
    for pool in pools.values():
        rng.shuffle(pool)
    other, ood = list(bot.other_pools[part]), list(bot.ood_pools[part])
    rng.shuffle(other)
    rng.shuffle(ood)
    weights = np.cumsum([1.0 / (rank + 1) ** spec.zipf_s for rank in range(len(bot.faqs))])
    weights /= weights[-1]
    asked: dict[str, list[str]] = defaultdict(list)
    labels = bot.corpus.label_of()
    requests: list[Request] = []
    for _ in range(spec.requests):
        draw = rng.random()
        if draw < spec.faq_share or not (other or ood):
            label = bot.faqs[int(np.searchsorted(weights, rng.random()))]
            requests.append(_faq_request(bot, label, pools[label], asked[label], spec, rng))
        elif (draw < spec.faq_share + spec.ood_share and ood) or not other:
            text = ood.pop()
            requests.append(Request(text, ood_label(text), "ood"))
        else:
            text = other.pop()
            requests.append(Request(text, labels[text], "other"))
    return Day(bot, number, day_seed, spec, tuple(requests))


def _faq_request(
    bot: Bot, label: str, pool: list[str], asked: list[str], spec: DaySpec, rng: random.Random
) -> Request:
    if rng.random() < spec.canonical_share:
        return Request(bot.canonical[label], label, "canonical")
    if asked and (rng.random() < spec.repeat_share or not pool):
        return Request(rng.choice(asked), label, "repeat")
    if not pool:
        return Request(bot.canonical[label], label, "canonical")
    text = pool.pop()
    asked.append(text)
    return Request(text, label, "paraphrase")
