"""Exact-layer latency: hit and miss+store, p50/p99, memory and SQLite, at 10k and 1M entries.

    .venv/bin/python bench/exact.py [--sizes 10000 1000000] [--samples 20000]

Every figure is measured in this process, beside the floors it is built from (canonical JSON +
sha256 of a request with the standard library and with orjson, which the keys use; a dict
probe; a raw sqlite3 primary-key lookup in a table of the same size), so the ratios mean
something on whatever machine runs it.

- `lookup`: `ExactCache.lookup(parsed request)`: key derivation, the version/tag meta read,
  the entry read and the freshness checks. What a hit costs before the body is used.
- `complete`: `Cache.complete(body dict)` on a hit: parsing and validating the body, the lookup,
  the metrics, and decoding the stored response into a dict.
- `miss+store`: `Cache.complete` on a new request: lookup, (a no-op upstream), store.
Entries are pre-loaded in bulk (not measured); lookups pick uniformly random keys.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infercache.cache import Cache
from infercache.clock import SystemClock
from infercache.keys import canonical_json, exact_key
from infercache.request import parse_request
from infercache.settings import Settings
from infercache.stores.base import Entry
from infercache.stores.memory import MemoryStore
from infercache.stores.sqlite import SQLiteStore

RESPONSE = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "bench-model",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Paris is the capital of France. " * 4},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 40, "completion_tokens": 30, "total_tokens": 70},
}


def body(i: int) -> dict[str, Any]:
    return {
        "model": "bench-model",
        "messages": [
            {"role": "system", "content": "You are a helpful support assistant for ACME."},
            {"role": "user", "content": f"Question number {i}: how do I reset my password?"},
        ],
        "temperature": 0,
        "max_tokens": 128,
    }


def percentiles(samples_ns: list[int]) -> tuple[float, float]:
    qs = statistics.quantiles(samples_ns, n=100, method="inclusive")
    return qs[49] / 1000, qs[98] / 1000  # µs


def measure(fn: Callable[[int], object], indices: list[int]) -> tuple[float, float]:
    samples: list[int] = []
    clock = time.perf_counter_ns
    for i in indices:
        t0 = clock()
        fn(i)
        samples.append(clock() - t0)
    return percentiles(samples)


def preload(cache: Cache, n: int) -> None:
    """Insert n entries in bulk, exactly as `Cache.complete` would have stored them."""
    now = time.time()
    blob = json.dumps(RESPONSE, separators=(",", ":")).encode()
    entry = Entry(blob, "bench-model", "0:", (), now, now + 86400, 0.8, 40, 30)
    backend = cache.backend
    keys = (exact_key(parse_request(body(i))) for i in range(n))
    if isinstance(backend, SQLiteStore):
        rows = ((k, blob, entry.size_bytes, now) for k in keys)
        with backend._write() as conn:
            conn.executemany(
                "INSERT INTO entries VALUES (?, ?, 'bench-model', '0:', '[]', "
                f"{now}, {now + 86400}, 0.8, 40, 30, ?, ?)",
                rows,
            )
    else:
        assert isinstance(backend, MemoryStore)
        for k in keys:
            backend.put(k, entry)


def floors(n: int, indices: list[int], db_dir: Path) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    req = body(7)
    stdlib = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    out["stdlib canonical JSON + sha256"] = measure(
        lambda i: hashlib.sha256(stdlib.encode(req).encode()).hexdigest(), indices
    )
    out["orjson canonical JSON + sha256"] = measure(
        lambda i: hashlib.sha256(canonical_json(req)).hexdigest(), indices
    )
    table = {hashlib.sha256(str(i).encode()).hexdigest(): i for i in range(n)}
    probe_keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)]
    out["dict probe"] = measure(lambda i: table.get(probe_keys[i]), indices)
    table.clear()
    conn = sqlite3.connect(db_dir / f"floor-{n}.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (key TEXT PRIMARY KEY, value BLOB)")
    blob = json.dumps(RESPONSE).encode()
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO t VALUES (?, ?)", ((k, blob) for k in probe_keys))
    conn.execute("COMMIT")
    out["raw sqlite3 PK lookup"] = measure(
        lambda i: conn.execute("SELECT value FROM t WHERE key = ?", (probe_keys[i],)).fetchone(),
        indices,
    )
    conn.close()
    return out


def run_store(kind: str, n: int, samples: int, workdir: Path) -> dict[str, tuple[float, float]]:
    url = "memory://" if kind == "memory" else f"sqlite:///{workdir / f'exact-{n}.db'}"
    settings = Settings(data_dir=workdir, store_url=url, max_store_bytes=8 << 30)
    cache = Cache(settings, clock=SystemClock())
    preload(cache, n)
    rng = random.Random(1)
    indices = [rng.randrange(n) for _ in range(samples)]
    parsed = {i: parse_request(body(i)) for i in set(indices)}
    bodies = {i: body(i) for i in set(indices)}

    def upstream(_: dict[str, Any]) -> dict[str, Any]:
        return RESPONSE

    assert cache.exact.lookup(parsed[indices[0]]).hit, "preloaded entry should hit"
    out = {
        "lookup (hit)": measure(lambda i: cache.exact.lookup(parsed[i]), indices),
        "complete (hit)": measure(lambda i: cache.complete(bodies[i], upstream), indices),
    }
    fresh = list(range(n, n + min(samples, 5000)))
    out["complete (miss+store)"] = measure(lambda i: cache.complete(body(i), upstream), fresh)
    assert cache.stats()["strategies"]["exact"]["hits"] == samples
    cache.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--samples", type=int, default=20_000)
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d')}")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for n in args.sizes:
            rng = random.Random(2)
            indices = [rng.randrange(n) for _ in range(args.samples)]
            print(f"\n== {n:,} entries ==   (µs)      p50      p99")
            for name, (p50, p99) in floors(n, indices, workdir).items():
                print(f"  floor  {name:<28} {p50:8.1f} {p99:8.1f}")
            for kind in ("memory", "sqlite"):
                results = run_store(kind, n, args.samples, workdir)
                for name, (p50, p99) in results.items():
                    print(f"  {kind:<6} {name:<28} {p50:8.1f} {p99:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
