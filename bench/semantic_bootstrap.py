"""Semantic entries shared across replicas (issue 13, build 2), through the real layer: how long
a new replica takes to bootstrap its index from Redis, and how soon an entry stored through one
replica is a candidate on another.

    .venv/bin/python bench/semantic_bootstrap.py [--records 100000] [--scopes 50] [--samples 300]
        [--one-scope]

Servers: one redis-server and a 3-master Redis Cluster on loopback (bench/stores_servers.py).
Records are the layer's own (`semantic/records.py`, 384-dim float32 vectors), written through
`Store.put`, spread over `--scopes` exact scopes (tenants × system prompts). Per backend:
- `start`: `Cache.enable_semantic` on a fresh process-side cache — what a new replica waits
  for: `Store.scan("sem:")`, `decode_record`, then each scope's index built (`GrowingIndex`:
  flat below 20k vectors a scope, usearch HNSW above);
- `gap rebuild`: `SemanticLayer.rebuild(replace=True)`, what a replica does after losing
  part of the feed (a complete new index, swapped in); beside it, in the same run, the store's
  share: `scan("sem:")` + `decode_record` alone (bench/stores_bootstrap.py's "bootstrap");
- `feed`: replica A writes one more record and publishes `ADD` (what `SemanticLayer.store`
  does after the upstream answered, minus the embedding); replica B's `ReplicaSync` thread
  reads it, reads the record from the store and indexes it. Timed from the publish to
  `ReplicaSync.caught_up` returning on B, `--samples` times, B holding every record.
`--one-scope`: also the worst case, every record in one scope (one 100k HNSW build).
Figures go to stdout and bench/out/semantic_bootstrap/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from infercache.cache import Cache
from infercache.clock import SystemClock
from infercache.semantic.embedder import Matrix
from infercache.semantic.layer import SemanticConfig, SemanticLayer
from infercache.semantic.records import (
    RECORD_PREFIX,
    SemanticRecord,
    decode_record,
    encode_record,
    record_key,
)
from infercache.semantic.replica_sync import ReplicaSync, attach, tail_before_rebuild
from infercache.settings import Settings
from infercache.stores import Entry
from infercache.stores.feed import FeedKind

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from stores_servers import redis_servers  # noqa: E402

DIM = 384


class NoEmbedder:
    """The records' embedder by name; a bootstrap embeds nothing."""

    name = "bench-embedder"
    dim = DIM

    def embed(self, texts: Sequence[str]) -> Matrix:
        raise AssertionError("a bootstrap embeds nothing")


def record(i: int, scopes: int, rng: np.random.Generator) -> tuple[str, Entry]:
    now = time.time()
    answer = Entry(b"{}", "bench-model", "0:", (), now, now + 86_400, 0.5, 40, 30)
    vector = rng.standard_normal(DIM).astype(np.float32)
    vector /= np.linalg.norm(vector)
    key = f"ic1:{i:064x}"
    text = f"how do I reset the password of account number {i} on the web portal?"
    rec = SemanticRecord(f"scope-{i % scopes}", text, key, NoEmbedder.name, vector)
    return record_key(key), encode_record(rec, answer)


def replica(url: str, tmp: Path, name: str) -> tuple[Cache, SemanticLayer, ReplicaSync, float]:
    """A replica started as gateway/semantic_setup.py starts one; (cache, layer, its sync,
    seconds to start)."""
    started = time.perf_counter()
    position = tail_before_rebuild(url)
    cache = Cache(Settings(data_dir=tmp / name, store_url=url), clock=SystemClock())
    layer = cache.enable_semantic(NoEmbedder(), config=SemanticConfig(threshold=0.9), guards=[])
    elapsed = time.perf_counter() - started
    return cache, layer, attach(layer, url, position), elapsed


def run(url: str, tmp: Path, records: int, scopes: int, samples: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    writer = Cache(Settings(data_dir=tmp / "writer", store_url=url), clock=SystemClock())
    started = time.perf_counter()
    for i in range(records):
        writer.backend.put(*record(i, scopes, rng))
    write_s = time.perf_counter() - started
    a_cache, a, _, _ = replica(url, tmp, "a")
    b_cache, b, sync, start_s = replica(url, tmp, "b")
    assert len(b.indexes) == records, len(b.indexes)
    started = time.perf_counter()
    assert b.rebuild(replace=True) == records
    gap_s = time.perf_counter() - started
    started = time.perf_counter()  # the store's share, in the same run: scan and decode
    assert sum(1 for _, e in b.backend.scan(RECORD_PREFIX) if len(decode_record(e).vector)) == (
        records
    )
    scan_s = time.perf_counter() - started
    latencies_ms = []
    for i in range(records, records + samples):
        name, entry = record(i, scopes, rng)
        a.backend.put(name, entry)
        started = time.perf_counter()
        a._publish(FeedKind.ADD, name.removeprefix("sem:"))
        assert a.published is not None
        assert sync.caught_up(a.published, timeout_s=10.0)
        latencies_ms.append((time.perf_counter() - started) * 1000)
    assert len(b.indexes) == records + samples
    for cache, layer in ((a_cache, a), (b_cache, b), (writer, None)):
        if layer is not None:
            layer.close()
        cache.close()
    lat = np.array(latencies_ms)
    return {
        "records": records,
        "scopes": scopes,
        "write_s": write_s,
        "start_s": start_s,
        "gap_rebuild_s": gap_s,
        "scan_decode_s": scan_s,
        "feed_p50_ms": float(np.percentile(lat, 50)),
        "feed_p99_ms": float(np.percentile(lat, 99)),
        "feed_max_ms": float(lat.max()),
        "load": os.getloadavg(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--scopes", type=int, default=50)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--one-scope", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "semantic_bootstrap")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()}; {args.records:,} records of dim {DIM}")
    results: list[dict[str, Any]] = []
    layouts = [args.scopes, 1] if args.one_scope else [args.scopes]
    with tempfile.TemporaryDirectory() as tmp, redis_servers() as (single, cluster):
        n = 0
        for backend, base in (("redis", single), ("redis-cluster", cluster)):
            for scopes in layouts:
                if backend == "redis-cluster" and scopes == 1:
                    continue  # the index build dominates: the backend changes nothing
                n += 1
                url = f"{base}?prefix=b{n}:"
                figures = {"backend": backend, **run(url, Path(tmp), args.records, scopes,
                                                     args.samples)}  # fmt: skip
                results.append(figures)
                print(
                    f"{backend:>14} {scopes:>3} scopes: write {figures['write_s']:5.1f} s  "
                    f"start {figures['start_s']:5.2f} s  gap rebuild "
                    f"{figures['gap_rebuild_s']:5.2f} s (scan + decode alone "
                    f"{figures['scan_decode_s']:5.2f} s)  feed p50 {figures['feed_p50_ms']:.2f} "
                    f"p99 {figures['feed_p99_ms']:.2f} max {figures['feed_max_ms']:.2f} ms  "
                    f"(load {figures['load'][0]:.1f})"
                )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
