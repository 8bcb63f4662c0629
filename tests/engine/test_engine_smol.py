"""Acceptance 3 and 4 on the packaged model: tenant isolation and model swaps report 0 cached
tokens on the first request; a shared prefix is reused otherwise."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from infercache.engine.config import EngineConfig
from infercache.engine.engine import Engine
from infercache.engine.weights import ResolvedModel

from .conftest import write_tiny_llama

DOCUMENT = "The radix tree stores token prefixes so that later requests reuse their KV. " * 20


def body(engine: Engine, question: str) -> dict[str, Any]:
    return {
        "model": engine.model_id,
        "messages": [
            {"role": "system", "content": DOCUMENT},
            {"role": "user", "content": question},
        ],
        "temperature": 0,
        "max_tokens": 8,
    }


def cached(response: dict[str, Any]) -> int:
    tokens: int = response["usage"]["prompt_tokens_details"]["cached_tokens"]
    return tokens


@pytest.mark.slow
def test_a_known_fact_comes_back_from_the_packaged_model(smol_engine: Engine) -> None:
    out = smol_engine.chat(
        {
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "max_tokens": 12,
        },
        tenant="facts",
    )
    assert "Paris" in out["choices"][0]["message"]["content"]


@pytest.mark.slow
def test_two_tenants_with_the_same_prompt_never_share_kv(smol_engine: Engine) -> None:
    first_a = smol_engine.chat(body(smol_engine, "Summarise."), tenant="acme")
    first_b = smol_engine.chat(body(smol_engine, "Summarise."), tenant="globex")
    second_a = smol_engine.chat(body(smol_engine, "Summarise."), tenant="acme")
    assert cached(first_a) == 0
    assert cached(first_b) == 0
    assert cached(second_a) == second_a["usage"]["prompt_tokens"] - 1
    assert first_a["choices"] == first_b["choices"] == second_a["choices"]


@pytest.mark.slow
def test_after_a_model_swap_the_first_request_reuses_nothing(
    smol_resolved: ResolvedModel, tmp_path: Path
) -> None:
    # A random tiny Llama with the packaged model's tokenizer, served under the same id.
    other = tmp_path / "random-llama"
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer_dir.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smol_resolved.directory / name).is_file():
            shutil.copy(smol_resolved.directory / name, tokenizer_dir / name)
    vocab = json.loads((smol_resolved.directory / "config.json").read_text())["vocab_size"]
    write_tiny_llama(other, tokenizer_dir, seed=11, vocab_size=vocab)
    config = EngineConfig(
        data_dir=smol_resolved.directory.parent.parent,
        served_model_id="chat",
        max_context_tokens=2048,
    )
    with Engine(config) as engine:
        engine.chat(body(engine, "first"))
        assert cached(engine.chat(body(engine, "second"))) > 0
        smol_version = engine.model_version
        engine.swap_model(other, served_model_id="chat")
        assert engine.model_version != smol_version
        after = engine.chat(body(engine, "second"))
        assert cached(after) == 0
        assert after["system_fingerprint"] == engine.model_version
        assert cached(engine.chat(body(engine, "third"))) > 0
        engine.swap_model(None, served_model_id="chat")
        back = engine.chat(body(engine, "third"))
        assert cached(back) == 0
        assert back["system_fingerprint"] == smol_version
