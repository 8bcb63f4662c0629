from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infercache.analyze.census import Class
from infercache.analyze.near_duplicates.finder import PrimedEmbedder
from infercache.analyze.options import CandidateFilter, SemanticOptions
from infercache.semantic.embedder import Embedder, HashingEmbedder, Matrix
from tests.analyze.conftest import RunAnalysis
from tests.analyze.generators import FAQS, WORDS, Generated, Truth, support_bot

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
    """The analysis with no request counted shared_prefix (a share of 1 is never reached: the
    last prompt token is always recomputed), so the near-duplicate classes stand alone."""
    path = gen.write(tmp_path / "log.jsonl")
    return run_analysis(
        [path], embedder=embedder, semantic=SEMANTIC, window=3, min_prefix_share=1.0
    )


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


SAMPLED = SemanticOptions(
    threshold=0.8,
    source="test",
    embedder="hashing",
    candidates=CandidateFilter("hashing-64", k=16, min_word_jaccard=0.25),
    half_width=0.05,  # 385 requests: a sample of a 3,000-request log
)


def noisy_questions(seed: int, n: int) -> Generated:
    """FAQ questions each followed by two filler words: mostly near-duplicates of earlier
    ones, a few exact repeats."""
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    for i in range(n):
        question = f"{rng.choice(FAQS)[0]} {' '.join(rng.choices(WORDS[:30], k=2))}"
        records.append(
            {
                "timestamp": float(i),
                "request": {
                    "model": "m",
                    "messages": [SYSTEM_A, {"role": "user", "content": question}],
                    "temperature": 0,
                },
            }
        )
    return Generated(records, Truth())


def test_a_uniform_sample_estimates_the_share_every_request_would_give(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    log = noisy_questions(seed=3, n=3000).write(tmp_path / "log.jsonl")
    # The filler words make neighbours one-word swaps of each other, which the `swaps` guard
    # vetoes by design; this test measures the sample, so it keeps the guards it was sized for.
    guards = ("numbers", "dates", "negation")
    full_options = dataclasses.replace(SEMANTIC, guards=guards)
    full = run_analysis(
        [log], embedder=HashingEmbedder(dim=256), semantic=full_options, replay=False
    )
    sampled = run_analysis(
        [log],
        embedder=HashingEmbedder(dim=256),
        candidate_embedder=HashingEmbedder(dim=64),
        semantic=dataclasses.replace(SAMPLED, guards=guards),
        replay=False,
    )
    truth = full.census.total.classes[Class.NEAR_DUPLICATE] / 3000
    assert truth > 0.5
    total = sampled.census.total
    assert sampled.semantic is not None
    assert full.semantic is not None
    assert 0.1 < sampled.semantic.sample_rate < 0.16  # 385 of ~3,000 (the length estimated)
    assert total.checked < total.non_exact
    low, high = total.near_interval() or (1.0, 0.0)
    assert low <= truth <= high
    assert high - low < 0.1  # the ±5 points the sample was sized for, and less
    shares = total.shares()
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["exact_repeat"] == full.census.total.shares()["exact_repeat"]
    assert shares["near_duplicate"] == pytest.approx(truth, abs=0.03)
    # the matcher embedded the sampled texts and their candidates, not the whole log
    assert sampled.semantic.texts_embedded < full.semantic.texts_embedded


def test_a_candidate_a_guard_vetoes_is_never_embedded_by_the_matcher(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    matcher = CountingEmbedder()
    records = [
        {
            "timestamp": float(i),
            "request": {
                "model": "m",
                "messages": [SYSTEM_A, {"role": "user", "content": f"Cancel my order {n} please"}],
                "temperature": 0,
            },
        }
        for i, n in enumerate((1234, 5678, 9012))
    ]
    options = SemanticOptions(
        threshold=0.8,
        source="test",
        embedder="hashing",
        candidates=CandidateFilter("hashing-64", k=4, min_word_jaccard=0.25),
        half_width=0.49,  # a sample of 5: a log this small is checked whole
    )
    analysis = run_analysis(
        [Generated(records, Truth()).write(tmp_path / "log.jsonl")],
        embedder=matcher,
        candidate_embedder=HashingEmbedder(dim=64),
        semantic=options,
        replay=False,
        min_prefix_share=1.0,
    )
    assert analysis.census.total.checked == 3
    assert analysis.census.total.classes[Class.NEAR_DUPLICATE] == 0
    assert matcher.texts == 0  # every candidate differs in its number: nothing to embed


def test_a_word_index_forgets_lazily_and_still_ranks_by_shared_rare_words() -> None:
    from infercache.analyze.near_duplicates.word_index import WordIndex, words

    index = WordIndex()
    texts = [f"reset my password {w}" for w in ("now", "today", "please", "again")]
    texts += ["where is my invoice", "invoice for last month"]
    for i, text in enumerate(texts):
        index.add(i, words(text))
    assert index.best(words("my invoice"), 2) == [4, 5]
    index.forget(4)
    assert index.best(words("my invoice"), 2)[0] == 5
    assert 4 not in index.best(words("where is my invoice"), 6)
    for i in range(4):
        index.forget(i)
    assert len(index) == 1
    assert index.best(words("reset my password now"), 3) == []  # every match forgotten
    assert index.best(words("the invoice of last month"), 3) == [5]


def test_the_ngram_embedder_is_deterministic_normalised_and_ranks_paraphrases_first() -> None:
    from infercache.analyze.near_duplicates.ngram_embedder import NgramEmbedder

    embedder = NgramEmbedder(dim=128, max_chars=256)
    texts = ["How do I reset my password?", "how  can i RESET my password", "Where is my invoice?"]
    vectors = embedder.embed(texts)
    assert vectors.shape == (3, 128)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert np.array_equal(vectors, NgramEmbedder(dim=128, max_chars=256).embed(texts))
    assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2]) + 0.3
    # only the head is read: a long tail changes nothing
    head = embedder.embed(["x" * 300, "x" * 300 + " and a different tail"])
    assert np.allclose(head[0], head[1])
    assert embedder.embed([""]).shape == (1, 128)  # an empty text: a zero vector, no error
