"""A bench helper: an `Embedder` that remembers every vector of its base embedder on disk, so a
rerun of a bench never embeds the same text twice (MiniLM embeds a few hundred texts a second
on 2 free cores, far fewer on a busy box). Vectors are exactly the base's; the file is keyed by
the base's `name`."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from infercache.semantic.embedder import Embedder

Matrix = npt.NDArray[np.float32]


class RememberingEmbedder:
    def __init__(self, base: Embedder, directory: Path) -> None:
        self.base = base
        self.dim = base.dim
        self.name = base.name
        slug = hashlib.sha256(base.name.encode()).hexdigest()[:12]
        self.path = directory / f"vectors-{slug}.npz"
        self._row: dict[str, int] = {}
        self._matrix = np.zeros((0, base.dim), dtype=np.float32)
        if self.path.exists():
            with np.load(self.path) as data:
                texts = json.loads(bytes(data["texts"]).decode())
                self._matrix = np.asarray(data["vectors"], dtype=np.float32)
            self._row = {t: i for i, t in enumerate(texts)}

    def warm(self, texts: Sequence[str]) -> None:
        """Embed (in batches) and save every text not remembered yet."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._row]
        if not missing:
            return
        started = time.perf_counter()
        chunks = []
        for start in range(0, len(missing), 512):
            chunks.append(self.base.embed(missing[start : start + 512]))
            done = start + len(chunks[-1])
            rate = done / (time.perf_counter() - started)
            print(f"  embedded {done}/{len(missing)} ({rate:.0f}/s)", flush=True)
        first = len(self._matrix)
        self._matrix = np.concatenate([self._matrix, *chunks])
        self._row.update((t, first + i) for i, t in enumerate(missing))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        texts = sorted(self._row, key=self._row.__getitem__)
        blob = np.frombuffer(json.dumps(texts).encode(), dtype=np.uint8)
        np.savez(self.path, texts=blob, vectors=self._matrix)

    def embed(self, texts: Sequence[str]) -> Matrix:
        self.warm(texts)
        return self._matrix[[self._row[t] for t in texts]]
