"""Guards: cheap text checks that veto a semantic match where meaning flips although the
embeddings barely move ("cancel order 1234" vs "cancel order 5678" sit at cosine ~0.95).

A guard has a `name` and `check(query, candidate) -> bool`; True means "may match". Guards are
pure, deterministic and thread-safe (compiled regexes and frozen tables only), and symmetric:
check(a, b) == check(b, a).

Each feature guard extracts a set of canonical features from each text and compares them in one
of two modes:
- `differ`: veto when the sets differ at all (one text mentions something the other does not);
- `conflict`: veto only when each text has a feature the other lacks (a swap: 1234 vs 5678,
  Paris vs London), so adding a detail to a generic question still matches.

Features:
- `numbers`: digit numbers (thousands commas dropped, "1.50" == "1.5", ordinals "3rd" → 3) and
  written cardinals two–billion with compounds ("twenty five" → 25). A lone "one" is ignored:
  it is mostly a pronoun ("a new one").
- `dates`: month and weekday names ("may"/"march" only next to a digit), today / tomorrow /
  yesterday / tonight, this|next|last + week|month|year|weekend, am/pm, parts of the day.
- `currencies`: symbols, ISO codes and names mapped to one code ($, usd, dollars → USD).
- `negation`: how many negation cues a text has (not, no, never, without, none, nothing,
  nobody, neither, nor, cannot, and every n't / nt contraction): one negation removed from a
  text that has two ("why wasn't it accepted ... I can't find it") changes it as surely as
  the only one. Only `differ` makes sense here.
- `entities`: capitalised words not at a sentence start (plus all-caps acronyms), excluding "I";
  an entity counts as missing from the other text only if that word does not occur there in any
  case, so Title Case headlines match their lower-case paraphrases.

Which guards ship on by default, and in which mode, is decided by bench/semantic.py (figures in
bench/README.md); `default_guards()` returns that choice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Literal, Protocol

from infercache.errors import ConfigError
from infercache.semantic.content_guards import (
    ContactGuard,
    InstructionGuard,
    SurplusGuard,
    SwapGuard,
)

Mode = Literal["differ", "conflict"]


class Guard(Protocol):
    @property
    def name(self) -> str: ...

    def check(self, query: str, candidate: str) -> bool:
        """True if the two texts may share an answer as far as this guard can tell."""
        ...


_WORD = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)*|\d[\d,]*(?:\.\d+)?(?:st|nd|rd|th)?|[$€£¥₹]")


_POSSESSIVE = re.compile(r"['’]s$", re.I)


def _tokens(text: str) -> list[str]:
    """Words (possessive 's dropped: "Adele's" → "Adele"), numbers and currency symbols."""
    return [_POSSESSIVE.sub("", token) for token in _WORD.findall(text)]


class FeatureGuard:
    """Base for set-comparing guards: subclasses set `kind` and define `features(text)`.
    `name` is the spec `build_guards` reads back: the kind, plus `:conflict` in that mode."""

    kind = "feature"

    def __init__(self, mode: Mode = "differ") -> None:
        if mode not in ("differ", "conflict"):
            raise ConfigError(f"guard mode must be 'differ' or 'conflict', got {mode!r}")
        self.mode: Mode = mode

    @property
    def name(self) -> str:
        return self.kind if self.mode == "differ" else f"{self.kind}:{self.mode}"

    def features(self, text: str) -> frozenset[str]:
        raise NotImplementedError

    def missing(self, text: str, other: str) -> frozenset[str]:
        """Features of `text` that `other` lacks."""
        return self.features(text) - self.features(other)

    def check(self, query: str, candidate: str) -> bool:
        only_query = self.missing(query, candidate)
        only_candidate = self.missing(candidate, query)
        if self.mode == "differ":
            return not (only_query or only_candidate)
        return not (only_query and only_candidate)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mode={self.mode!r})"


_UNITS = {
    "zero": 0, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14,
    "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20,
    "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80,
    "ninety": 90, "dozen": 12,
}  # fmt: skip
_SCALES = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
_ORDINAL = re.compile(r"(st|nd|rd|th)$")


def _digit_values(token: str) -> list[str]:
    """ "1,234.50" → ["1234.5"]; "3rd" → ["3"]; a list "1,2,3" → ["1", "2", "3"]."""
    raw = _ORDINAL.sub("", token)
    parts = (
        [raw.replace(",", "")] if re.fullmatch(r"\d{1,3}(,\d{3})+(\.\d+)?", raw) else raw.split(",")
    )
    values = []
    for part in parts:
        try:
            values.append(format(Decimal(part).normalize(), "f"))
        except InvalidOperation:
            continue  # an empty part from a trailing comma
    return values


class NumberGuard(FeatureGuard):
    kind = "numbers"

    def features(self, text: str) -> frozenset[str]:
        values: set[str] = set()
        words: list[str] = []  # the current run of number words
        for token in [*_tokens(text), ""]:
            lower = token.lower()
            if lower in _UNITS or lower in _SCALES or (lower == "one" and words):
                words.append(lower)
                continue
            if words:
                values.add(str(_words_value(words)))
                words = []
            if token[:1].isdigit():
                values.update(_digit_values(token))
        return frozenset(values)


def _words_value(words: Sequence[str]) -> int:
    total, current = 0, 0
    for word in words:
        if word in _SCALES:
            current = max(current, 1) * _SCALES[word]
            if _SCALES[word] >= 1000:
                total, current = total + current, 0
        else:
            current += 1 if word == "one" else _UNITS[word]
    return total + current


_MONTHS = {
    "january": "jan", "jan": "jan", "february": "feb", "feb": "feb", "april": "apr",
    "june": "jun", "jun": "jun", "july": "jul", "jul": "jul", "august": "aug", "aug": "aug",
    "september": "sep", "sept": "sep", "october": "oct", "oct": "oct", "november": "nov",
    "nov": "nov", "december": "dec", "dec": "dec",
}  # fmt: skip
_MONTHS_NEAR_DIGIT = {"may": "may", "march": "mar", "mar": "mar", "apr": "apr"}
_WEEKDAYS = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"}
_DAY_WORDS = {
    "today", "tomorrow", "yesterday", "tonight", "morning", "afternoon", "evening", "noon",
    "midnight", "am", "pm",
}  # fmt: skip
_RELATIVE = re.compile(r"\b(this|next|last|previous|coming)\s+(week|month|year|weekend)\b", re.I)


class DateGuard(FeatureGuard):
    kind = "dates"

    def features(self, text: str) -> frozenset[str]:
        spaced = re.sub(r"\b([ap])\.m\b\.?", r"\1m", text, flags=re.I)
        spaced = re.sub(r"(\d)([ap]m)\b", r"\1 \2", spaced, flags=re.I)
        tokens = [t.lower() for t in _tokens(spaced)]
        found: set[str] = set()
        for i, token in enumerate(tokens):
            if token in _MONTHS:
                found.add(_MONTHS[token])
            elif token in _MONTHS_NEAR_DIGIT and any(
                t[:1].isdigit() for t in tokens[max(0, i - 1) : i + 2]
            ):
                found.add(_MONTHS_NEAR_DIGIT[token])
            elif token in _WEEKDAYS or token in _DAY_WORDS:
                found.add(token)
        found.update(" ".join(m.groups()).lower() for m in _RELATIVE.finditer(text))
        return frozenset(found)


_CURRENCIES = {
    "$": "USD", "usd": "USD", "dollar": "USD", "dollars": "USD", "bucks": "USD",
    "€": "EUR", "eur": "EUR", "euro": "EUR", "euros": "EUR",
    "£": "GBP", "gbp": "GBP", "pound": "GBP", "pounds": "GBP", "quid": "GBP",
    "¥": "JPY", "jpy": "JPY", "yen": "JPY", "₹": "INR", "inr": "INR", "rupee": "INR",
    "rupees": "INR", "cad": "CAD", "aud": "AUD", "chf": "CHF", "franc": "CHF", "francs": "CHF",
    "cny": "CNY", "yuan": "CNY", "rmb": "CNY", "btc": "BTC", "bitcoin": "BTC",
    "bitcoins": "BTC", "cent": "cent", "cents": "cent",
}  # fmt: skip


class CurrencyGuard(FeatureGuard):
    kind = "currencies"

    def features(self, text: str) -> frozenset[str]:
        return frozenset(
            _CURRENCIES[t] for t in (x.lower() for x in _tokens(text)) if t in _CURRENCIES
        )


_NEGATIONS = {
    "not", "no", "never", "none", "nobody", "nothing", "nowhere", "neither", "nor", "without",
    "cannot", "cant", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "werent", "wont",
    "wouldnt", "shouldnt", "couldnt", "havent", "hasnt", "hadnt", "aint",
}  # fmt: skip


class NegationGuard(FeatureGuard):
    kind = "negation"

    def features(self, text: str) -> frozenset[str]:
        count = 0
        for token in _tokens(text):
            lower = token.lower().replace("’", "'")
            count += lower in _NEGATIONS or lower.endswith("n't")
        return frozenset({f"negated:{count}"}) if count else frozenset()


# A token starts a sentence when nothing but spaces, quotes or brackets separate it from the
# text start, a line break or sentence punctuation.
_SENTENCE_BREAK = re.compile(r"[.!?:;\n]")
_PRONOUN_I = frozenset({"I", "I'm", "I've", "I'd", "I'll", "I’m", "I’ve", "I’d", "I’ll"})


class EntityGuard(FeatureGuard):
    kind = "entities"

    def features(self, text: str) -> frozenset[str]:
        found: set[str] = set()
        previous_end: int | None = None
        for match in _WORD.finditer(text):
            token = _POSSESSIVE.sub("", match.group())
            gap = text[previous_end : match.start()] if previous_end is not None else ""
            at_sentence_start = previous_end is None or bool(_SENTENCE_BREAK.search(gap))
            previous_end = match.end()
            if not token[:1].isupper() or token in _PRONOUN_I:
                continue
            is_acronym = len(token) > 1 and token.isupper()
            if at_sentence_start and not is_acronym:
                continue
            found.add(token.lower())
        return frozenset(found)

    def missing(self, text: str, other: str) -> frozenset[str]:
        other_words = {t.lower() for t in _tokens(other)}
        return frozenset(e for e in self.features(text) if e not in other_words)


_BY_NAME: dict[str, type[FeatureGuard]] = {
    g.kind: g for g in (NumberGuard, DateGuard, CurrencyGuard, NegationGuard, EntityGuard)
}
_CONTENT: dict[str, Callable[[], Guard]] = {
    g.kind: g for g in (SurplusGuard, ContactGuard, InstructionGuard, SwapGuard)
}


def guard_names() -> list[str]:
    return [*_BY_NAME, *_CONTENT]


def build_guards(specs: Iterable[str]) -> list[Guard]:
    """Guards from specs `name` or `name:mode`, e.g. `["numbers", "entities:conflict"]`."""
    guards: list[Guard] = []
    for spec in specs:
        name, _, mode = spec.strip().partition(":")
        if name in _CONTENT and not mode:
            guards.append(_CONTENT[name]())
            continue
        if name not in _BY_NAME:
            known = ", ".join(guard_names())
            raise ConfigError(f"unknown guard {name!r} (or mode {mode!r}); known: {known}")
        guards.append(_BY_NAME[name](_mode(mode or "differ")))
    return guards


def _mode(text: str) -> Mode:
    if text == "differ":
        return "differ"
    if text == "conflict":
        return "conflict"
    raise ConfigError(f"guard mode must be 'differ' or 'conflict', got {text!r}")


DEFAULT_GUARDS = (
    "numbers", "dates", "negation", "surplus", "contacts", "instructions", "swaps",
)  # fmt: skip


def default_guards() -> list[Guard]:
    """The guards that paid for themselves in bench/semantic.py (figures in bench/README.md):
    numbers (+2.7 points of hit rate at equal false-hit rate on held-out public pairs), dates
    and negation (neutral there, but the only guards catching their hard cases), and the
    content guards (content_guards.py: a question that says more, a link or contact detail,
    an instruction, a swapped name or opposite), which stop cache poisoning. Currencies and
    entities bought nothing measurable and stay opt-in (`build_guards`)."""
    return build_guards(DEFAULT_GUARDS)
