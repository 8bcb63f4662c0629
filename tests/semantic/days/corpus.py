"""The public texts the generated days are built from, read from the attributed copies in
tests/semantic/data (never from outside the repository; sources and licences in its README):

- `banking77()`: 9,999 customer-support questions, 77 intents; the label is the intent (a
  support bot's FAQ answer does not depend on the amount or the country in the question).
- `hwu64()`: 9,675 assistant requests; the label is the intent plus its annotated slot values
  (bench/build_semantic_data.py), so "weather in London" and "weather in Paris" differ.
- `heldout_ood()`: 2,238 questions and requests from other domains and general chat, none of
  them in the packaged out-of-domain set; `acceptance_ood()` is the fixed 300 of issue 23's
  acceptance 1 (150 short factual questions, 150 general-chat requests).

A label's texts keep file order; `faq_candidates` are the labels with enough texts to be asked
in many phrasings over two days (`MIN_FAQ_TEXTS`).
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
import random
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
MIN_FAQ_TEXTS = 20
OOD_PREFIX = "ood:"


@dataclass(frozen=True)
class Corpus:
    name: str
    texts: Mapping[str, tuple[str, ...]]  # label → its texts, in file order
    domain: str  # what the bot's system prompt says it is

    @property
    def faq_candidates(self) -> tuple[str, ...]:
        return tuple(sorted(label for label, t in self.texts.items() if len(t) >= MIN_FAQ_TEXTS))

    def label_of(self) -> dict[str, str]:
        return {text: label for label, texts in self.texts.items() for text in texts}


def _read_gzip_csv(name: str) -> list[dict[str, str]]:
    with gzip.open(DATA / name, "rt", encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def _grouped(rows: list[tuple[str, str]]) -> dict[str, tuple[str, ...]]:
    groups: dict[str, list[str]] = defaultdict(list)
    for text, label in rows:
        groups[label].append(text)
    return {label: tuple(texts) for label, texts in groups.items()}


@functools.cache
def banking77() -> Corpus:
    rows = [(r["text"], r["label"]) for r in _read_gzip_csv("banking77.csv.gz")]
    return Corpus("banking77", _grouped(rows), "the support assistant of a bank")


@functools.cache
def hwu64() -> Corpus:
    rows = [(r["text"], r["label"]) for r in _read_gzip_csv("hwu64.csv.gz")]
    return Corpus("hwu64", _grouped(rows), "a home assistant")


CORPORA = {"banking77": banking77, "hwu64": hwu64}


def corpus(name: str) -> Corpus:
    if name not in CORPORA:
        raise ValueError(f"unknown bot corpus {name!r}; known: {sorted(CORPORA)}")
    return CORPORA[name]()


@functools.cache
def heldout_ood() -> tuple[tuple[str, str], ...]:
    """(text, source) of every held-out out-of-domain text, in file order."""
    text = (DATA / "ood_heldout.csv").read_text(encoding="utf-8")
    return tuple((r["text"], r["source"]) for r in csv.DictReader(io.StringIO(text)))


def acceptance_ood(count: int = 300, seed: int = 23) -> list[str]:
    """Half short factual questions (WebQuestions' test split), half general-chat requests,
    interleaved in a seeded order."""
    rng = random.Random(seed)
    factual = [t for t, source in heldout_ood() if source == "webquestions"]
    chat = [t for t, source in heldout_ood() if source != "webquestions"]
    half = count // 2
    if len(chat) < count - half:
        raise ValueError(f"only {len(chat)} held-out chat requests for {count - half}")
    chosen = rng.sample(factual, half) + rng.sample(chat, count - half)
    rng.shuffle(chosen)
    return chosen


def ood_label(text: str) -> str:
    """Every out-of-domain text is its own answer."""
    return OOD_PREFIX + text
