"""Judges: is a cached answer as good an answer to a request as a fresh one?

Live verification (verify.py) and shadow calibration (shadow.py) ask a `Judge` to compare the
answer the semantic layer served, or would have served, with the answer the upstream gives now.
Every judge has one method, `same(request, cached, fresh) -> bool`, and a `name`:

- `ExactAnswerJudge` (`exact`): the two answers' texts are equal (surrounding whitespace
  ignored). For FAQ bots whose upstream answers deterministically.
- `NormalisedEqualityJudge` (`equality`): equal after folding case, whitespace and punctuation.
- `EmbeddingJudge` (`embedding`): the answers' embeddings have cosine similarity (in [-1, 1])
  at or above `min_similarity`, unless they are one text with content words swapped: answers
  built on one template ("Thanks for asking about card arrival. Open the app...") differ only
  in what they are about, and embed within ~0.9 of each other; when at least 60% of the longer
  answer's words match in order and a changed run holds a content word on each side, they are
  different answers.
- `LLMJudge` (`llm`): asks a model, through the upstream, a yes/no question.
A judge may raise (an upstream error, say): callers treat that as "no verdict", never as one.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from difflib import SequenceMatcher
from typing import Any, Protocol

import numpy as np

from infercache.semantic.embedder import Embedder


def answer_text(response: Mapping[str, Any]) -> str:
    """The answer's text, in any API's shape: the first choice's message text (chat), the text
    blocks of an Anthropic message, the output text of a Responses answer ("" when none)."""
    if response.get("type") == "message" or response.get("object") == "response":
        blocks = response.get("content") or [
            part for item in response.get("output") or [] for part in item.get("content") or []
        ]
        kinds = ("text", "output_text")
        return "".join(b.get("text", "") for b in blocks if b.get("type") in kinds)
    choices = response.get("choices") or []
    if not choices or not isinstance(choices[0], Mapping):
        return ""
    message = choices[0].get("message") or {}
    content = message.get("content")
    return content if isinstance(content, str) else ""


class Judge(Protocol):
    @property
    def name(self) -> str: ...

    def same(
        self, request: Mapping[str, Any], cached: Mapping[str, Any], fresh: Mapping[str, Any]
    ) -> bool:
        """True when the cached answer is as good an answer to `request` as the fresh one."""
        ...


class ExactAnswerJudge:
    name = "exact"

    def same(
        self, request: Mapping[str, Any], cached: Mapping[str, Any], fresh: Mapping[str, Any]
    ) -> bool:
        return answer_text(cached).strip() == answer_text(fresh).strip()


_FOLD = re.compile(r"[\W_]+", re.UNICODE)


def _fold(text: str) -> str:
    return _FOLD.sub(" ", text.casefold()).strip()


class NormalisedEqualityJudge:
    name = "equality"

    def same(
        self, request: Mapping[str, Any], cached: Mapping[str, Any], fresh: Mapping[str, Any]
    ) -> bool:
        return _fold(answer_text(cached)) == _fold(answer_text(fresh))


class EmbeddingJudge:
    """Same when the answers' embeddings have cosine similarity ≥ `min_similarity` (and they
    are not one text with content words swapped). Answer vectors are remembered (at most
    `max_remembered`, then forgotten all at once); `remember` embeds many in one batch."""

    name = "embedding"

    def __init__(
        self, embedder: Embedder, min_similarity: float = 0.85, *, max_remembered: int = 50_000
    ) -> None:
        if not -1.0 <= min_similarity <= 1.0:
            raise ValueError(f"min_similarity is a cosine in [-1, 1], got {min_similarity}")
        self._embedder = embedder
        self._min = min_similarity
        self._max = max_remembered
        self._vectors: dict[str, Any] = {}
        self._lock = threading.Lock()

    def remember(self, texts: Sequence[str]) -> None:
        """Embed the answer texts not remembered yet, in batches."""
        with self._lock:
            new = [t for t in dict.fromkeys(texts) if t not in self._vectors]
        for start in range(0, len(new), 256):
            batch = new[start : start + 256]
            vectors = self._embedder.embed(batch)
            with self._lock:
                if len(self._vectors) + len(batch) > self._max:
                    self._vectors.clear()
                self._vectors.update(zip(batch, vectors, strict=True))

    def same(
        self, request: Mapping[str, Any], cached: Mapping[str, Any], fresh: Mapping[str, Any]
    ) -> bool:
        a, b = answer_text(cached), answer_text(fresh)
        if a.strip() == b.strip():
            return True  # no need to embed identical answers
        if content_swapped(a, b):
            return False
        self.remember([a, b])
        with self._lock:
            va, vb = self._vectors.get(a), self._vectors.get(b)
        if va is None or vb is None:  # forgotten meanwhile by another thread
            va, vb = self._embedder.embed([a, b])
        return float(np.dot(va, vb)) >= self._min


_WORD = re.compile(r"\w+", re.UNICODE)
_FUNCTION_WORDS = frozenset(
    {
        "a", "an", "the", "this", "that", "these", "those", "your", "my", "our", "their", "its",
        "his", "her", "you", "we", "they", "i", "it", "is", "are", "be", "to", "of", "in", "on",
        "at", "for", "with", "by", "from", "and", "or", "so", "then", "there", "here", "just",
        "please",
    }
)  # fmt: skip


def content_swapped(a: str, b: str, *, matched_share: float = 0.6) -> bool:
    """Whether `a` and `b` are one text with content words changed (see EmbeddingJudge)."""
    wa, wb = _WORD.findall(a.casefold()), _WORD.findall(b.casefold())
    if wa == wb or not wa or not wb:
        return False
    matcher = SequenceMatcher(None, wa, wb, autojunk=False)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    if matched < matched_share * max(len(wa), len(wb)):
        return False
    return any(
        tag == "replace" and set(wa[i1:i2]) - _FUNCTION_WORDS and set(wb[j1:j2]) - _FUNCTION_WORDS
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
    )


class LLMJudge:
    """Asks a model (through `complete`, an upstream call) for a yes/no verdict."""

    name = "llm"
    PROMPT = (
        "Question:\n{question}\n\nAnswer A:\n{a}\n\nAnswer B:\n{b}\n\n"
        "Do A and B give the same information in answer to the question? Reply yes or no."
    )

    def __init__(
        self, complete: Callable[[dict[str, Any]], dict[str, Any]], model: str | None = None
    ) -> None:
        """`model`: the judging model; None asks the model the request itself was for."""
        self._complete = complete
        self._model = model

    def same(
        self, request: Mapping[str, Any], cached: Mapping[str, Any], fresh: Mapping[str, Any]
    ) -> bool:
        messages = request.get("messages") or [{}]
        question = str(messages[-1].get("content", ""))
        prompt = self.PROMPT.format(question=question, a=answer_text(cached), b=answer_text(fresh))
        verdict = self._complete(
            {
                "model": self._model or request.get("model"),
                "messages": [{"role": "user", "content": prompt}],
                "temperature": 0,
                "max_tokens": 3,
            }
        )
        return answer_text(verdict).strip().lower().startswith("yes")
