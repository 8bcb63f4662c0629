"""A fast, model-free embedder for the near-duplicate sample's candidate stage (scoped_texts.py):
signed feature hashing of character 3-grams.

A text is lower-cased, its whitespace collapsed, its first `max_chars` characters kept and
padded with a space on each side; each 3-gram of code points is hashed (a multiply-xorshift
of the three code points, in 64-bit integer arithmetic: the same in every process, never
Python's `hash()`) to a dimension and a sign, and the vector is the signed count per dimension,
L2-normalised. Texts sharing many 3-grams (paraphrases that keep most words) get a high cosine
similarity; meaning is not modelled: the matcher (MiniLM) decides, this only ranks candidates.
Its recall as a candidate stage is measured by bench/analyze_calibration.py. Vectorised with
numpy, it embeds tens of thousands of texts a second and loads no model (the static model it
replaces held ~300 MB).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from infercache.semantic.embedder import Matrix, l2_normalise

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xC2B2AE3D27D4EB4F)
_SHIFT = np.uint64(29)


class NgramEmbedder:
    def __init__(self, *, dim: int = 128, max_chars: int = 256) -> None:
        if dim < 2 or max_chars < 1:
            raise ValueError(f"need dim >= 2 and max_chars >= 1, got {dim}, {max_chars}")
        self.dim = dim
        self._max_chars = max_chars
        self.name = f"ngram3;dim={dim};first {max_chars} chars"

    def embed(self, texts: Sequence[str]) -> Matrix:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            out[row] = self._vector(text)
        return l2_normalise(out)

    def _vector(self, text: str) -> np.ndarray:
        padded = f" {' '.join(text.lower().split())[: self._max_chars]} "
        codes = np.frombuffer(padded.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        if len(codes) < 3:
            return np.zeros(self.dim, dtype=np.float32)
        c = codes.astype(np.uint64)
        with np.errstate(over="ignore"):
            grams = (c[:-2] * _M1) ^ (c[1:-1] * _M2) ^ (c[2:] << np.uint64(21))
            grams = (grams ^ (grams >> _SHIFT)) * _M1
        signs = np.where(grams & np.uint64(1), 1.0, -1.0)
        slots = ((grams >> np.uint64(1)) % np.uint64(self.dim)).astype(np.intp)
        return np.bincount(slots, weights=signs, minlength=self.dim).astype(np.float32)
