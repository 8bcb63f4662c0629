"""A new replica's bootstrap: load every semantic record from the store, as the semantic layer
does at start (`Store.scan(RECORD_PREFIX)`, then decode each record's vector).

    .venv/bin/python bench/stores_bootstrap.py [--records 100000] [--dim 384]

Records are the layer's own (`semantic/records.py`: JSON with a base64 float32 vector, stored
as an `Entry`), written through `Store.put` into SQLite (the same-process baseline), one real
redis-server and a real 3-master Redis Cluster (both started here, on loopback). Per backend:
- `write`: the puts, one by one (what N replicas' misses do over time);
- `scan`: iterating `scan("sem:")` to the end (keys, values, `Entry.decode`);
- `bootstrap`: scan + `decode_record` (JSON, base64, vector): what a replica waits for;
- for Redis, the floor: raw SCAN + MGET of the same keys, bytes only (no decoding).
Figures go to stdout and bench/out/stores/bootstrap.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from infercache.clock import SystemClock
from infercache.semantic.records import (
    RECORD_PREFIX,
    SemanticRecord,
    decode_record,
    encode_record,
    record_key,
)
from infercache.stores import Backend, Entry, open_store
from infercache.stores.redis_connect import sync_client

sys.path.insert(0, str(Path(__file__).parent))
from stores_servers import redis_servers


def records(n: int, dim: int) -> list[tuple[str, Entry]]:
    rng = np.random.default_rng(0)
    now = time.time()
    answer = Entry(b"{}", "bench-model", "1:v1", (("kb", 1),), now, now + 86_400, 0.5, 40, 30)
    out = []
    for i in range(n):
        vector = rng.standard_normal(dim).astype(np.float32)
        vector /= np.linalg.norm(vector)
        key = f"ic1:{i:064x}"
        text = f"how do I reset the password of account number {i} on the web portal?"
        record = SemanticRecord(f"scope-{i % 50}", text, key, "bench-embedder", vector)
        out.append((record_key(key), encode_record(record, answer)))
    return out


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    started = time.perf_counter()
    n = fn()
    return time.perf_counter() - started, n


def measure(name: str, store: Backend, data: list[tuple[str, Entry]]) -> dict[str, float]:
    write_s, _ = timed(lambda: sum(1 for key, e in data if store.put(key, e) is None))
    scan_s, scanned = timed(lambda: sum(1 for _ in store.scan(RECORD_PREFIX)))
    assert scanned == len(data), (name, scanned)

    def bootstrap() -> int:
        n = 0
        for _, entry in store.scan(RECORD_PREFIX):
            record = decode_record(entry)
            n += record.vector.shape[0] > 0
        return n

    boot_s, booted = timed(bootstrap)
    assert booted == len(data)
    figures = {"write_s": write_s, "scan_s": scan_s, "bootstrap_s": boot_s}
    print(
        f"{name:>14}: write {write_s:6.1f} s ({len(data) / write_s:8,.0f}/s)  "
        f"scan {scan_s:5.2f} s  bootstrap {boot_s:5.2f} s ({len(data) / boot_s:8,.0f} records/s)"
    )
    return figures


def raw_floor(url: str, prefix: str) -> float:
    """SCAN + MGET of every record key, bytes only: the client/server floor of a bootstrap."""
    client = sync_client(url, socket_timeout_s=30)
    started = time.perf_counter()
    pattern = f"{prefix}*e:sem:*" if "cluster" in url else f"{prefix}e:sem:*"
    keys = list(client.scan_iter(match=pattern, count=1000))
    got = 0
    for i in range(0, len(keys), 1000):
        batch = keys[i : i + 1000]
        values = client.mget_nonatomic(batch) if "cluster" in url else client.mget(batch)  # type: ignore[union-attr]
        got += sum(v is not None for v in values)
    elapsed = time.perf_counter() - started
    client.close()
    return elapsed if got == len(keys) else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}; {args.records:,} records of dim {args.dim}")
    data = records(args.records, args.dim)
    size = sum(len(e.encode()) for _, e in data) / len(data)
    print(f"record size: {size:,.0f} bytes encoded")
    clock = SystemClock()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, redis_servers() as (single, cluster):
        backends = {
            "sqlite": f"sqlite:///{Path(tmp) / 'b.db'}",
            "redis": f"{single}?prefix=b:",
            "redis-cluster": f"{cluster}?prefix=b:",
        }
        for name, url in backends.items():
            store = open_store(url, clock=clock, max_bytes=1 << 40)
            results[name] = measure(name, store, data)
            store.close()
        for name, url in (("redis", single), ("redis-cluster", cluster)):
            floor_s = raw_floor(url, "b:")
            results[name]["raw_scan_mget_s"] = floor_s
            print(f"{name:>14}: floor, raw SCAN+MGET {floor_s:5.2f} s")
    out = Path(__file__).parent / "out" / "stores"
    out.mkdir(parents=True, exist_ok=True)
    (out / "bootstrap.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
