"""Semantic lookup latency through the real layer: `SemanticLayer.lookup` on a cache holding N
entries (embedding the query, searching its scope's index, the accept rule, reading the
candidate's exact entry), beside the embedding alone, measured in the same process.

    .venv/bin/python bench/semantic_lookup.py [--data /work/shared/data] [--sizes 10000,100000]
        [--queries 300] [--threads 1] [--matcher DIR] [--rounds 3]

Entries: banking77 + hwu64 texts (real support and assistant questions), each stored as an
exact entry plus its semantic record, topped up to the size by noisy copies of real vectors
(cosine ~0.9 to their source) under distinct texts. Entries are written through the layer's
own `store` with a precomputed vector, so filling 100k entries does not embed 100k texts.
Queries: other real questions of the same sets, asked in the entries' scope.
`--matcher DIR`: the fitted matcher written by `infercache tune --fit` (the default is the
packaged MiniLM). Figures go to stdout and OUT/results.json; bench/README.md records them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from infercache.cache import Cache
from infercache.clock import SystemClock
from infercache.request import parse_request
from infercache.semantic.embedder import Embedder, MiniLMEmbedder
from infercache.semantic.guards import default_guards
from infercache.semantic.layer import Probe, SemanticConfig
from infercache.semantic.scope import query_of
from infercache.settings import Settings

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from semantic_public_pairs import read_banking77, read_hwu64  # noqa: E402

Matrix = npt.NDArray[np.float32]
# No vowels, no m/n/p: a suffix can never spell a number, a date word or a negation.
SUFFIX_LETTERS = "bcdfghjklqrstvwxz"


def ask(text: str) -> dict[str, Any]:
    return {
        "model": "support-model",
        "messages": [
            {"role": "system", "content": "You are the support assistant of a bank."},
            {"role": "user", "content": text},
        ],
        "temperature": 0,
    }


def answer(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "model": "support-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"The answer to: {text}"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50},
    }


def suffix(i: int) -> str:
    letters = []
    while True:
        i, r = divmod(i, len(SUFFIX_LETTERS))
        letters.append(SUFFIX_LETTERS[r])
        if i == 0:
            return "".join(letters)


def embed_cached(embedder: Embedder, texts: Sequence[str], path: Path) -> Matrix:
    if path.exists():
        with np.load(path) as data:
            if json.loads(bytes(data["texts"]).decode()) == list(texts):
                return np.asarray(data["vectors"], dtype=np.float32)
    started = time.perf_counter()
    vectors = np.concatenate(
        [embedder.embed(list(texts[i : i + 1024])) for i in range(0, len(texts), 1024)]
    )
    print(f"  embedded {len(texts)} texts in {time.perf_counter() - started:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = np.frombuffer(json.dumps(list(texts)).encode(), dtype=np.uint8)
    np.savez(path, texts=blob, vectors=vectors)
    return vectors


def fill_vectors(embedder: Embedder, texts: Sequence[str], out: Path) -> Matrix:
    """The entries' vectors, from the base model's remembered vectors (a fitted embedder's
    adapter is applied to them: the same vectors it would compute)."""
    from infercache.semantic.embedder import l2_normalise
    from infercache.semantic.matcher import AdaptedEmbedder

    if isinstance(embedder, AdaptedEmbedder):
        return l2_normalise(fill_vectors(embedder.base, texts, out) @ embedder.adapter.T)
    slug = hashlib.sha256(embedder.name.encode()).hexdigest()[:12]
    return embed_cached(embedder, texts, out / f"vectors-{slug}.npz")


def fill(cache: Cache, texts: Sequence[str], vectors: Matrix, size: int, seed: int) -> float:
    """Store `size` entries (real texts first, then noisy copies); returns seconds taken."""
    assert cache.semantic is not None
    rng = np.random.default_rng(seed)
    started = time.perf_counter()
    for i in range(size):
        if i < len(texts):
            text, vector = texts[i], vectors[i]
        else:
            source = int(rng.integers(0, len(texts)))
            noisy = vectors[source] + rng.normal(0.0, 0.0247, vectors.shape[1]).astype(np.float32)
            text, vector = f"{texts[source]} {suffix(i)}", noisy / np.linalg.norm(noisy)
        request = parse_request(ask(text))
        lookup = cache.exact.lookup(request, read_entry=False)
        stored = cache.exact.store(lookup, request, answer(text), upstream_s=0.5)
        assert stored is not None
        query = query_of(request, stored.view, cache.exact.ignorable_fields)
        assert query is not None
        cache.semantic.store(request, stored.view, stored.key, Probe(query, vector))
    return time.perf_counter() - started


def percentiles_ms(samples_s: Sequence[float]) -> tuple[float, float]:
    p50, p99 = np.percentile(np.asarray(samples_s) * 1000.0, [50, 99])
    return float(p50), float(p99)


def measure(
    cache: Cache, embedder: Embedder, queries: Sequence[str], rounds: int
) -> dict[str, Any]:
    """Interleaved rounds of (embedding alone, full layer lookup) per query; the figures of
    the quietest round (lowest lookup p50) and all rounds pooled."""
    assert cache.semantic is not None
    requests = [parse_request(ask(q)) for q in queries]
    views = [cache.exact.lookup(r, read_entry=False).view for r in requests]
    for request, view in zip(requests[:10], views[:10], strict=True):  # warm-up
        assert view is not None
        cache.semantic.lookup(request, view)
    runs = []
    hits = 0
    for _ in range(rounds):
        embed_s, lookup_s = [], []
        for text, request, view in zip(queries, requests, views, strict=True):
            assert view is not None
            t0 = time.perf_counter()
            embedder.embed([text])
            t1 = time.perf_counter()
            hit, _ = cache.semantic.lookup(request, view)
            lookup_s.append(time.perf_counter() - t1)
            embed_s.append(t1 - t0)
            hits += hit is not None
        runs.append((lookup_s, embed_s))
    lookup_s, embed_s = min(runs, key=lambda run: float(np.median(run[0])))
    p50, p99 = percentiles_ms(lookup_s)
    e50, e99 = percentiles_ms(embed_s)
    a50, a99 = percentiles_ms([t for run in runs for t in run[0]])
    return {
        "lookup_p50_ms": p50,
        "lookup_p99_ms": p99,
        "embed_p50_ms": e50,
        "embed_p99_ms": e99,
        "overhead_p50_ms": p50 - e50,
        "all_rounds_lookup_p50_ms": a50,
        "all_rounds_lookup_p99_ms": a99,
        "hit_share": hits / (rounds * len(queries)),
    }


def build_parts(
    matcher_dir: Path | None, threads: int, threshold: float
) -> tuple[Embedder, SemanticConfig]:
    """The embedder and layer config: plain MiniLM at `threshold`, or the fitted matcher in
    `matcher_dir` at its calibrated threshold."""
    base = MiniLMEmbedder(threads=threads)
    if matcher_dir is None:
        return base, SemanticConfig(threshold=threshold)
    from infercache.semantic.matcher import load_fitted

    parts = load_fitted(matcher_dir, base)
    fitted_threshold = float(parts.meta["fit"]["calibration"]["threshold"])
    return parts.embedder, SemanticConfig(threshold=fitted_threshold, matcher=parts.matcher)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--out", type=Path, default=HERE / "out" / "semantic_lookup")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--threshold", type=float, default=0.9316)
    parser.add_argument("--matcher", type=Path, default=None, help="a fitted matcher dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    embedder, config = build_parts(args.matcher, args.threads, args.threshold)
    texts = [t for t, _ in read_banking77(args.data / "banking77_train.csv")]
    texts += [t for t, _ in read_hwu64(args.data / "hwu64_intents.tsv")]
    texts = list(dict.fromkeys(texts))
    random.Random(args.seed).shuffle(texts)
    queries, base = texts[: args.queries], texts[args.queries :]
    vectors = fill_vectors(embedder, base, args.out)
    results: dict[str, Any] = {
        "embedder": embedder.name,
        "matcher": config.matcher.name,
        "threshold": config.threshold,
        "threads": args.threads,
    }
    print(f"embedder {embedder.name}, matcher {config.matcher.name}, threshold "
          f"{config.threshold}, torch threads {args.threads}")  # fmt: skip
    for size in (int(s) for s in args.sizes.split(",")):
        settings = Settings(
            data_dir=args.out, store_url="memory://", max_store_bytes=1 << 34, default_ttl_s=1e5
        )
        cache = Cache(settings, clock=SystemClock())
        cache.enable_semantic(embedder, config=config, guards=default_guards())
        fill_s = fill(cache, base, vectors, size, args.seed)
        load_before = os.getloadavg()
        row = measure(cache, embedder, queries, args.rounds)
        row.update(fill_s=fill_s, load_before=load_before, load_after=os.getloadavg())
        results[str(size)] = row
        print(
            f"{size:>7} entries (filled in {fill_s:.0f} s): lookup p50 "
            f"{row['lookup_p50_ms']:.2f} ms p99 {row['lookup_p99_ms']:.2f} ms [all rounds "
            f"{row['all_rounds_lookup_p50_ms']:.2f} / {row['all_rounds_lookup_p99_ms']:.2f}]; "
            f"embedding alone p50 "
            f"{row['embed_p50_ms']:.2f} ms; layer overhead p50 {row['overhead_p50_ms']:.2f} ms;"
            f" hits {row['hit_share']:.1%}; load {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}"
        )
        cache.close()
    args.out.mkdir(parents=True, exist_ok=True)
    name = "results-fitted.json" if args.matcher is not None else "results-plain.json"
    (args.out / name).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
