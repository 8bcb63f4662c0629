"""Turn the semantic layer on for a cache from `[semantic]` settings (the parts come from
semantic/from_settings.py): the guards, the verifier with its judge when hits are sampled or the
layer runs in shadow, then `Cache.enable_semantic`, and `serve --semantic` says what the
threshold was calibrated on.

On a Redis (or Redis Cluster) store the layer is shared with the other replicas on it
(semantic/replica_sync.py): the feed's tail is taken before the start-up rebuild, then the layer
publishes its adds and removals and a thread follows the others' (stopped by `layer.close()`).
"""

from __future__ import annotations

import random
from concurrent.futures import Executor, ThreadPoolExecutor

from infercache.cache import Cache
from infercache.errors import ConfigError
from infercache.semantic.embedder import Embedder
from infercache.semantic.from_settings import (
    build_config,
    build_embedder,
    build_judge,
    build_matcher,
)
from infercache.semantic.guards import build_guards, default_guards
from infercache.semantic.layer import SemanticLayer
from infercache.semantic.replica_sync import attach, tail_before_rebuild, wants_sync
from infercache.semantic.verify import FalseHitMonitor, Fetch, Verifier
from infercache.settings import SemanticSettings


def enable_from_settings(
    cache: Cache,
    s: SemanticSettings,
    *,
    judge_fetch: Fetch | None = None,
    embedder: Embedder | None = None,
    rng: random.Random | None = None,
    executor: Executor | None = None,
    torch_threads: int | None = None,
) -> SemanticLayer:
    """Build and enable the layer on `cache` (`s.enabled` is the caller's decision).
    `embedder`: the base embedder to use instead of building the one `s` names;
    `torch_threads` goes to `build_embedder`."""
    if s.threshold is None and not s.shadow:
        raise ConfigError("the calibrated semantic layer needs a threshold (infercache tune)")
    base = embedder or build_embedder(s, torch_threads=torch_threads)
    embedder, matcher = build_matcher(s, base)
    guards = default_guards() if s.guards is None else build_guards(s.guards)
    verifier = None
    if s.sample_rate > 0 or s.shadow:
        verifier = Verifier(
            build_judge(s, base, judge_fetch),
            FalseHitMonitor(target_false_hit=s.target_false_hit),
            sample_rate=s.sample_rate,
            rng=rng or random.Random(),
            executor=executor or ThreadPoolExecutor(1, thread_name_prefix="infercache-verify"),
        )
    config = build_config(s, matcher)
    store_url = cache.settings.resolved_store_url
    shared = wants_sync(store_url)
    position = tail_before_rebuild(store_url) if shared else None
    layer = cache.enable_semantic(embedder, config=config, guards=guards, verifier=verifier)
    if shared:
        attach(layer, store_url, position)
    return layer
