"""Analyzer fixtures: settings in a temporary folder, the tokenizers, a runner.

The packaged SmolLM2 tokenizer comes from the engine's one-time GGUF conversion in the user's
cache (`$INFERCACHE_DATA_DIR` or `~/.cache/infercache`, as tests/engine does); tests using it
are marked `slow`. Everything else generates its logs (generators.py) or reads the Mooncake
slice copied into tests/analyze/data/.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infercache.analyze.analysis import Analysis, Analyzer
from infercache.analyze.options import AnalyzeOptions
from infercache.engine.config import default_data_dir
from infercache.settings import Settings
from infercache.tokenizing.tokenizers import (
    Chars4Tokenizer,
    PromptTokenizer,
    load_tokenizer,
)

DATA = Path(__file__).parent / "data"
MOONCAKE = DATA / "mooncake_synthetic_trace.jsonl.gz"

RunAnalysis = Callable[..., Analysis]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data")


@pytest.fixture(scope="session")
def smollm2() -> PromptTokenizer:
    """The packaged SmolLM2 tokenizer and chat template (slow tests only)."""
    return load_tokenizer("smollm2", default_data_dir(os.environ))


@pytest.fixture
def run_analysis(settings: Settings) -> RunAnalysis:
    """Analyse `paths` with chars4 (or `tokenizer`) and options built from `**overrides`."""

    def run(
        paths: list[Path],
        *,
        tokenizer: PromptTokenizer | None = None,
        embedder: Any = None,
        candidate_embedder: Any = None,
        replay: bool = True,
        **overrides: Any,
    ) -> Analysis:
        chosen = tokenizer or Chars4Tokenizer()
        analyzer = Analyzer(
            AnalyzeOptions(**overrides),
            settings=settings,
            tokenizer=lambda: chosen,
            embedder=embedder,
            candidate_embedder=candidate_embedder,
            replay=replay,
        )
        return analyzer.run(paths)

    return run
