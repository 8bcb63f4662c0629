"""The semantic layer with the real packaged MiniLM model, the tuned threshold and the default
guards: a paraphrase hits; questions that differ in a number, a date, a negation or an entity
miss — by the threshold or by a guard."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.semantic.embedder import MiniLMEmbedder
from infercache.semantic.guards import default_guards
from infercache.semantic.layer import SemanticConfig
from infercache.settings import Settings
from tests.harness.upstreams import CountingUpstream
from tests.harness.vocabulary import chat

pytestmark = pytest.mark.slow

# `infercache tune` on STS-B train + banking77 pairs at a 1% false-hit target, default guards
# (bench/README.md, "Semantic"): the value a deployment's config would carry.
TUNED_THRESHOLD = 0.9316


def ask(question: str) -> dict[str, Any]:
    return chat(question, system="You are the support bot of a shop.")


@pytest.mark.parametrize(
    ("stored", "asked", "layer"),
    [
        ("How do I reset my password?", "How can I reset my password?", Layer.SEMANTIC),
        ("How do I reset my password?", "how do i reset my password", Layer.SEMANTIC),
        ("How do I cancel order 1234?", "How do I cancel order 5678?", Layer.MISS),
        ("Can I get a refund before 3 March?", "Can I get a refund before 13 March?", Layer.MISS),
        ("Is the store open on Monday?", "Is the store open on Sunday?", Layer.MISS),
        ("I want to close my account.", "I do not want to close my account.", Layer.MISS),
        ("Why can I log in on the website?", "Why can't I log in on the website?", Layer.MISS),
        (
            "How long is a flight from Paris to London?",
            "How long is a flight from Paris to Berlin?",
            Layer.MISS,
        ),
    ],
)
def test_minilm_hits_paraphrases_and_misses_meaning_flips(
    minilm: MiniLMEmbedder,
    tmp_path: Path,
    clock: ManualClock,
    upstream: CountingUpstream,
    stored: str,
    asked: str,
    layer: Layer,
) -> None:
    cache = Cache(Settings(data_dir=tmp_path, store_url="memory://"), clock=clock)
    cache.enable_semantic(
        minilm, config=SemanticConfig(threshold=TUNED_THRESHOLD), guards=default_guards()
    )
    cache.complete(ask(stored), upstream)
    assert cache.complete(ask(asked), upstream).layer == layer
