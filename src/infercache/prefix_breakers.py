"""Prefix breakers: prompt layouts that defeat prefix reuse, such as a timestamp, a request id
or a user name near the start of a system prompt that is otherwise shared. Core: the analyzer
(analyze/census.py) finds them in a log, the gateway (gateway/live_breakers.py) in live traffic;
both say what they found in the one sentence `advice_line` writes.

Algorithm (streaming, bounded memory). Per KV namespace (where reuse could happen: tenant and
model, or model alone when KV is shared across tenants) keep up to `max_exemplars` distinct
first messages, most recently matched first. A request's first message `t` is:
- a repeat of an exemplar (dict lookup): nothing to learn;
- a repeat of a variant already counted against an exemplar: a prefix cache holds that
  variant, nothing is lost (up to `max_variants` variants are remembered);
- else compared with each exemplar `e`: `p` = their common prefix, `s` = their common suffix
  in what follows it; the varying middle is `t[p : len(t) - s]`. It is a breaker when the
  message is mostly shared (`p + s >= min_shared_fraction × len(t)`, `s >= min_tail_chars`)
  but the shared part breaks early (`p < early_fraction × len(t)`): the tail could be reused
  by every such request, yet a prefix cache stops at `p`. The finding, keyed by exemplar,
  counts the requests, keeps the earliest break with its context, up to 3 examples of the
  varying text, and the tokens of the shared tail: what each request would also reuse if the
  varying part moved to the end.
- else it becomes an exemplar (the least recently matched one leaves when full).
The varying text, widened to whole words, is named by the first pattern it matches: timestamp,
uuid, date, email, request id, number, name (a capitalised word), else other.
Comparisons are slice equality with binary search, O(log n) slices per pair.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "timestamp",
        re.compile(
            r"\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}|\b\d{1,2}:\d{2}(:\d{2})?\b|\b1\d{9}(\d{3})?\b"
        ),
    ),
    ("uuid", re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-")),
    (
        "date",
        re.compile(
            r"\d{4}-\d{2}-\d{2}|\b\d{1,2}/\d{1,2}/\d{2,4}\b|\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|"
            r"Sep|Oct|Nov|Dec)[a-z]*\.? \d{1,2}\b|\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*day\b"
        ),
    ),
    ("email", re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+")),
    ("request id", re.compile(r"\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[\w-]{8,}\b")),
    ("number", re.compile(r"\d")),
    ("name", re.compile(r"\b[A-Z][a-z]+")),
)


def classify(text: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(text):
            return kind
    return "other"


def common_prefix_len(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def common_suffix_len(a: str, b: str, limit: int) -> int:
    """Length of the common suffix of `a` and `b`, at most `limit`."""
    la, lb = len(a), len(b)
    if a[la - limit :] == b[lb - limit :] or limit == 0:
        return limit
    lo, hi = 0, limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[la - mid : la - lo] == b[lb - mid : lb - lo]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class Breaker:
    """One shared message whose reuse breaks early."""

    tenant: str
    model: str
    role: str
    kind: str
    break_char: int  # where the shared part stops, in characters of the message
    break_tokens: int  # ... and in tokens
    tail_tokens: int  # identical tokens after the varying part
    context: str  # the message around the break, the varying part in ⟦ ⟧
    examples: list[str] = field(default_factory=list)
    requests: int = 1  # requests with a new variant, after the first: each lost the tail

    @property
    def tokens_lost(self) -> int:
        """Prompt tokens a prefix cache could have reused had the varying part been last."""
        return self.requests * self.tail_tokens


class _Exemplar:
    __slots__ = ("breaker", "seen", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.breaker: Breaker | None = None
        self.seen: set[int] = set()  # in-process hashes of variants already counted


@dataclass(frozen=True, slots=True)
class BreakerRules:
    min_shared_fraction: float = 0.8
    early_fraction: float = 0.5
    min_tail_chars: int = 64
    max_exemplars: int = 32
    max_namespaces: int = 10_000
    max_variants: int = 10_000  # distinct variants remembered per exemplar


class BreakerFinder:
    def __init__(self, count_tokens: Callable[[str], int], rules: BreakerRules | None = None):
        self._count = count_tokens
        self.rules = rules or BreakerRules()
        self._spaces: dict[str, OrderedDict[str, _Exemplar]] = {}
        self.namespaces_skipped = 0

    def observe(self, namespace: str, tenant: str, model: str, role: str, text: str) -> None:
        if len(text) < 2 * self.rules.min_tail_chars:
            return  # too short to hide a long shared tail
        exemplars = self._spaces.get(namespace)
        if exemplars is None:
            if len(self._spaces) >= self.rules.max_namespaces:
                self.namespaces_skipped += 1
                return
            exemplars = self._spaces[namespace] = OrderedDict()
        if text in exemplars:
            return
        for key in reversed(exemplars):  # most recently matched first
            exemplar = exemplars[key]
            if self._compare(exemplar, text, tenant, model, role):
                exemplars.move_to_end(key)
                return
        exemplars[text] = _Exemplar(text)
        if len(exemplars) > self.rules.max_exemplars:
            exemplars.popitem(last=False)

    def _compare(self, exemplar: _Exemplar, text: str, tenant: str, model: str, role: str) -> bool:
        rules = self.rules
        tail = rules.min_tail_chars
        if text[-tail:] != exemplar.text[-tail:]:
            return False  # cheap: no long common suffix
        p = common_prefix_len(text, exemplar.text)
        s = common_suffix_len(text, exemplar.text, min(len(text), len(exemplar.text)) - p)
        n = len(text)
        if not (s >= rules.min_tail_chars and p + s >= rules.min_shared_fraction * n):
            return False
        if p >= rules.early_fraction * n:
            return False  # breaks late: most of the message is reused already
        start, end = p, n - s
        while start > 0 and not text[start - 1].isspace():
            start -= 1
        while end < n and not text[end].isspace():
            end += 1
        varying = text[start:end]
        if hash(text) in exemplar.seen:
            return True  # a variant seen before: its own prefix is cached, nothing lost
        if len(exemplar.seen) < rules.max_variants:
            exemplar.seen.add(hash(text))
        found = exemplar.breaker
        if found is None or p < found.break_char:
            context = f"{text[max(0, p - 40) : p]}⟦{text[p : n - s]}⟧{text[n - s : n - s + 40]}"
            context = context.replace("\n", "⏎")
            fresh = Breaker(
                tenant, model, role, classify(varying), p, self._count(text[:p]),
                self._count(text[n - s :]), context,
            )  # fmt: skip
            if found is not None:
                fresh.requests, fresh.examples = found.requests + 1, found.examples
            exemplar.breaker = found = fresh
        else:
            found.requests += 1
        if len(found.examples) < 3 and varying not in found.examples:
            found.examples.append(varying)
        return True

    def findings(self) -> list[Breaker]:
        """Every breaker found, the most tokens lost first."""
        found = [
            e.breaker
            for space in self._spaces.values()
            for e in space.values()
            if e.breaker is not None
        ]
        return sorted(found, key=lambda b: -b.tokens_lost)


class BreakerFigures(Protocol):
    """What a breaker's sentence says (a `Breaker`, or the analyzer report's row of one)."""

    @property
    def role(self) -> str: ...
    @property
    def break_char(self) -> int: ...
    @property
    def kind(self) -> str: ...
    @property
    def requests(self) -> int: ...
    @property
    def tail_tokens(self) -> int: ...
    @property
    def examples(self) -> Sequence[str]: ...


def advice_line(breaker: BreakerFigures, who: str) -> str:
    """The breaker in one sentence, as the analyzer's advice and the gateway's /stats say it."""
    examples = ", ".join(repr(e) for e in breaker.examples[:2])
    return (
        f"prefix breaker ({who}): the {breaker.role} message varies at character "
        f"{breaker.break_char} with a {breaker.kind} ({examples}); moving it to the end would "
        f"let {breaker.requests:,} requests reuse {breaker.tail_tokens:,} more tokens each"
    )
