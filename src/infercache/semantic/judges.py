"""Judges: is a cached answer as good an answer to a request as a fresh one?

Live verification (verify.py) and shadow calibration (shadow.py) ask a `Judge` to compare the
answer the semantic layer served, or would have served, with the answer the upstream gives now.
Every judge has one method, `same(request, cached, fresh) -> bool`, and a `name`:

- `ExactAnswerJudge` (`exact`): the two answers' texts are equal (surrounding whitespace
  ignored). For FAQ bots whose upstream answers deterministically.
- `NormalisedEqualityJudge` (`equality`): equal after folding case, whitespace and punctuation.
- `EmbeddingJudge` (`embedding`): the answers' embeddings have cosine similarity (in [-1, 1])
  at or above `min_similarity`.
- `LLMJudge` (`llm`): asks a model, through the upstream, a yes/no question.
A judge may raise (an upstream error, say): callers treat that as "no verdict", never as one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
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
    """Same when the answers' embeddings have cosine similarity ≥ `min_similarity`."""

    name = "embedding"

    def __init__(self, embedder: Embedder, min_similarity: float = 0.85) -> None:
        if not -1.0 <= min_similarity <= 1.0:
            raise ValueError(f"min_similarity is a cosine in [-1, 1], got {min_similarity}")
        self._embedder = embedder
        self._min = min_similarity

    def same(
        self, request: Mapping[str, Any], cached: Mapping[str, Any], fresh: Mapping[str, Any]
    ) -> bool:
        a, b = answer_text(cached), answer_text(fresh)
        if a.strip() == b.strip():
            return True  # no need to embed identical answers
        vectors = self._embedder.embed([a, b])
        return float(np.dot(vectors[0], vectors[1])) >= self._min


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
