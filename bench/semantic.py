"""Semantic-layer bench: threshold quality (tuned vs fixed defaults, with/without guards, guard
ablation), vector-index choice, and lookup latency. Figures go to stdout and to
OUT/results.json; bench/README.md ("Semantic") records them.

    .venv/bin/python bench/semantic.py [--data /work/shared/data] [--out bench/out/semantic]
        [--sections quality,guards,index,latency] [--seed 0] [--threads 2]

Data (read in place, never copied; MRPC has research-use terms):
- tuning: STS-B train (score >= 4 same, <= 2 different), banking77 random intent pairs, and
  banking77 nearest-neighbour pairs (each sampled query with its most similar other query:
  what a cache actually compares), labelled by intent equality.
- held out: STS-B dev+test, MRPC (all), hwu64 random and nearest-neighbour pairs, GPTCache
  mock pairs (positives only), and the hand-written hard cases in tests/semantic/data.
- index: MiniLM vectors of ~80k distinct real sentences from the sets above plus ShareGPT turns,
  topped up to the largest size with noisy copies (cosine ~0.9 to a real vector).
MiniLM vectors are cached in OUT/vectors-*.npz, keyed by the embedder's name.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from infercache.semantic.embedder import Embedder, MiniLMEmbedder
from infercache.semantic.guards import DEFAULT_GUARDS, Guard, build_guards, default_guards
from infercache.semantic.index import FlatIndex, VectorIndex
from infercache.semantic.tuning.calibrate import ScoredPair, evaluate, tune
from infercache.semantic.tuning.pairs import Pair, read_pairs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from semantic_public_pairs import (  # noqa: E402
    IntentRow,
    intent_pairs,
    read_banking77,
    read_gptcache_pairs,
    read_hwu64,
    read_mrpc,
    read_stsb,
)

Matrix = npt.NDArray[np.float32]
HARD_CASES = HERE.parent / "tests" / "semantic" / "data" / "hard_cases.tsv"
FIXED_THRESHOLDS = (0.8, 0.9, 0.95)


# --- vectors -----------------------------------------------------------------------------


class VectorCache:
    """text → MiniLM vector, persisted between runs (embedding 80k texts takes minutes)."""

    def __init__(self, embedder: Embedder, out: Path) -> None:
        self.embedder = embedder
        slug = hashlib.sha256(embedder.name.encode()).hexdigest()[:12]
        self.path = out / f"vectors-{slug}.npz"
        self.row: dict[str, int] = {}
        self.matrix = np.zeros((0, embedder.dim), dtype=np.float32)
        if self.path.exists():
            with np.load(self.path) as data:
                texts = json.loads(bytes(data["texts"]).decode())
                self.matrix = data["vectors"]
            self.row = {t: i for i, t in enumerate(texts)}

    def vectors(self, texts: Sequence[str]) -> Matrix:
        missing = [t for t in dict.fromkeys(texts) if t not in self.row]
        if missing:
            started = time.perf_counter()
            chunks = []
            for start in range(0, len(missing), 2048):
                chunks.append(self.embedder.embed(missing[start : start + 2048]))
                done = start + len(chunks[-1])
                rate = done / (time.perf_counter() - started)
                print(f"  embedded {done}/{len(missing)} ({rate:.0f}/s)", file=sys.stderr)
            self.matrix = np.concatenate([self.matrix, *chunks])
            start = len(self.row)
            self.row.update((t, start + i) for i, t in enumerate(missing))
            self._save()
        return self.matrix[[self.row[t] for t in texts]]

    def _save(self) -> None:
        texts = sorted(self.row, key=self.row.__getitem__)
        blob = np.frombuffer(json.dumps(texts).encode(), dtype=np.uint8)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(self.path, texts=blob, vectors=self.matrix)

    def score(self, pairs: Sequence[Pair]) -> list[ScoredPair]:
        a = self.vectors([p.a for p in pairs])
        b = self.vectors([p.b for p in pairs])
        sims = np.clip(np.einsum("ij,ij->i", a, b), -1.0, 1.0)
        return [ScoredPair(p, float(s)) for p, s in zip(pairs, sims, strict=True)]


# --- data --------------------------------------------------------------------------------


def nearest_neighbour_pairs(
    rows: Sequence[IntentRow], cache: VectorCache, rng: random.Random, count: int
) -> list[Pair]:
    """For `count` sampled queries, the most similar other query of the set, labelled by
    intent equality: the candidate a cache would actually weigh."""
    intent_of = dict(rows)  # a text listed under two intents keeps the last
    texts = list(intent_of)
    index = FlatIndex(cache.embedder.dim)
    index.add(list(range(len(texts))), cache.vectors(texts))
    queries = rng.sample(range(len(texts)), min(count, len(texts)))
    results = index.search_many(cache.vectors([texts[q] for q in queries]), 2)
    pairs = []
    for q, hits in zip(queries, results, strict=True):
        other = next(h.id for h in hits if h.id != q)
        pairs.append(Pair(texts[q], texts[other], intent_of[texts[q]] == intent_of[texts[other]]))
    return pairs


def load_sets(data: Path, cache: VectorCache, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tuning sets, held-out sets), each name → scored pairs."""
    rng = random.Random(seed)
    banking = read_banking77(data / "banking77_train.csv")
    hwu = read_hwu64(data / "hwu64_intents.tsv")
    tuning = {
        "stsb-train": read_stsb(data / "stsb.tsv", splits={"train"}),
        "banking77-random": intent_pairs(banking, rng, count=4000),
        "banking77-nn": nearest_neighbour_pairs(banking, cache, rng, 3000),
    }
    held_out = {
        "stsb-dev+test": read_stsb(data / "stsb.tsv", splits={"dev", "test"}),
        "mrpc": read_mrpc(data / "mrpc.tsv"),
        "hwu64-random": intent_pairs(hwu, rng, count=4000),
        "hwu64-nn": nearest_neighbour_pairs(hwu, cache, rng, 3000),
        "gptcache": read_gptcache_pairs(data / "gptcache_mock_pairs.json"),
    }
    if HARD_CASES.exists():
        held_out["hard-cases"] = read_pairs(HARD_CASES)
    score = cache.score
    return (
        {name: score(pairs) for name, pairs in tuning.items()},
        {name: score(pairs) for name, pairs in held_out.items()},
    )


def pooled(sets: dict[str, list[ScoredPair]], skip: Sequence[str] = ()) -> list[ScoredPair]:
    return [p for name, items in sets.items() if name not in skip for p in items]


# --- quality -----------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    return "   -  " if value is None else f"{value:6.3f}"


def quality(tuning: dict[str, Any], held_out: dict[str, Any], target: float) -> dict[str, Any]:
    configs: dict[str, Sequence[Guard]] = {"no guards": [], "default guards": default_guards()}
    all_tuning = pooled(tuning)
    results: dict[str, Any] = {}
    for label, guards in configs.items():
        calibration = tune(all_tuning, target_false_hit=target, guards=guards)
        tuned = calibration.threshold
        print(
            f"\n== {label}: tuned on {'+'.join(tuning)} "
            f"({len(all_tuning)} pairs) → threshold {tuned:.4f}"
        )
        e = calibration.evaluation
        print(
            f"   on the tuning pairs: false-hit {e.false_hit_rate:.4f} "
            f"(95% upper {e.false_hit_upper:.4f}), hit {e.hit_rate:.3f}"
        )
        thresholds = {"tuned": tuned, **{f"{t:.2f}": t for t in FIXED_THRESHOLDS}}
        table: dict[str, Any] = {}
        print(f"   {'set':<16}" + "".join(f"{name:>22}" for name in thresholds))
        print(f"   {'':<16}" + "".join(f"{'false-hit   hit':>22}" for _ in thresholds))
        sets = {**held_out, "held-out pooled": pooled(held_out, skip=("hard-cases",))}
        for set_name, pairs in sets.items():
            row = {}
            cells = []
            for name, threshold in thresholds.items():
                ev = evaluate(pairs, threshold, guards=guards)
                row[name] = ev.to_dict()
                cells.append(f"{_fmt(ev.false_hit_rate)}  {_fmt(ev.hit_rate)}".rjust(22))
            table[set_name] = row
            print(f"   {set_name:<16}" + "".join(cells))
        results[label] = {"threshold": tuned, "tuning": calibration.to_dict(), "held_out": table}
    return results


ALL_GUARDS = ["numbers", "dates", "currencies", "negation", "entities:conflict"]
GUARD_CONFIGS: dict[str, list[str]] = {
    "none": [],
    **{spec: [spec] for spec in ["numbers", "numbers:conflict", "dates", "dates:conflict"]},
    **{spec: [spec] for spec in ["currencies", "negation", "entities", "entities:conflict"]},
    "all (5)": ALL_GUARDS,
    "default: " + ", ".join(DEFAULT_GUARDS): list(DEFAULT_GUARDS),
    **{f"all - {spec}": [g for g in ALL_GUARDS if g != spec] for spec in ALL_GUARDS},
}


def threshold_only_hit(pairs: Sequence[ScoredPair], false_hit_rate: float) -> float:
    """The best hit rate a threshold alone (no guards) reaches on `pairs` without exceeding
    `false_hit_rate`: the frontier a guard has to beat to pay for itself."""
    negatives = sorted((p.similarity for p in pairs if not p.pair.same), reverse=True)
    positives = np.array([p.similarity for p in pairs if p.pair.same])
    allowed = int(false_hit_rate * len(negatives) + 1e-9)
    if allowed >= len(negatives):
        return 1.0
    return float(np.mean(positives > negatives[allowed]))


def guard_ablation(
    tuning: dict[str, Any], held_out: dict[str, Any], target: float
) -> dict[str, Any]:
    """Each guard alone, all five, and all-but-one: (a) at the threshold tuned without guards,
    (b) re-tuned with the guards on, compared with what a threshold alone reaches on the
    held-out pairs at the same false-hit rate (Δhit > 0: the guard pays)."""
    all_tuning = pooled(tuning)
    held = pooled(held_out, skip=("hard-cases",))
    hard = held_out.get("hard-cases", [])
    base = tune(all_tuning, target_false_hit=target).threshold
    results: dict[str, Any] = {"base_threshold": base}
    print(f"\n== guard ablation: held-out pooled ({len(held)} pairs) and hard cases ({len(hard)})")
    print(f"   (a) at the no-guard tuned threshold {base:.4f}; (b) re-tuned with the guards")
    print(f"   {'guards':<34}{'(a) FH':>8}{'hit':>7}{'hard FH':>9} |{'(b) thr':>8}{'FH':>7}"
          f"{'hit':>7}{'thr-only hit':>13}{'Δhit':>7}{'hard FH':>9}{'hard hit':>9}")  # fmt: skip
    for label, specs in GUARD_CONFIGS.items():
        guards = build_guards(specs)
        retuned = tune(all_tuning, target_false_hit=target, guards=guards).threshold
        at_base = evaluate(held, base, guards=guards)
        at_retuned = evaluate(held, retuned, guards=guards)
        hard_base = evaluate(hard, base, guards=guards)
        hard_retuned = evaluate(hard, retuned, guards=guards)
        assert at_retuned.false_hit_rate is not None
        assert at_retuned.hit_rate is not None
        frontier = threshold_only_hit(held, at_retuned.false_hit_rate)
        results[label] = {
            "guards": specs,
            "retuned_threshold": retuned,
            "held_out_at_base": at_base.to_dict(),
            "held_out_at_retuned": at_retuned.to_dict(),
            "threshold_only_hit_at_same_false_hit": frontier,
            "hard_cases_at_base": hard_base.to_dict(),
            "hard_cases_at_retuned": hard_retuned.to_dict(),
        }
        print(
            f"   {label:<34}{_fmt(at_base.false_hit_rate):>8}{_fmt(at_base.hit_rate):>7}"
            f"{_fmt(hard_base.false_hit_rate):>9} |{retuned:>8.4f}"
            f"{_fmt(at_retuned.false_hit_rate):>7}{_fmt(at_retuned.hit_rate):>7}"
            f"{frontier:>13.3f}{at_retuned.hit_rate - frontier:>+7.3f}"
            f"{_fmt(hard_retuned.false_hit_rate):>9}{_fmt(hard_retuned.hit_rate):>9}"
        )
    return results


# --- index -------------------------------------------------------------------------------


def corpus_texts(data: Path) -> list[str]:
    """Distinct real sentences: every text of the pair sets plus ShareGPT sentences."""
    texts: list[str] = []
    for pair in [
        *read_stsb(data / "stsb.tsv", same_min=0.0),
        *read_mrpc(data / "mrpc.tsv"),
        *read_gptcache_pairs(data / "gptcache_mock_pairs.json"),
    ]:
        texts += [pair.a, pair.b]
    texts += [t for t, _ in read_banking77(data / "banking77_train.csv")]
    texts += [t for t, _ in read_hwu64(data / "hwu64_intents.tsv")]
    with (data / "sharegpt_multiturn_sample.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            for message in json.loads(line)["conversations"]:
                for sentence in re.split(r"(?<=[.!?])\s+|\n+", message["value"]):
                    if 20 <= len(sentence.strip()) <= 300:
                        texts.append(sentence.strip())
    return list(dict.fromkeys(texts))


def top_up(vectors: Matrix, size: int, rng: np.random.Generator) -> Matrix:
    """`vectors` extended to `size` rows by noisy copies (cosine ~0.9 to their source)."""
    if len(vectors) >= size:
        return vectors[:size]
    sources = vectors[rng.integers(0, len(vectors), size - len(vectors))]
    noisy = sources + rng.normal(0.0, 0.0247, sources.shape).astype(np.float32)
    noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
    return np.concatenate([vectors, noisy.astype(np.float32)])


class FaissFlat:
    """faiss IndexIDMap2(IndexFlatIP): exact, removable (bench-only candidate)."""

    def __init__(self, dim: int) -> None:
        import faiss

        self.index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))

    def add(self, ids: Sequence[int], vectors: Matrix) -> None:
        self.index.add_with_ids(vectors, np.asarray(ids, dtype=np.int64))

    def search_ids(self, vector: Matrix, k: int) -> list[int]:
        _, ids = self.index.search(vector[None, :], k)
        return [int(i) for i in ids[0] if i >= 0]

    def remove(self, ids: Sequence[int]) -> None:
        self.index.remove_ids(np.asarray(ids, dtype=np.int64))


class FaissHNSW:
    """faiss IndexHNSWFlat (inner product): fast, but cannot remove (bench-only candidate)."""

    removable = False

    def __init__(
        self, dim: int, m: int = 32, ef_construction: int = 64, ef_search: int = 64
    ) -> None:
        import faiss

        self.index = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = ef_construction
        self.index.hnsw.efSearch = ef_search
        self.ids: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)

    def add(self, ids: Sequence[int], vectors: Matrix) -> None:
        self.index.add(vectors)
        self.ids = np.concatenate([self.ids, np.asarray(ids, dtype=np.int64)])

    def search_ids(self, vector: Matrix, k: int) -> list[int]:
        _, rows = self.index.search(vector[None, :], k)
        return [int(self.ids[r]) for r in rows[0] if r >= 0]


class PackageIndex:
    """Adapter from a `VectorIndex` of the package to the bench's interface."""

    def __init__(self, index: VectorIndex) -> None:
        self.index = index

    def add(self, ids: Sequence[int], vectors: Matrix) -> None:
        self.index.add(ids, vectors)

    def search_ids(self, vector: Matrix, k: int) -> list[int]:
        return [h.id for h in self.index.search(vector, k)]

    def remove(self, ids: Sequence[int]) -> None:
        self.index.remove(ids)


def index_candidates(dim: int) -> dict[str, Callable[[], Any]]:
    from infercache.semantic.hnsw_index import HNSWIndex

    return {
        "flat-numpy (FlatIndex)": lambda: PackageIndex(FlatIndex(dim)),
        "faiss IDMap2(FlatIP)": lambda: FaissFlat(dim),
        "faiss HNSWFlat M=32": lambda: FaissHNSW(dim),
        "usearch f32 M=16": lambda: PackageIndex(HNSWIndex(dim, dtype="f32")),
        "usearch f32 M=16 ef_add=64": lambda: PackageIndex(
            HNSWIndex(dim, dtype="f32", expansion_add=64)
        ),
        "usearch f16 M=16": lambda: PackageIndex(HNSWIndex(dim, dtype="f16")),
        "usearch i8 M=16": lambda: PackageIndex(HNSWIndex(dim, dtype="i8")),
    }


def _percentiles_ms(samples_s: Sequence[float]) -> tuple[float, float]:
    p50, p99 = np.percentile(np.asarray(samples_s) * 1000.0, [50, 99])
    return float(p50), float(p99)


def index_bench(
    base: Matrix, queries: Matrix, sizes: Sequence[int], rng: np.random.Generator
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for size in sizes:
        vectors = top_up(base, size, rng)
        ids = list(range(size))
        exact = FlatIndex(vectors.shape[1])
        exact.add(ids, vectors)
        truth = [hits[0].id for hits in exact.search_many(queries, 1)]
        removed = set(rng.choice(size, size // 10, replace=False).tolist())
        print(f"\n== index at {size} vectors ({len(queries)} single-vector queries, k=10)")
        print(
            f"   {'index':<26}{'build s':>9}{'p50 ms':>9}{'p99 ms':>9}{'recall@1':>10}"
            f"{'after 10% removed: dead hits':>30}{'recall@1':>10}"
        )
        for name, factory in index_candidates(vectors.shape[1]).items():
            index = factory()
            started = time.perf_counter()
            index.add(ids, vectors)
            build_s = time.perf_counter() - started
            latencies, found = [], []
            for query in queries:
                t0 = time.perf_counter()
                got = index.search_ids(query, 10)
                latencies.append(time.perf_counter() - t0)
                found.append(got[0] if got else None)
            p50, p99 = _percentiles_ms(latencies)
            recall = float(np.mean([f == t for f, t in zip(found, truth, strict=True)]))
            row: dict[str, Any] = {
                "build_s": build_s,
                "p50_ms": p50,
                "p99_ms": p99,
                "recall_at_1": recall,
            }
            after = "cannot remove"
            if hasattr(index, "remove"):
                index.remove(sorted(removed))
                exact_after = FlatIndex(vectors.shape[1])
                keep = [i for i in ids if i not in removed]
                exact_after.add(keep, vectors[keep])
                truth_after = [h[0].id for h in exact_after.search_many(queries, 1)]
                results_after = [index.search_ids(q, 10) for q in queries]
                dead = sum(1 for r in results_after for i in r if i in removed)
                recall_after = float(
                    np.mean(
                        [
                            bool(r) and r[0] == t
                            for r, t in zip(results_after, truth_after, strict=True)
                        ]
                    )
                )
                row.update(dead_hits_after_remove=dead, recall_at_1_after_remove=recall_after)
                after = f"{dead:>30}{recall_after:>10.3f}"
            results.setdefault(str(size), {})[name] = row
            print(f"   {name:<26}{build_s:>9.2f}{p50:>9.3f}{p99:>9.3f}{recall:>10.3f}{after}")
    return results


# --- latency -----------------------------------------------------------------------------


def latency_bench(
    embedder: Embedder,
    base: Matrix,
    texts: Sequence[str],
    sizes: Sequence[int],
    rng: np.random.Generator,
    threads: Sequence[int],
    rounds: int = 3,
) -> dict[str, Any]:
    """End-to-end lookup: embed one query with MiniLM, then search the index (k=5), for each
    torch thread count. Queries are real sentences held out of the index. The machine is
    shared, so every configuration runs `rounds` interleaved rounds over all queries; the
    figures are those of its quietest round (lowest p50), with all rounds pooled beside."""
    import torch

    from infercache.semantic.hnsw_index import HNSWIndex

    results: dict[str, Any] = {"load_average_before": os.getloadavg()}
    print(f"\n== lookup latency: embed 1 query with MiniLM + search k=5, {len(texts)} queries,")
    print(f"   best of {rounds} interleaved rounds (all rounds pooled in brackets)")
    for size in sizes:
        vectors = top_up(base, size, rng)
        indexes: dict[str, VectorIndex] = {
            "usearch f32": HNSWIndex(vectors.shape[1]),
            "FlatIndex": FlatIndex(vectors.shape[1]),
        }
        for index in indexes.values():
            index.add(list(range(size)), vectors)
        samples: dict[str, list[tuple[list[float], list[float]]]] = {}
        for _ in range(rounds):
            for thread_count in threads:
                torch.set_num_threads(thread_count)
                for name, index in indexes.items():
                    for text in texts[:10]:  # warm-up
                        index.search(embedder.embed([text])[0], 5)
                    embed_s, total_s = [], []
                    for text in texts:
                        t0 = time.perf_counter()
                        vector = embedder.embed([text])[0]
                        t1 = time.perf_counter()
                        index.search(vector, 5)
                        total_s.append(time.perf_counter() - t0)
                        embed_s.append(t1 - t0)
                    key = f"{name}, torch threads={thread_count}"
                    samples.setdefault(key, []).append((total_s, embed_s))
        for key, runs in samples.items():
            total_s, embed_s = min(runs, key=lambda run: float(np.median(run[0])))
            p50, p99 = _percentiles_ms(total_s)
            e50, e99 = _percentiles_ms(embed_s)
            a50, a99 = _percentiles_ms([t for run in runs for t in run[0]])
            results.setdefault(str(size), {})[key] = {
                "p50_ms": p50,
                "p99_ms": p99,
                "embed_p50_ms": e50,
                "embed_p99_ms": e99,
                "all_rounds_p50_ms": a50,
                "all_rounds_p99_ms": a99,
            }
            print(
                f"   {size:>7} {key:<30} lookup p50 {p50:6.2f} ms  p99 {p99:6.2f} ms"
                f"  [{a50:6.2f} / {a99:6.2f}]  embedding alone p50 {e50:.2f}  p99 {e99:.2f}"
            )
    results["load_average_after"] = os.getloadavg()
    print(f"   load average before/after: {results['load_average_before']} / "
          f"{results['load_average_after']} (other processes share the 2 cores)")  # fmt: skip
    return results


# --- main --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--out", type=Path, default=HERE / "out" / "semantic")
    parser.add_argument("--sections", default="quality,guards,index,latency")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target-false-hit", type=float, default=0.01)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--latency-threads", default="1,2", help="torch thread counts to try")
    args = parser.parse_args(argv)
    sections = set(args.sections.split(","))
    sizes = [int(s) for s in args.sizes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    embedder = MiniLMEmbedder(threads=args.threads)
    cache = VectorCache(embedder, args.out)
    results: dict[str, Any] = {"embedder": embedder.name, "threads": args.threads}
    if sections & {"quality", "guards"}:
        tuning, held_out = load_sets(args.data, cache, args.seed)
        results["sets"] = {n: len(p) for n, p in {**tuning, **held_out}.items()}
        if "quality" in sections:
            results["quality"] = quality(tuning, held_out, args.target_false_hit)
        if "guards" in sections:
            results["guards"] = guard_ablation(tuning, held_out, args.target_false_hit)
    if sections & {"index", "latency"}:
        rng = np.random.default_rng(args.seed)
        texts = corpus_texts(args.data)
        order = rng.permutation(len(texts))
        query_texts = [texts[i] for i in order[: args.queries]]
        base_texts = [texts[i] for i in order[args.queries :]]
        base = cache.vectors(base_texts)
        if "index" in sections:
            results["index"] = index_bench(base, cache.vectors(query_texts), sizes, rng)
        if "latency" in sections:
            threads = [int(t) for t in args.latency_threads.split(",")]
            results["latency"] = latency_bench(
                embedder, base, query_texts[:200], sizes, rng, threads
            )
    path = args.out / "results.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**previous, **results}, indent=2))
    print(f"\nwrote {path} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
