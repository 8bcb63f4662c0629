"""What sharing state across replicas costs: one Redis vs a 3-master Redis Cluster.

    .venv/bin/python bench/stores_scaleout.py [--samples 3000]

On real servers started here (loopback), through the store API:
- `lookup`: `get_with_meta(key, [model, 2 tags])` on a present entry (the exact layer's read);
  the floor beside it is a bare GET of the same key through the same client library;
- `invalidate`: `incr_meta(tag)` — one INCR on one server; on the cluster, the allocation,
  the fan-out to 63 bucket copies, the check and the commit (bucket_meta.py);
- `feed`: `publish` → a reader blocked in `read_after` on another client has it (µs);
- `flight`: a leader's `close(answer)` → a waiter on another client has the answer (µs).
p50 and p99 in µs; stdout and bench/out/stores/scaleout.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from infercache.clock import SystemClock
from infercache.stores import Entry, open_store
from infercache.stores.feed import FeedEvent, FeedKind, open_feed
from infercache.stores.redis_connect import async_client, sync_client
from infercache.stores.replica_flight import FlightLease, ReplicaFlights, SharedAnswer

sys.path.insert(0, str(Path(__file__).parent))
from stores_servers import redis_servers

COMPLETION = {"id": "x", "object": "chat.completion", "choices": [{"index": 0}]}


def percentiles(samples_s: list[float]) -> dict[str, float]:
    us = sorted(s * 1e6 for s in samples_s)
    return {"p50_us": statistics.median(us), "p99_us": us[int(len(us) * 0.99) - 1]}


def each(n: int, fn: Callable[[int], object]) -> dict[str, float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - started)
    return percentiles(out)


def store_figures(url: str, samples: int) -> dict[str, dict[str, float]]:
    clock = SystemClock()
    store = open_store(f"{url}?prefix=s:", clock=clock, max_bytes=1)
    now = clock.now_s()
    entry = Entry(b"x" * 1200, "m", "0:", (("a", 0), ("b", 0)), now, now + 3600, 0.5, 40, 30)
    keys = [f"ic1:{i:064x}" for i in range(samples)]
    for k in keys:
        store.put(k, entry)
    names = ["model:m", "tag:a", "tag:b"]
    client = sync_client(url, socket_timeout_s=5)
    raw_keys = [store._entry_key(k) for k in keys]  # type: ignore[attr-defined]
    figures = {
        "floor: bare GET": each(samples, lambda i: client.get(raw_keys[i])),
        "lookup": each(samples, lambda i: store.get_with_meta(keys[i], names)),
        "invalidate": each(max(samples // 20, 50), lambda i: store.incr_meta("tag:a")),
    }
    client.close()
    store.close()
    return figures


def feed_latency(url: str, samples: int) -> dict[str, float]:
    writer, reader = open_feed(f"{url}?prefix=f:"), open_feed(f"{url}?prefix=f:")
    out: list[float] = []
    for _ in range(samples):
        got: list[float] = []

        def read(position: str, got: list[float] = got) -> None:
            reader.read_after(position, block_ms=5000)
            got.append(time.perf_counter())

        t = threading.Thread(target=read, args=(reader.tail(),))
        t.start()
        time.sleep(0.005)  # let the reader park in XREAD (a bench, not a test)
        sent = time.perf_counter()
        writer.publish(FeedEvent(FeedKind.ADD, "sem:k"))
        t.join(10)
        out.append(got[0] - sent)
    writer.close()
    reader.close()
    return percentiles(out)


async def flight_latency(url: str, samples: int) -> dict[str, float]:
    clients = [async_client(url, socket_timeout_s=None) for _ in range(2)]
    a, b = (ReplicaFlights(c, clock=SystemClock(), prefix="fl:") for c in clients)
    out: list[float] = []
    for i in range(samples):
        lease = await a.join(f"k{i}", timeout_s=10)
        assert isinstance(lease, FlightLease)
        waiter = asyncio.create_task(b.join(f"k{i}", timeout_s=10))
        await asyncio.sleep(0.002)  # let the waiter park in XREAD (a bench, not a test)
        sent = time.perf_counter()
        await lease.close(SharedAnswer.of_completion(COMPLETION))
        answer = await waiter
        out.append(time.perf_counter() - sent)
        assert isinstance(answer, SharedAnswer)
        assert answer.ok
    for c in clients:
        await c.aclose()
    return percentiles(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3000)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}")
    results: dict[str, dict[str, dict[str, float]]] = {}
    with redis_servers() as (single, cluster):
        for name, url in (("redis", single), ("redis-cluster", cluster)):
            figures = store_figures(url, args.samples)
            figures["feed publish→reader"] = feed_latency(url, 200)
            figures["flight answer→waiter"] = asyncio.run(flight_latency(url, 200))
            results[name] = figures
    rows = list(results["redis"])
    print(f"{'µs':<24}{'redis p50':>11}{'p99':>9}{'cluster p50':>13}{'p99':>9}")
    for row in rows:
        r, c = results["redis"][row], results["redis-cluster"][row]
        print(
            f"{row:<24}{r['p50_us']:>11.0f}{r['p99_us']:>9.0f}"
            f"{c['p50_us']:>13.0f}{c['p99_us']:>9.0f}"
        )
    out = Path(__file__).parent / "out" / "stores"
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaleout.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
