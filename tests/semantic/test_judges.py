"""The judges that label a cached answer against a fresh one: exact, equality, embedding, llm."""

from __future__ import annotations

from typing import Any

import pytest

from infercache.semantic.embedder import HashingEmbedder
from infercache.semantic.judges import (
    EmbeddingJudge,
    ExactAnswerJudge,
    LLMJudge,
    NormalisedEqualityJudge,
    answer_text,
)


def reply(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]}


REQUEST = {"model": "m", "messages": [{"role": "user", "content": "How do I reset my PIN?"}]}


def test_answer_text_is_the_first_choices_message_or_empty() -> None:
    assert answer_text(reply("hi")) == "hi"
    assert answer_text({"choices": []}) == ""
    assert answer_text({"choices": [{"message": {"content": None}}]}) == ""


def test_exact_wants_the_same_text_and_equality_folds_case_and_punctuation() -> None:
    exact, folded = ExactAnswerJudge(), NormalisedEqualityJudge()
    assert exact.same(REQUEST, reply("Open Settings."), reply(" Open Settings.\n"))
    assert not exact.same(REQUEST, reply("Open Settings."), reply("open settings"))
    assert folded.same(REQUEST, reply("Open Settings."), reply("open settings"))
    assert not folded.same(REQUEST, reply("Open Settings."), reply("Call us."))
    assert (exact.name, folded.name) == ("exact", "equality")


def test_the_embedding_judge_compares_answer_vectors_against_its_bound() -> None:
    judge = EmbeddingJudge(HashingEmbedder(dim=256), min_similarity=0.6)
    assert judge.same(
        REQUEST,
        reply("Open the app and tap Reset PIN."),
        reply("Open the app, then tap Reset PIN."),
    )
    assert not judge.same(
        REQUEST,
        reply("Open the app and tap Reset PIN."),
        reply("Our branches close at five on Fridays."),
    )
    with pytest.raises(ValueError, match="cosine"):
        EmbeddingJudge(HashingEmbedder(dim=8), min_similarity=2.0)


def test_the_llm_judge_asks_the_model_a_yes_no_question_about_both_answers() -> None:
    asked: list[dict[str, Any]] = []

    def complete(body: dict[str, Any]) -> dict[str, Any]:
        asked.append(body)
        return reply("Yes.")

    judge = LLMJudge(complete)
    assert judge.same(REQUEST, reply("A"), reply("B"))
    prompt = asked[0]["messages"][0]["content"]
    assert "How do I reset my PIN?" in prompt
    assert "Answer A:\nA" in prompt
    assert asked[0]["model"] == "m"
    assert asked[0]["temperature"] == 0
    assert not LLMJudge(lambda body: reply("no")).same(REQUEST, reply("A"), reply("B"))
