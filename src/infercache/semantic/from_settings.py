"""The semantic layer's parts from `[semantic]` settings: embedder, matcher, guards, judge,
verifier and the frozen `SemanticConfig` (calibrated or shadow). Putting them on a cache is the
gateway's (gateway/semantic_setup.py); `tune eval` and the analyzer rebuild the same parts here.

A calibrated layer serves from the start at the threshold `infercache tune --write-config`
chose; a shadow layer (`mode = "shadow"`, or no threshold at all) serves nothing until judged
live traffic certifies an operating point (shadow.py). If the config names the embedder the
threshold was tuned with (`embedder_name`), the embedder built here — the fitted one when a
`matcher` directory is configured — must be that one: a threshold is only meaningful for the
model it was measured on.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from infercache.errors import ConfigError
from infercache.semantic.answer_stats import AnswerStatsConfig
from infercache.semantic.embedder import Embedder
from infercache.semantic.judges import (
    EmbeddingJudge,
    ExactAnswerJudge,
    Judge,
    LLMJudge,
    NormalisedEqualityJudge,
)
from infercache.semantic.layer_config import SemanticConfig, ShadowConfig
from infercache.semantic.matcher import CosineMatcher, Matcher, load_fitted
from infercache.semantic.verify import Fetch
from infercache.settings import SemanticSettings


def build_embedder(
    s: SemanticSettings,
    environ: Mapping[str, str] | None = None,
    *,
    torch_threads: int | None = None,
) -> Embedder:
    """The base embedder `s.embedder` names (no fitted adapter; see `build_matcher`).
    `torch_threads`: the in-process MiniLM's intra-op threads (1 beside the built-in engine:
    see `MiniLMEmbedder`); None leaves torch's default."""
    env = os.environ if environ is None else environ
    embedder: Embedder
    if s.embedder == "static":
        from infercache.semantic.embedder import StaticEmbedder

        embedder = StaticEmbedder()
    elif s.embedder == "openai":
        from infercache.semantic.openai_embedder import OpenAIEmbedder

        if not (s.embedder_url and s.embedder_model and s.embedder_dim):
            raise ConfigError("the openai embedder needs embedder_url, embedder_model and dim")
        embedder = OpenAIEmbedder(
            s.embedder_url,
            model=s.embedder_model,
            dim=s.embedder_dim,
            api_key=env.get("INFERCACHE_EMBEDDER_API_KEY"),
        )
    else:
        from infercache.semantic.embedder import MiniLMEmbedder

        embedder = MiniLMEmbedder(threads=torch_threads)
    if s.matcher is None:
        check_embedder_name(s, embedder)
    return embedder


def build_matcher(s: SemanticSettings, base: Embedder) -> tuple[Embedder, Matcher]:
    """The embedder and matcher the layer runs: `base` and the plain cosine, or the fitted
    ones stored in `s.matcher`."""
    if s.matcher is None:
        return base, CosineMatcher(min_seen=s.min_seen)
    fitted = load_fitted(Path(s.matcher).expanduser(), base)
    check_embedder_name(s, fitted.embedder)
    return fitted.embedder, fitted.matcher


def check_embedder_name(s: SemanticSettings, embedder: Embedder) -> None:
    if s.embedder_name is not None and s.embedder_name != embedder.name:
        raise ConfigError(
            f"the semantic threshold was tuned with {s.embedder_name!r} but the embedder is "
            f"{embedder.name!r}: tune again with this embedder"
        )


def build_judge(s: SemanticSettings, embedder: Embedder, fetch: Fetch | None) -> Judge:
    if s.judge == "exact":
        return ExactAnswerJudge()
    if s.judge == "equality":
        return NormalisedEqualityJudge()
    if s.judge == "llm":
        if fetch is None:
            raise ConfigError("the llm judge needs an upstream to ask")
        return LLMJudge(fetch)
    return EmbeddingJudge(embedder)


def build_config(s: SemanticSettings, matcher: Matcher) -> SemanticConfig:
    shadow = None
    if s.shadow:
        shadow = ShadowConfig(
            target_false_hit=s.target_false_hit,
            min_pairs=s.shadow_min_pairs,
            window=s.shadow_window,
            refit_every=s.shadow_refit_every,
        )
    return SemanticConfig(
        threshold=s.threshold,
        k=s.k,
        store_hits_as_exact=s.store_hits_as_exact,
        matcher=matcher,
        shadow=shadow,
        answer_stats=answer_stats_for(matcher) if s.answer_stats else None,
        floor=s.floor,
    )


def answer_stats_for(matcher: Matcher) -> AnswerStatsConfig:
    """Per-answer lowering within 0.02 of a cosine threshold, within 0.15 of a fitted
    matcher's probability threshold (bench/README.md, "Support-bot days")."""
    if isinstance(matcher, CosineMatcher):
        return AnswerStatsConfig()
    return AnswerStatsConfig(max_lower=FITTED_MAX_LOWER)


FITTED_MAX_LOWER = 0.15
