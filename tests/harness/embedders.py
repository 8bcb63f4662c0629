"""`Remembered`: a real embedder's vectors of a fixed set of texts, embedded in one batch up
front. A semantic layer asks for one text at a time, which would cost a test that replays a day
of MiniLM traffic minutes on 2 cores; the vectors are MiniLM's own, only batched."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from infercache.semantic.embedder import Matrix, MiniLMEmbedder


class Remembered:
    """`base`'s vectors of `texts` (and of no other text: a KeyError names it)."""

    def __init__(self, base: MiniLMEmbedder, texts: list[str]) -> None:
        self.dim, self.name = base.dim, base.name
        vectors = base.embed(texts)
        self._row = {t: vectors[i] for i, t in enumerate(texts)}

    def embed(self, texts: Sequence[str]) -> Matrix:
        return np.stack([self._row[t] for t in texts])
