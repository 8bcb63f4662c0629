"""Fixtures for the engine tests.

- Tiny random Llama checkpoints (`make_tiny_llama`): a byte-level BPE tokenizer trained here on
  a few sentences, a ChatML template, 2 layers with random weights. They load in milliseconds and
  exercise every code path (GQA, rope scaling, biases, untied heads) without the packaged model.
- The packaged SmolLM2-135M-Instruct (`@pytest.mark.slow`): converted once into the user's
  cache (`$INFERCACHE_DATA_DIR` or `~/.cache/infercache`; slow only the first time), loaded
  once per session.
Nothing here reads outside the venv, the cache and pytest's temporary folders.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from starlette.testclient import TestClient

from infercache.engine.config import DEFAULT_WEIGHTS, EngineConfig, default_data_dir
from infercache.engine.engine import Engine
from infercache.engine.model import LlamaModel
from infercache.engine.server import create_app
from infercache.engine.tokenizer import ChatTokenizer
from infercache.engine.weights import Checkpoint, ResolvedModel, load_checkpoint, resolve_model

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "You are a helpful assistant. Answer the question briefly and politely.",
    "Radix trees share prefixes; caches reuse attention keys and values.",
    "Naïve café déjà vu: 東京 is Tokyo, 😀 is a smile, ünïcödé text.",
    "system user assistant question answer hello world how are you today",
]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TinyFactory = Callable[..., Path]


@pytest.fixture(scope="session", autouse=True)
def _offline() -> Iterator[None]:
    """transformers must never reach for a model hub in these tests."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|im_end|>",
    )
    hf.chat_template = CHATML
    out = tmp_path_factory.mktemp("tiny-tokenizer")
    hf.save_pretrained(out)
    return out


def write_tiny_llama(
    out: Path, tokenizer_dir: Path, *, seed: int = 0, vocab_size: int = 420, **config: Any
) -> Path:
    """A random 2-layer Llama checkpoint (HF safetensors folder) with `tokenizer_dir`'s files."""
    from transformers import LlamaConfig, LlamaForCausalLM

    settings: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "initializer_range": 0.2,  # peaky logits: greedy choices are not near-ties
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }
    settings.update(config)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**settings))
    model.save_pretrained(out)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, out / f.name)
    return out


@pytest.fixture(scope="session")
def make_tiny_llama(
    tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path
) -> TinyFactory:
    made: dict[str, Path] = {}

    def make(seed: int = 0, **config: Any) -> Path:
        key = repr((seed, sorted(config.items())))
        if key not in made:
            out = tmp_path_factory.mktemp(f"tiny-llama-{seed}")
            made[key] = write_tiny_llama(out, tiny_tokenizer_dir, seed=seed, **config)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_dir(make_tiny_llama: TinyFactory) -> Path:
    return make_tiny_llama()


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def make_engine(data_dir: Path) -> Iterator[Callable[..., Engine]]:
    """Engines over a tiny model (or `model_path=`), closed after the test."""
    engines: list[Engine] = []

    def make(model_path: Path | None = None, **config: Any) -> Engine:
        engine = Engine(EngineConfig(data_dir=data_dir, model_path=model_path, **config))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


# -- the packaged model (slow) ---------------------------------------------------------------


@pytest.fixture(scope="session")
def smol_data_dir() -> Path:
    return default_data_dir(os.environ)


@pytest.fixture(scope="session")
def smol_resolved(smol_data_dir: Path) -> ResolvedModel:
    return resolve_model(None, smol_data_dir)


@pytest.fixture(scope="session")
def smol_checkpoint(smol_resolved: ResolvedModel) -> Checkpoint:
    return load_checkpoint(smol_resolved.directory)


@pytest.fixture(scope="session")
def smol_model(smol_checkpoint: Checkpoint) -> LlamaModel:
    """The packaged model in fp32, the reference (compared with transformers)."""
    return LlamaModel(smol_checkpoint.spec, smol_checkpoint.tensors, max_positions=4096)


@pytest.fixture(scope="session")
def smol_served_model(smol_checkpoint: Checkpoint) -> LlamaModel:
    """The packaged model in the engine's default weight format, as it is served."""
    return LlamaModel(
        smol_checkpoint.spec,
        smol_checkpoint.tensors,
        max_positions=4096,
        weights=DEFAULT_WEIGHTS,
    )


@pytest.fixture(scope="session")
def smol_tokenizer(smol_checkpoint: Checkpoint) -> ChatTokenizer:
    return ChatTokenizer(smol_checkpoint.tokenizer, smol_checkpoint.eos_token_ids)


@pytest.fixture(scope="session")
def smol_hf(smol_resolved: ResolvedModel) -> Any:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(
        smol_resolved.directory, dtype=torch.float32, local_files_only=True
    ).eval()


@pytest.fixture(scope="session")
def smol_engine(smol_data_dir: Path) -> Iterator[Engine]:
    """One engine over the packaged model for the session (tests use distinct tenants)."""
    engine = Engine(EngineConfig(data_dir=smol_data_dir, max_context_tokens=4096))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def engine(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """The tiny model's engine, shared by a module's HTTP tests."""
    config = EngineConfig(
        data_dir=tmp_path_factory.mktemp("data"), model_path=tiny_dir, max_context_tokens=256
    )
    with Engine(config) as e:
        yield e


@pytest.fixture(scope="module")
def client(engine: Engine) -> Iterator[TestClient]:
    """The engine's server in-process (starlette's TestClient)."""
    with TestClient(create_app(engine)) as c:
        yield c
