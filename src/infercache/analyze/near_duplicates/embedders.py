"""The embedders the analyze command measures near-duplicates with, each loaded on first use
(a log without text never loads a model): the matcher (MiniLM on one torch thread, or the
user's embedder) and, when sampling, the fast candidate embedder (character 3-grams)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from infercache.analyze.options import AnalyzeOptions
from infercache.errors import ConfigError
from infercache.settings import Settings

if TYPE_CHECKING:
    from infercache.semantic.embedder import Embedder, Matrix
    from infercache.settings import SemanticSettings


class LazyEmbedder:
    """An `Embedder` built on first use: a log without text never loads the model."""

    def __init__(self, build: Callable[[], Embedder], name: str) -> None:
        self._build = build
        self._name = name
        self._built: Embedder | None = None

    def _embedder(self) -> Embedder:
        if self._built is None:
            self._built = self._build()
        return self._built

    @property
    def dim(self) -> int:
        return self._embedder().dim

    @property
    def name(self) -> str:
        return self._built.name if self._built is not None else f"{self._name} (not loaded)"

    def embed(self, texts: Sequence[str]) -> Matrix:
        return self._embedder().embed(texts)


def embedders(
    options: AnalyzeOptions, settings: Settings
) -> tuple[Embedder | None, Embedder | None]:
    """(the matcher, the fast candidate embedder when sampling), each loaded on first use."""
    s = options.semantic
    if s is None:
        return None, None

    same = s.embedder == settings.semantic.embedder
    semantic = replace(
        settings.semantic,
        embedder=s.embedder,
        embedder_name=settings.semantic.embedder_name if same and not s.public else None,
    )
    matcher = LazyEmbedder(lambda: _quietly(_matcher, semantic), s.embedder)
    if s.candidates is None:
        return matcher, None
    return matcher, candidate_embedder()


def candidate_embedder() -> Embedder:
    """The sample's candidate stage: character 3-gram hashing of each text's first 256
    characters (ngram_embedder.py): no model to load, tens of thousands of texts a second."""
    from infercache.analyze.near_duplicates.ngram_embedder import NgramEmbedder

    return NgramEmbedder(dim=128, max_chars=256)


def _matcher(s: SemanticSettings) -> Embedder:
    """MiniLM on one torch thread: the reader process has the other core, and torch's
    threads thrash on a busy machine (bench/README.md, Semantic); any other embedder as the
    semantic layer builds it."""
    from infercache.semantic.from_settings import build_embedder

    if s.embedder != "minilm":
        return build_embedder(s)
    from infercache.semantic.embedder import MiniLMEmbedder

    embedder = MiniLMEmbedder(threads=1)
    if s.embedder_name is not None and s.embedder_name != embedder.name:
        raise ConfigError(
            f"the semantic threshold was tuned with {s.embedder_name!r} but the embedder is "
            f"{embedder.name!r}: tune again with this embedder"
        )
    return embedder


def _quietly(build: Callable[[SemanticSettings], Embedder], s: SemanticSettings) -> Embedder:
    """Loading MiniLM draws a progress bar on stderr; a report command keeps stderr for its
    own messages (the setting is process-wide: a command owns its process)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    return build(s)
