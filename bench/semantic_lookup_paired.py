"""Semantic lookup at 100k entries, this tree's MiniLM embedder against a baseline tree's, paired
in one process (issue 23, acceptance 6: lookup p50 including the embedding <= 15 ms).

    git archive main src | tar -x -C /tmp/semspeed-main       # the baseline: today's main
    .venv/bin/python bench/semantic_lookup_paired.py --baseline /tmp/semspeed-main/src
        [--size 100000] [--queries 300] [--rounds 3] [--threads 1]

One cache of `--size` entries is filled as bench/semantic_lookup.py fills it (banking77 + hwu64
questions, topped up by noisy copies; vectors precomputed). Its layer then looks up held-out
questions with either embedder: the layer reads `self.embedder` on every lookup, and both
embedders carry the same name and give the same vectors (tests/semantic/test_bert_encoder.py),
so the index, scope and accept rule are the same objects for both and only the embedding
differs. Per query, in alternating order, it times: the whole `SemanticLayer.lookup`
(scope, embedding, index search, accept rule, the candidate's entry) with this tree's embedder
and with the baseline's; each embedder alone on the same text; and the index search alone
(`ScopedIndexes.search`, k as the layer asks, on the query's precomputed vector). Printed per
figure: the CPU time p50 (process CPU time of the call, every round pooled: less inflated by
the load than wall time), p50 and p99 of the quietest round (lowest p50 of this tree's
lookup) and of all rounds pooled, the median of the per-query paired differences (baseline −
this tree), and the load.
Results also go to OUT/paired.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from infercache.cache import Cache
from infercache.clock import SystemClock
from infercache.request import parse_request
from infercache.semantic.embedder import Embedder, MiniLMEmbedder
from infercache.semantic.guards import default_guards
from infercache.semantic.layer import SemanticConfig
from infercache.semantic.scope import query_of
from infercache.settings import Settings

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from semantic_lookup import ask, fill, fill_vectors  # noqa: E402
from semantic_public_pairs import read_banking77, read_hwu64  # noqa: E402

FIGURES = ("lookup", "lookup_baseline", "embed", "embed_baseline", "search")
CPU = tuple(f"{name}_cpu" for name in FIGURES)


def baseline_embedder(src: Path, threads: int) -> Embedder:
    """MiniLMEmbedder as the tree at `src` defines it, loaded beside this tree's under its own
    module name (its imports of other infercache modules resolve to this tree's)."""
    path = src / "infercache" / "semantic" / "embedder.py"
    spec = importlib.util.spec_from_file_location("baseline_embedder", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    embedder: Embedder = module.MiniLMEmbedder(threads=threads)
    return embedder


def timed(fn: Callable[[], object], cpu: list[float]) -> float:
    """Wall seconds of `fn()`; its CPU seconds (every thread of this process: the embedder's
    included, nothing else runs here) appended to `cpu`."""
    started, started_cpu = time.perf_counter(), time.process_time()
    fn()
    cpu.append(time.process_time() - started_cpu)
    return time.perf_counter() - started


def measure(
    cache: Cache, ours: Embedder, theirs: Embedder, queries: Sequence[str], rounds: int
) -> dict[str, Any]:
    layer = cache.semantic
    assert layer is not None
    requests = [parse_request(ask(q)) for q in queries]
    views = [cache.exact.lookup(r, read_entry=False).view for r in requests]
    scopes = []
    for request, view in zip(requests, views, strict=True):
        assert view is not None
        query = query_of(request, view, cache.exact.ignorable_fields)
        assert query is not None
        scopes.append(query.scope)
    vectors = ours.embed(list(queries))
    k = layer._k

    def lookup(embedder: Embedder, i: int, cpu: list[float]) -> float:
        layer.embedder = embedder
        view = views[i]
        assert view is not None
        return timed(lambda: layer.lookup(requests[i], view), cpu)

    for i in range(10):  # warm-up, both embedders
        lookup(ours, i, []), lookup(theirs, i, [])
    runs: list[dict[str, list[float]]] = []
    for r in range(rounds):
        run: dict[str, list[float]] = {name: [] for name in (*FIGURES, *CPU)}
        for i, text in enumerate(queries):
            pair = [("lookup", ours), ("lookup_baseline", theirs)]
            for name, embedder in pair if (i + r) % 2 == 0 else pair[::-1]:
                run[name].append(lookup(embedder, i, run[f"{name}_cpu"]))
            one = [text]
            run["embed"].append(timed(partial(ours.embed, one), run["embed_cpu"]))
            cpu_baseline = run["embed_baseline_cpu"]
            run["embed_baseline"].append(timed(partial(theirs.embed, one), cpu_baseline))
            search = partial(layer.indexes.search, scopes[i], vectors[i], k)
            run["search"].append(timed(search, run["search_cpu"]))
        runs.append(run)
    layer.embedder = ours
    quiet = min(runs, key=lambda run: float(np.median(run["lookup"])))
    out: dict[str, Any] = {}
    for name in CPU:  # CPU time is what the load does not inflate: every round pooled
        out[name] = {"p50_ms": float(np.median([t for run in runs for t in run[name]]) * 1e3)}
    for name in FIGURES:
        pooled = [t for run in runs for t in run[name]]
        p50, p99 = np.percentile(np.asarray(quiet[name]) * 1e3, [50, 99])
        a50, a99 = np.percentile(np.asarray(pooled) * 1e3, [50, 99])
        out[name] = {"p50_ms": p50, "p99_ms": p99, "all_p50_ms": a50, "all_p99_ms": a99}
    for name in ("lookup", "embed"):
        ours_s = np.asarray([t for run in runs for t in run[name]])
        theirs_s = np.asarray([t for run in runs for t in run[f"{name}_baseline"]])
        out[name]["paired_saving_p50_ms"] = float(np.median(theirs_s - ours_s) * 1e3)
        out[name]["faster_share"] = float(np.mean(theirs_s > ours_s))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the baseline tree's src")
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--out", type=Path, default=HERE / "out" / "semantic_lookup")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--threshold", type=float, default=0.9316)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    ours = MiniLMEmbedder(threads=args.threads)
    theirs = baseline_embedder(args.baseline, args.threads)
    assert ours.name == theirs.name, (ours.name, theirs.name)
    texts = [t for t, _ in read_banking77(args.data / "banking77_train.csv")]
    texts += [t for t, _ in read_hwu64(args.data / "hwu64_intents.tsv")]
    texts = list(dict.fromkeys(texts))
    random.Random(args.seed).shuffle(texts)
    queries, base = texts[: args.queries], texts[args.queries :]
    vectors = fill_vectors(ours, base, args.out)
    settings = Settings(
        data_dir=args.out, store_url="memory://", max_store_bytes=1 << 34, default_ttl_s=1e5
    )
    cache = Cache(settings, clock=SystemClock())
    cache.enable_semantic(ours, config=SemanticConfig(threshold=args.threshold),
                          guards=default_guards())  # fmt: skip
    fill_s = fill(cache, base, vectors, args.size, args.seed)
    load_before = os.getloadavg()
    results = measure(cache, ours, theirs, queries, args.rounds)
    results.update(size=args.size, threads=args.threads, fill_s=fill_s,
                   load_before=load_before, load_after=os.getloadavg())  # fmt: skip
    cache.close()
    print(f"{args.size} entries (filled in {fill_s:.0f} s), torch threads {args.threads}, "
          f"load {load_before[0]:.2f} -> {os.getloadavg()[0]:.2f}")  # fmt: skip
    for name in FIGURES:
        row = results[name]
        extra = ""
        if "paired_saving_p50_ms" in row:
            extra = (f"; paired saving p50 {row['paired_saving_p50_ms']:.2f} ms, faster in "
                     f"{row['faster_share']:.0%}")  # fmt: skip
        print(f"  {name:>16}: p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:6.2f} ms  "
              f"[all rounds {row['all_p50_ms']:.2f} / {row['all_p99_ms']:.2f}]; CPU p50 "
              f"{results[name + '_cpu']['p50_ms']:.2f} ms{extra}")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "paired.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
