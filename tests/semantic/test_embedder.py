"""One contract suite for every in-process `Embedder`, plus what only the real models show."""

from __future__ import annotations

import numpy as np
import pytest

from infercache.errors import ConfigError
from infercache.semantic.embedder import (
    Embedder,
    HashingEmbedder,
    MiniLMEmbedder,
    StaticEmbedder,
    l2_normalise,
    package_model_dir,
)

TEXTS = [
    "How do I reset my password?",
    "How can I change my password?",
    "What is the weather in Paris tomorrow?",
    "a",
    "Une phrase en français, avec des accents: é è à.",
    "word " * 400,  # longer than every model's token window
]


@pytest.fixture(
    params=["hashing", "static_embedder", pytest.param("minilm", marks=pytest.mark.slow)]
)
def embedder(request: pytest.FixtureRequest) -> Embedder:
    result: Embedder = request.getfixturevalue(request.param)
    return result


def test_embed_returns_one_unit_float32_row_per_text(embedder: Embedder) -> None:
    vectors = embedder.embed(TEXTS)
    assert vectors.dtype == np.float32
    assert vectors.shape == (len(TEXTS), embedder.dim)
    assert vectors.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_embedding_is_deterministic_and_independent_of_batch_company(embedder: Embedder) -> None:
    together = embedder.embed(TEXTS)
    alone = np.vstack([embedder.embed([t]) for t in reversed(TEXTS)])[::-1]
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_embedding_no_texts_gives_an_empty_matrix(embedder: Embedder) -> None:
    assert embedder.embed([]).shape == (0, embedder.dim)


def test_name_identifies_the_model(embedder: Embedder) -> None:
    assert embedder.name
    assert str(embedder.dim) in embedder.name or "==" in embedder.name


def test_batches_smaller_than_the_input_keep_input_order() -> None:
    small = StaticEmbedder(batch_size=2)
    np.testing.assert_allclose(small.embed(TEXTS), StaticEmbedder().embed(TEXTS), atol=1e-6)


def test_static_model_ranks_a_paraphrase_above_an_unrelated_question(
    static_embedder: StaticEmbedder,
) -> None:
    v = static_embedder.embed(["reset my password", "how do I change my password", "weather"])
    assert v[0] @ v[1] > v[0] @ v[2] + 0.3


def test_static_model_maps_an_empty_text_to_the_zero_vector(
    static_embedder: StaticEmbedder,
) -> None:
    vector = static_embedder.embed([""])[0]
    assert not vector.any()


@pytest.mark.slow
def test_minilm_gives_paraphrases_high_and_unrelated_texts_low_similarity(
    minilm: MiniLMEmbedder,
) -> None:
    v = minilm.embed(["reset my password", "how do I change my password", "what is the weather"])
    assert 0.75 < float(v[0] @ v[1]) < 0.9  # 0.81 with sentence-transformers
    assert abs(float(v[0] @ v[2])) < 0.2
    assert minilm.dim == 384


@pytest.mark.slow
def test_minilm_truncation_length_is_part_of_its_name(minilm: MiniLMEmbedder) -> None:
    assert "max_tokens=256" in minilm.name


def test_hashing_embedder_name_changes_with_its_settings() -> None:
    assert HashingEmbedder(dim=64).name != HashingEmbedder(dim=128).name
    assert HashingEmbedder(ngram_sizes=(3,)).name != HashingEmbedder(ngram_sizes=(3, 4)).name


def test_hashing_embedder_rejects_bad_settings_naming_them() -> None:
    with pytest.raises(ConfigError, match="dim must be at least 1, got 0"):
        HashingEmbedder(dim=0)
    with pytest.raises(ConfigError, match=r"ngram_sizes .* got \[0\]"):
        HashingEmbedder(ngram_sizes=(0,))


def test_a_missing_model_package_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="no-such-model-pkg"):
        package_model_dir("no_such_model_pkg_xyz", "no-such-model-pkg")


def test_l2_normalise_leaves_zero_rows_at_zero_without_nan() -> None:
    out = l2_normalise([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]])


@pytest.mark.slow
def test_minilm_runs_its_torch_work_on_its_own_thread_with_its_own_thread_count() -> None:
    """Beside the built-in engine the gateway asks for 1 torch thread: a second OpenMP team in
    the process would throttle the engine's decode (MiniLMEmbedder's docstring)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import torch

    before = torch.get_num_threads()
    embedder = MiniLMEmbedder(threads=1)
    seen: list[tuple[str, int]] = []
    forward = embedder._encoder._forward

    def watched(*args: object) -> object:
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return forward(*args)

    embedder._encoder._forward = watched  # type: ignore[method-assign]
    with ThreadPoolExecutor(3) as callers:  # embed may be called from any thread
        results = list(callers.map(embedder.embed, [TEXTS[:2], TEXTS[2:4], TEXTS]))
    assert len(seen) == 3
    assert {name.rsplit("_", 1)[0] for name, _ in seen} == {"infercache-embedder"}
    assert {threads for _, threads in seen} == {1}
    assert torch.get_num_threads() == before  # the caller's thread keeps its own count
    assert np.allclose(results[2][:4], np.vstack([results[0], results[1]]), atol=1e-5)
