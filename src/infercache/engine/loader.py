"""From settings to a ready model: resolve the checkpoint (converting the packaged GGUF once),
load the weights in the configured format, build the forward pass, the tokenizer and an empty
prefix cache. `version` is the served version (weights.py `served_version`): the checkpoint's
digest with the weight format and activation dtype, the identity every cache keys on; the
engine's KV tiers, when it has any, name this model's blocks by it too.

Everything a model swap replaces lives in one `LoadedModel`, so a swap is one reference
assignment: no request can see the new model with the old tokenizer or the old KV.
`runner(...)` builds the model runner over it (a fresh running set; the waiting queue and the
metrics outlive the model, so they are passed in).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from infercache.clock import Clock
from infercache.engine.accounting import EngineAccounting
from infercache.engine.config import EngineConfig
from infercache.engine.kv_tiers import TierBackends
from infercache.engine.model import LlamaModel
from infercache.engine.prefix_cache import PrefixCache
from infercache.engine.radix import RadixStats
from infercache.engine.runner import Runner
from infercache.engine.scheduler import WaitingQueue
from infercache.engine.tokenizer import ChatTokenizer
from infercache.engine.weight_formats import weight_format
from infercache.engine.weights import load_checkpoint, resolve_model, served_version


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model_id: str
    version: str
    weights: str
    directory: Path
    model: LlamaModel
    tokenizer: ChatTokenizer
    prefix_cache: PrefixCache | None
    max_context_tokens: int
    created: int

    def cache_stats(self) -> RadixStats | None:
        return self.prefix_cache.stats() if self.prefix_cache is not None else None

    def tier_stats(self) -> dict[str, object] | None:
        tiers = self.prefix_cache.tiers if self.prefix_cache is not None else None
        return tiers.stats() if tiers is not None else None

    def runner(
        self,
        config: EngineConfig,
        waiting: WaitingQueue,
        accounting: EngineAccounting,
        clock: Clock,
    ) -> Runner:
        limits = config.batch_limits(bytes_per_token=self.model.kv_shape.bytes_per_token)
        return Runner(
            self.model,
            self.tokenizer,
            prefix_cache=self.prefix_cache,
            clock=clock,
            max_context_tokens=self.max_context_tokens,
            limits=limits,
            waiting=waiting,
            accounting=accounting,
            model_id=self.model_id,
        )


def load_model(
    config: EngineConfig,
    model_path: Path | None,
    served_model_id: str | None,
    clock: Clock,
    tiers: TierBackends | None = None,
) -> LoadedModel:
    weights = weight_format(config.weights)  # an unserved format fails before any loading
    resolved = resolve_model(model_path, config.data_dir)
    checkpoint = load_checkpoint(resolved.directory)
    spec = checkpoint.spec
    limit = min(
        config.max_context_tokens or spec.max_position_embeddings, spec.max_position_embeddings
    )
    dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
    # A packed fp32 layout (linear.py) only pays off when several sequences share a step.
    packed = config.max_batch > 1
    model = LlamaModel(
        spec, checkpoint.tensors, dtype=dtype, max_positions=limit, weights=weights, packed=packed
    )
    # The model's identity: what every cache keys on, KV and the KV tiers' block names included
    # (a block one weight format computed is never loaded by another).
    version = served_version(resolved.checkpoint_version, weights.name, config.dtype)
    cache = None
    if config.prefix_cache:
        model_tiers = tiers.for_model(version, model.kv_shape) if tiers else None
        cache = PrefixCache(model.kv_shape, max_kv_bytes=config.max_kv_bytes, tiers=model_tiers)
    return LoadedModel(
        model_id=served_model_id or resolved.model_id,
        version=version,
        weights=weights.name,
        directory=resolved.directory,
        model=model,
        tokenizer=ChatTokenizer(checkpoint.tokenizer, checkpoint.eos_token_ids),
        prefix_cache=cache,
        max_context_tokens=limit,
        created=int(clock.now_s()),
    )
