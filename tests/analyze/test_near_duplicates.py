from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infercache.analyze.census import Class
from infercache.analyze.near_duplicates import PrimedEmbedder
from infercache.analyze.options import SemanticOptions
from infercache.semantic.embedder import Embedder, HashingEmbedder, Matrix
from tests.analyze.conftest import RunAnalysis
from tests.analyze.generators import FAQS, Generated, Truth, support_bot

SYSTEM_A = {"role": "system", "content": "You answer questions about Acme accounts."}
SYSTEM_B = {"role": "system", "content": "You answer questions about Globex accounts."}
# (system prompt, question, expected class); near-duplicates need the same scope.
SCRIPT = [
    (SYSTEM_A, "How do I reset my password?", Class.UNIQUE),
    (SYSTEM_A, "how do i reset my password", Class.NEAR_DUPLICATE),
    (SYSTEM_A, "How do I reset my password?", Class.EXACT_REPEAT),
    (SYSTEM_A, "What is the refund policy for annual plans?", Class.UNIQUE),
    (SYSTEM_A, "Cancel my order 1234 please", Class.UNIQUE),
    (SYSTEM_A, "Cancel my order 5678 please", Class.UNIQUE),  # the numbers guard vetoes
    (SYSTEM_B, "how do I reset my password", Class.UNIQUE),  # another scope
]
SEMANTIC = SemanticOptions(threshold=0.8, source="test", embedder="hashing")


def scripted() -> Generated:
    records: list[dict[str, Any]] = [
        {
            "timestamp": float(i),
            "request": {
                "model": "m",
                "messages": [system, {"role": "user", "content": q}],
                "temperature": 0,
            },
        }
        for i, (system, q, _) in enumerate(SCRIPT)
    ]
    return Generated(records, Truth())


class CountingEmbedder:
    """The hashing twin, counting what it is asked to embed."""

    def __init__(self) -> None:
        self.inner = HashingEmbedder(dim=256)
        self.dim, self.name = self.inner.dim, self.inner.name
        self.texts = 0

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.texts += len(texts)
        return self.inner.embed(texts)


def first_faq_wordings(gen: Generated) -> int:
    """Requests that may be near-duplicates: the first time a FAQ wording is asked (the
    numbered unique questions never are)."""
    wordings = {q for q, _ in FAQS} | {p for _, ps in FAQS for p in ps}
    return sum(
        1
        for r, repeat in zip(gen.records, gen.truth.exact_repeat, strict=True)
        if not repeat and r["request"]["messages"][-1]["content"] in wordings
    )


def classes(run_analysis: RunAnalysis, gen: Generated, tmp_path: Path, embedder: Embedder) -> Any:
    path = gen.write(tmp_path / "log.jsonl")
    return run_analysis([path], embedder=embedder, semantic=SEMANTIC, window=3)


def test_near_duplicates_need_the_same_scope_the_threshold_and_the_guards(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    embedder = CountingEmbedder()
    analysis = classes(run_analysis, scripted(), tmp_path, embedder)
    expected = [cls for _, _, cls in SCRIPT]
    counts = analysis.census.total.classes
    assert {c: counts[c] for c in Class} == {c: expected.count(c) for c in Class}
    assert analysis.semantic is not None
    assert analysis.semantic.texts_embedded == embedder.texts == 6  # distinct texts per window


def test_near_duplicate_order_comes_after_exact_and_before_shared_prefix(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    gen = support_bot(seed=8, n=600)
    analysis = classes(run_analysis, gen, tmp_path, HashingEmbedder(dim=256))
    total = analysis.census.total
    assert total.classes[Class.EXACT_REPEAT] == sum(gen.truth.exact_repeat)
    near = total.classes[Class.NEAR_DUPLICATE]
    assert 0.5 * sum(gen.truth.paraphrase) <= near <= first_faq_wordings(gen)


def test_primed_embedder_embeds_each_distinct_text_once_and_returns_the_same_vectors() -> None:
    inner = CountingEmbedder()
    primed = PrimedEmbedder(inner)
    primed.prime(["a b c", "d e f", "a b c"])
    assert inner.texts == 2
    both = primed.embed(["d e f", "a b c"])
    assert inner.texts == 2
    assert np.array_equal(both, inner.inner.embed(["d e f", "a b c"]))
    primed.embed(["never primed"])
    assert inner.texts == 3


def test_the_semantic_layer_is_replayed_through_the_cache(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    analysis = classes(run_analysis, scripted(), tmp_path, HashingEmbedder(dim=256))
    layered = analysis.replays["layered"]
    assert layered.served["semantic"] == 1  # "how do i reset my password" served its neighbour
    assert layered.served["exact"] == 1
    assert layered.strategies["semantic"]["hits"] == 1


@pytest.mark.slow
def test_minilm_finds_the_support_bots_paraphrases(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    from infercache.semantic.embedder import MiniLMEmbedder

    gen = support_bot(seed=9, n=300)
    path = gen.write(tmp_path / "log.jsonl")
    options = SemanticOptions(threshold=0.85, source="test", embedder="minilm")
    analysis = run_analysis([path], embedder=MiniLMEmbedder(threads=2), semantic=options)
    near = analysis.census.total.classes[Class.NEAR_DUPLICATE]
    # Most paraphrases are caught (some are genuinely weaker: "can i get a refund" drops "last
    # month", which the dates guard refuses), and no numbered unique question ever is.
    assert 0.6 * sum(gen.truth.paraphrase) <= near <= first_faq_wordings(gen)
    assert analysis.replays["layered"].served["semantic"] > 0
