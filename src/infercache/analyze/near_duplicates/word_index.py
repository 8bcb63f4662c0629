"""Candidate texts by shared words: the cheap half of the near-duplicate sample's candidate stage
(finder.py; the other half is a fast embedder's nearest neighbours).

Words are the lower-cased `\\w+` runs of a text. A `WordIndex` covers the texts of one scope:
an inverted index from a word to the ids of the texts holding it. `best(words, k)` scores each
text holding a query word by the sum of those words' inverse document frequencies
(log(1 + N / df) over the scope's texts) and returns the `k` best. Words held by more than
`max_postings` texts are skipped when scoring: they say little, and would make one query cost
as much as the scope is large. A forgotten text's id is skipped, and dropped from the lists
when they are rebuilt (`forget`).
`jaccard(a, b)`: |words in both| / |words in either|, the floor every candidate must pass.
"""

from __future__ import annotations

import heapq
import math
import re

_WORD = re.compile(r"\w+")


def words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    union = len(a | b)
    return len(a & b) / union if union else 1.0


class WordIndex:
    def __init__(self, *, max_postings: int = 1024) -> None:
        self._max_postings = max_postings
        self._postings: dict[str, list[int]] = {}
        self._texts = 0
        self._dead: set[int] = set()  # forgotten ids still in the lists

    def add(self, text_id: int, text_words: frozenset[str]) -> None:
        self._texts += 1
        for word in text_words:
            self._postings.setdefault(word, []).append(text_id)

    def forget(self, text_id: int) -> None:
        """Drop a text: lazily (its id is skipped until the lists are rebuilt, once the dead
        ids outnumber the live texts), so forgetting never walks a long list."""
        self._texts -= 1
        self._dead.add(text_id)
        if len(self._dead) > max(64, self._texts):
            dead = self._dead
            self._postings = {
                word: live
                for word, ids in self._postings.items()
                if (live := [i for i in ids if i not in dead])
            }
            self._dead = set()

    def best(self, query_words: frozenset[str], k: int) -> list[int]:
        scores: dict[int, float] = {}
        n = max(1, self._texts)
        for word in query_words:
            ids = self._postings.get(word)
            if not ids or len(ids) > self._max_postings:
                continue
            weight = math.log(1 + n / len(ids))
            for text_id in ids:
                scores[text_id] = scores.get(text_id, 0.0) + weight
        for text_id in self._dead.intersection(scores):
            del scores[text_id]
        return heapq.nlargest(k, scores, key=scores.__getitem__)

    def __len__(self) -> int:
        return self._texts
