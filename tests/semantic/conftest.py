"""Semantic-layer fixtures: the real packaged embedders, each loaded once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from infercache.semantic.embedder import HashingEmbedder, MiniLMEmbedder, StaticEmbedder
from infercache.semantic.tuning.pairs import Pair, read_pairs

HARD_CASES = Path(__file__).parent / "data" / "hard_cases.tsv"


@pytest.fixture(scope="session")
def minilm() -> MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the packaged wheel (~4 s to load): for `slow` tests only."""
    return MiniLMEmbedder(threads=2)


@pytest.fixture(scope="session")
def static_embedder() -> StaticEmbedder:
    return StaticEmbedder()


@pytest.fixture(scope="session")
def hashing() -> HashingEmbedder:
    return HashingEmbedder(dim=128)


@pytest.fixture(scope="session")
def hard_cases() -> list[Pair]:
    return read_pairs(HARD_CASES)
