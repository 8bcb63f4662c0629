"""Gateway throughput and latency on loopback: exact hits, and what a miss adds.

    .venv/bin/python bench/gateway.py [--requests 20000] [--concurrency 32] [--store URL]

Three processes share the machine: a trivial OpenAI-compatible upstream that answers at once
(so a miss measures the gateway, not a model), the gateway (`infercache serve --upstream ...`,
exactly as a user runs it), and this load generator (async httpx, keep-alive connections).

- exact hits: the same few requests, already cached, from `--concurrency` connections;
  throughput over the whole run, latency p50/p99 per request.
- miss overhead: sequential requests with unique prompts, each a real miss (lookup, upstream
  call, store), against the gateway and then directly against the upstream; the added
  latency is the difference of the medians.
Client and servers share the same 2 cores, so hit throughput is a floor, not a ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ANSWER = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1_700_000_000,
    "model": "bench-model",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Paris is the capital of France."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 30, "completion_tokens": 8, "total_tokens": 38},
}


def serve_upstream(port: int) -> None:
    """The stand-in upstream: answers every chat request at once."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def chat(request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse(ANSWER)

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "bench-model"}]})

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models),
        ]
    )
    print("upstream ready", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(url: str, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise SystemExit(f"{url} did not come up")


def body(i: int) -> dict[str, Any]:
    return {
        "model": "bench-model",
        "messages": [
            {"role": "system", "content": "You are a helpful support assistant."},
            {"role": "user", "content": f"Question {i}: what is the capital of France?"},
        ],
        "temperature": 0,
    }


def pct(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] * 1000  # ms


async def hits(url: str, requests: int, concurrency: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    bodies = [body(i) for i in range(8)]
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:
        for b in bodies:  # warm: store the entries
            await client.post("/chat/completions", json=b)
        remaining = requests

        async def worker(w: int) -> None:
            nonlocal remaining
            i = w
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                r = await client.post("/chat/completions", json=bodies[i % len(bodies)])
                latencies.append(time.perf_counter() - t0)
                assert r.headers["x-infercache"] == "exact-hit", r.headers
                i += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        wall = time.perf_counter() - started
    return requests / wall, latencies


async def sequential(url: str, n: int, offset: int, expect: str | None) -> list[float]:
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        for i in range(n):
            t0 = time.perf_counter()
            r = await client.post("/chat/completions", json=body(offset + i))
            latencies.append(time.perf_counter() - t0)
            if expect is not None:
                assert r.headers["x-infercache"] == expect, r.headers
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--misses", type=int, default=2000)
    parser.add_argument("--store", help="store URL (default: SQLite in a temp dir)")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return 0
    exe = Path(sys.executable).parent / "infercache"
    up_port, gw_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or f"sqlite:///{tmp}/bench.db"
        env = {**os.environ, "INFERCACHE_DATA_DIR": tmp}
        upstream = subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(up_port)])
        gateway = subprocess.Popen(
            [str(exe), "serve", "--port", str(gw_port), "--store", store,
             "--upstream", f"http://127.0.0.1:{up_port}/v1"],
            env=env,
        )  # fmt: skip
        try:
            wait_for(f"http://127.0.0.1:{up_port}/v1/models")
            wait_for(f"http://127.0.0.1:{gw_port}/healthz")
            gw, up = f"http://127.0.0.1:{gw_port}/v1", f"http://127.0.0.1:{up_port}/v1"
            rate, lat = asyncio.run(hits(gw, args.requests, args.concurrency))
            print(f"store: {store.split('?')[0]}; client, gateway and upstream on one machine")
            print(f"exact hits: {rate:,.0f}/s with {args.concurrency} connections; "
                  f"p50 {pct(lat, 50):.2f} ms, p99 {pct(lat, 99):.2f} ms")  # fmt: skip
            single = asyncio.run(sequential(gw, 2000, 0, None))  # the 8 warm bodies hit
            print(f"exact hit, one connection: p50 {pct(single, 50):.2f} ms, "
                  f"p99 {pct(single, 99):.2f} ms")  # fmt: skip
            direct = asyncio.run(sequential(up, args.misses, 10_000, None))
            via = asyncio.run(sequential(gw, args.misses, 20_000, "miss"))
            added = statistics.median(via) - statistics.median(direct)
            print(f"miss: upstream direct p50 {pct(direct, 50):.2f} ms; via gateway p50 "
                  f"{pct(via, 50):.2f} ms, p99 {pct(via, 99):.2f} ms; "
                  f"added p50 {added * 1000:.2f} ms")  # fmt: skip
        finally:
            gateway.terminate()
            upstream.terminate()
            gateway.wait(30)
            upstream.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
