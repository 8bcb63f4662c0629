"""Turn the semantic layer on from `[semantic]` settings: embedder, guards, live verification.

The threshold must come from calibration (`infercache tune --write-config`); settings refuse to
enable the layer without one. If the config names the embedder the threshold was tuned with
(`embedder_name`), the embedder built here must be that one: a threshold is only meaningful for
the model it was measured on.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from infercache.errors import ConfigError
from infercache.semantic.embedder import Embedder
from infercache.semantic.guards import build_guards, default_guards
from infercache.semantic.judges import (
    EmbeddingJudge,
    ExactAnswerJudge,
    Judge,
    LLMJudge,
    NormalisedEqualityJudge,
)
from infercache.semantic.layer import SemanticConfig, SemanticLayer
from infercache.semantic.verify import FalseHitMonitor, Verifier
from infercache.settings import SemanticSettings

if TYPE_CHECKING:
    from infercache.cache import Cache

Fetch = Callable[[dict[str, Any]], dict[str, Any]]


def build_embedder(s: SemanticSettings, environ: Mapping[str, str] | None = None) -> Embedder:
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

        # threads left alone: torch's thread count is process-wide and the in-process engine
        # owns it (setting it here would slow every generation down).
        embedder = MiniLMEmbedder()
    if s.embedder_name is not None and s.embedder_name != embedder.name:
        raise ConfigError(
            f"the semantic threshold was tuned with {s.embedder_name!r} but the embedder is "
            f"{embedder.name!r}: tune again with this embedder"
        )
    return embedder


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


def enable_from_settings(
    cache: Cache,
    s: SemanticSettings,
    *,
    judge_fetch: Fetch | None = None,
    embedder: Embedder | None = None,
    rng: random.Random | None = None,
    executor: Executor | None = None,
) -> SemanticLayer:
    """Build and enable the layer on `cache` (`s.enabled` is the caller's decision)."""
    if s.threshold is None:
        raise ConfigError("the semantic layer needs a calibrated threshold (infercache tune)")
    embedder = embedder or build_embedder(s)
    guards = default_guards() if s.guards is None else build_guards(s.guards)
    verifier = None
    if s.verify_sample_rate > 0:
        verifier = Verifier(
            build_judge(s, embedder, judge_fetch),
            FalseHitMonitor(target_false_hit=s.target_false_hit),
            sample_rate=s.verify_sample_rate,
            rng=rng or random.Random(),
            executor=executor or ThreadPoolExecutor(1, thread_name_prefix="infercache-verify"),
        )
    config = SemanticConfig(threshold=s.threshold, k=s.k, store_hits_as_exact=s.store_hits_as_exact)
    return cache.enable_semantic(embedder, config=config, guards=guards, verifier=verifier)
