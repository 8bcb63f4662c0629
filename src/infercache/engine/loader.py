"""From settings to a ready model: resolve the checkpoint (converting the packaged GGUF once),
load the weights, build the forward pass, the tokenizer, an empty prefix cache and the runner.

Everything a model swap replaces lives in one `LoadedModel`, so a swap is one reference
assignment: no request can see the new model with the old tokenizer or the old KV.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from infercache.clock import Clock
from infercache.engine.config import EngineConfig
from infercache.engine.model import LlamaModel
from infercache.engine.prefix_cache import PrefixCache
from infercache.engine.radix import RadixStats
from infercache.engine.runner import Runner
from infercache.engine.tokenizer import ChatTokenizer
from infercache.engine.weights import load_checkpoint, resolve_model


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model_id: str
    version: str
    directory: Path
    runner: Runner
    max_context_tokens: int
    created: int

    def cache_stats(self) -> RadixStats | None:
        cache = self.runner.prefix_cache
        return cache.stats() if cache is not None else None


def load_model(
    config: EngineConfig, model_path: Path | None, served_model_id: str | None, clock: Clock
) -> LoadedModel:
    resolved = resolve_model(model_path, config.data_dir)
    checkpoint = load_checkpoint(resolved.directory)
    spec = checkpoint.spec
    limit = min(
        config.max_context_tokens or spec.max_position_embeddings, spec.max_position_embeddings
    )
    dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
    model = LlamaModel(spec, checkpoint.tensors, dtype=dtype, max_positions=limit)
    cache = None
    if config.prefix_cache:
        cache = PrefixCache(model.kv_shape, max_kv_bytes=config.max_kv_bytes)
    tokenizer = ChatTokenizer(checkpoint.tokenizer, checkpoint.eos_token_ids)
    runner = Runner(model, tokenizer, prefix_cache=cache, clock=clock, max_context_tokens=limit)
    return LoadedModel(
        model_id=served_model_id or resolved.model_id,
        version=resolved.version,
        directory=resolved.directory,
        runner=runner,
        max_context_tokens=limit,
        created=int(clock.now_s()),
    )
