"""Regenerates the analyzer's default near-duplicate matcher: the packaged MiniLM embedder, a
threshold calibrated on public paraphrase data, and the cheap candidate filter in front of it.
Writes src/infercache/analyze/default_matcher.json (the package reads it; provenance inside)
and prints what it measured; bench/README.md ("Analyzer") records it.

    .venv/bin/python bench/analyze_calibration.py [--data /work/shared/data] [--seed 0]
        [--out bench/out/analyze] [--threads 2]

Data (read in place; only derived numbers are written; MRPC, with research-use terms, is not
used at all):
- tuning: STS-B train (score >= 4 same, <= 2 different; CC BY-SA 4.0), banking77 random intent
  pairs and nearest-neighbour pairs (each sampled query with its most similar other query,
  labelled by intent equality: the hard negatives a support bot's cache meets; CC BY 4.0), and
  the GPTCache mock pairs (positives only; MIT).
- held out: STS-B dev+test, hwu64 random and nearest-neighbour pairs (CC BY 4.0).
The threshold is `calibrate.tune` at a 1% false-hit target (95% Wilson upper bound) with the
default guards: the rule `infercache tune` applies.

The candidate stage (near_duplicates.py): on a large log the analyzer checks a sample of the
requests, each against the earlier texts of its scope that character 3-gram hashing
(analyze/ngram_embedder.py) ranks in its `k` nearest or shared words rank in their `k` best,
keeping those sharing at least `min_word_jaccard` of their words. `min_word_jaccard` is the
highest value on a 0.05 grid that keeps 99% of the pairs MiniLM accepts on the tuning pairs.
The stage's recall is then measured with the analyzer's own code on two dense scopes, where
ranking matters most: 1,500 banking77 (and hwu64) texts each checked against the 8,000+ others
of the set, the truth being whether MiniLM accepts any of them; recall = the share of those the
stage still finds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from infercache.analyze.near_duplicates.embedders import candidate_embedder
from infercache.analyze.near_duplicates.finder import first_accepted
from infercache.analyze.near_duplicates.scoped_texts import Neighbour, ScopedTexts
from infercache.analyze.near_duplicates.word_index import jaccard, words
from infercache.semantic.decision import accept
from infercache.semantic.embedder import Embedder, MiniLMEmbedder
from infercache.semantic.guards import default_guards
from infercache.semantic.index import FlatIndex
from infercache.semantic.scope import Query
from infercache.semantic.tuning.calibrate import ScoredPair, evaluate, tune
from infercache.semantic.tuning.pairs import Pair

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from semantic_public_pairs import (  # noqa: E402
    IntentRow,
    intent_pairs,
    read_banking77,
    read_gptcache_pairs,
    read_hwu64,
    read_stsb,
)

OUT_FILE = HERE.parent / "src" / "infercache" / "analyze" / "default_matcher.json"
LABEL = "public calibration — tune on your own pairs before serving"
TARGET_FALSE_HIT = 0.01
PAIR_RECALL = 0.99
CANDIDATES_K = 16
SCOPE_QUERIES = 1500
SOURCES = {
    "stsb.tsv": "STS-B (GLUE); scores CC BY-SA 4.0, texts under their sources' licences",
    "banking77_train.csv": "banking77 (PolyAI), CC BY 4.0",
    "gptcache_mock_pairs.json": "GPTCache examples/benchmark mock pairs (zilliztech), MIT",
    "hwu64_intents.tsv": "HWU64 / NLU-Evaluation-Data, CC BY 4.0",
}
Matrix = npt.NDArray[np.float32]


class Vectors:
    """text → vector, each distinct text embedded once (MiniLM ones persisted between runs)."""

    def __init__(self, embedder: Embedder, cache: Path | None) -> None:
        self.embedder = embedder
        self.cache = cache
        self.rows: dict[str, Matrix] = {}
        if cache is not None and cache.exists():
            with np.load(cache) as data:
                texts = json.loads(bytes(data["texts"]).decode())
                self.rows = dict(zip(texts, data["vectors"], strict=True))

    def of(self, texts: Sequence[str]) -> Matrix:
        missing = [t for t in dict.fromkeys(texts) if t not in self.rows]
        if missing:
            started = time.perf_counter()
            vectors = self.embedder.embed(missing)
            rate = len(missing) / (time.perf_counter() - started)
            print(f"  {self.embedder.name[:24]}: {len(missing)} texts ({rate:.0f}/s)")
            self.rows.update(zip(missing, vectors, strict=True))
            if self.cache is not None:
                blob = np.frombuffer(json.dumps(list(self.rows)).encode(), dtype=np.uint8)
                self.cache.parent.mkdir(parents=True, exist_ok=True)
                np.savez(self.cache, texts=blob, vectors=np.stack(list(self.rows.values())))
        return np.stack([self.rows[t] for t in texts])

    def score(self, pairs: Sequence[Pair]) -> list[ScoredPair]:
        a, b = self.of([p.a for p in pairs]), self.of([p.b for p in pairs])
        sims = np.clip(np.einsum("ij,ij->i", a, b), -1.0, 1.0)
        return [ScoredPair(p, float(s)) for p, s in zip(pairs, sims, strict=True)]


def nearest_neighbour_pairs(
    rows: Sequence[IntentRow], vectors: Vectors, rng: random.Random, count: int
) -> list[Pair]:
    """For `count` sampled texts, the most similar other text of the set, labelled by intent."""
    intent_of = dict(rows)
    texts = list(intent_of)
    index = FlatIndex(vectors.embedder.dim)
    index.add(list(range(len(texts))), vectors.of(texts))
    queries = rng.sample(range(len(texts)), min(count, len(texts)))
    found = index.search_many(vectors.of([texts[q] for q in queries]), 2)
    pairs = []
    for q, hits in zip(queries, found, strict=True):
        other = next(h.id for h in hits if h.id != q)
        pairs.append(Pair(texts[q], texts[other], intent_of[texts[q]] == intent_of[texts[other]]))
    return pairs


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def accepted(scored: Sequence[ScoredPair], threshold: float) -> list[Pair]:
    guards = default_guards()
    return [
        s.pair
        for s in scored
        if accept(s.similarity, s.pair.a, s.pair.b, threshold, guards).accepted
    ]


def word_floor(tuning: list[Pair], held_out: list[Pair]) -> dict[str, Any]:
    """The highest shared-word floor (0.05 grid) keeping PAIR_RECALL of the accepted pairs."""
    tuned = np.array([jaccard(words(p.a), words(p.b)) for p in tuning])
    floor = 1.0
    while floor > 0 and float(np.mean(tuned >= floor)) < PAIR_RECALL:
        floor = round(floor - 0.05, 2)
    held = np.array([jaccard(words(p.a), words(p.b)) for p in held_out])
    return {
        "min_word_jaccard": floor,
        "accepted_tuning_pairs": len(tuning),
        "pair_recall_tuning": float(np.mean(tuned >= floor)),
        "accepted_held_out_pairs": len(held_out),
        "pair_recall_held_out": float(np.mean(held >= floor)) if len(held) else None,
    }


def scope_recall(
    texts: list[str], minilm: Vectors, static: Vectors, threshold: float, floor: float, seed: int
) -> dict[str, Any]:
    """One dense scope: how many of the queries MiniLM finds a near-duplicate for among all
    the others does the candidate stage still find one for (the analyzer's own code)."""
    rng = random.Random(seed)
    texts = list(dict.fromkeys(texts))
    rng.shuffle(texts)
    queries, pool = texts[:SCOPE_QUERIES], texts[SCOPE_QUERIES:]
    guards = default_guards()
    store = ScopedTexts(
        max_vectors=len(pool) + 1,
        index_factory=lambda dim: FlatIndex(dim),
        embed=lambda texts: static.of(texts),
    )
    for text in pool:
        store.remember(Query("scope", text), None, None)
    matrix, queried = minilm.of(pool), minilm.of(queries)
    truth = found = candidates = 0
    for i, query in enumerate(queries):
        similarities = matrix @ queried[i]
        order = np.argsort(-similarities)[:16]
        full = [Neighbour(float(similarities[j]), pool[j], None) for j in order]
        if first_accepted(query, full, threshold, guards) is None:
            continue
        truth += 1
        near = store.candidates(
            Query("scope", query), k=CANDIDATES_K, min_word_jaccard=floor, guards=guards
        )
        candidates += len(near)
        rescored = sorted(
            (Neighbour(float(minilm.of([n.text])[0] @ queried[i]), n.text, None) for n in near),
            key=lambda n: -n.similarity,
        )
        found += first_accepted(query, rescored, threshold, guards) is not None
    return {
        "queries": len(queries),
        "scope_texts": len(pool),
        "with_a_near_duplicate": truth,
        "found_by_the_stage": found,
        "recall": found / truth if truth else None,
        "mean_candidates": candidates / truth if truth else None,
    }


def figures(evaluation: Any) -> dict[str, Any]:
    keep = ("pairs", "positives", "negatives", "hits", "false_hits", "hit_rate")
    out = {k: getattr(evaluation, k) for k in keep}
    out["false_hit_rate"] = evaluation.false_hit_rate
    out["false_hit_upper_95"] = evaluation.false_hit_upper
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--out", type=Path, default=HERE / "out" / "analyze")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    data, rng = args.data, random.Random(args.seed)
    minilm = Vectors(MiniLMEmbedder(threads=args.threads), args.out / "calibration-minilm.npz")
    static = Vectors(candidate_embedder(), None)  # what the analyzer ranks candidates with
    banking = read_banking77(data / "banking77_train.csv")
    hwu = read_hwu64(data / "hwu64_intents.tsv")
    tuning = {
        "stsb-train": read_stsb(data / "stsb.tsv", splits={"train"}),
        "banking77-random": intent_pairs(banking, rng, count=4000),
        "banking77-nn": nearest_neighbour_pairs(banking, minilm, rng, 3000),
        "gptcache": read_gptcache_pairs(data / "gptcache_mock_pairs.json"),
    }
    held_out = {
        "stsb-dev+test": read_stsb(data / "stsb.tsv", splits={"dev", "test"}),
        "hwu64-random": intent_pairs(hwu, rng, count=4000),
        "hwu64-nn": nearest_neighbour_pairs(hwu, minilm, rng, 3000),
    }
    tuned = minilm.score([p for pairs in tuning.values() for p in pairs])
    guards = default_guards()
    calibration = tune(tuned, target_false_hit=TARGET_FALSE_HIT, guards=guards)
    threshold = calibration.threshold
    held = {name: minilm.score(pairs) for name, pairs in held_out.items()}
    pooled = [s for scored in held.values() for s in scored]
    stage: dict[str, Any] = {"embedder": static.embedder.name, "k": CANDIDATES_K}
    stage.update(word_floor(accepted(tuned, threshold), accepted(pooled, threshold)))
    floor = stage["min_word_jaccard"]
    stage["dense_scopes"] = {
        "banking77": scope_recall(
            [t for t, _ in banking], minilm, static, threshold, floor, args.seed
        ),
        "hwu64": scope_recall([t for t, _ in hwu], minilm, static, threshold, floor, args.seed),
    }
    document = {
        "schema": "infercache.analyze.near_duplicates.default_matcher/1",
        "label": LABEL,
        "embedder": minilm.embedder.name,
        "threshold": threshold,
        "guards": [g.name for g in guards],
        "target_false_hit": TARGET_FALSE_HIT,
        "confidence": calibration.evaluation.confidence,
        "tuning": {
            "sets": {name: len(pairs) for name, pairs in tuning.items()},
            **figures(calibration.evaluation),
        },
        "held_out": {
            name: figures(evaluate(scored, threshold, guards=guards))
            for name, scored in [*held.items(), ("pooled", pooled)]
        },
        "candidates": stage,
        "sources": [
            {"file": name, "sha256": sha256(data / name), "licence": licence}
            for name, licence in SOURCES.items()
        ],
        "generated_by": f"bench/analyze_calibration.py --seed {args.seed}",
    }
    OUT_FILE.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    print(json.dumps(document, indent=2, ensure_ascii=False))
    print(f"wrote {OUT_FILE}")


if __name__ == "__main__":
    main()
