"""Gateway throughput and latency on loopback: exact hits, and what a miss adds.

    .venv/bin/python bench/gateway.py [--seconds 10] [--concurrency 32] [--store URL]
                                      [--without FEATURES] [--rounds 3] [--endpoints-only]

Three processes share the machine: a trivial OpenAI-compatible upstream that answers at once
(so a miss measures the gateway, not a model), the gateway (`infercache serve --upstream ...`,
exactly as a user runs it), and the load generator: `wrk` (Debian's package) when installed,
since a Python client costs more per request than the gateway does; async httpx otherwise.

- exact hits: one cached request, from 1 connection (latency p50/p99) and from
  `--concurrency` connections (throughput); every response is checked to be an `exact-hit`.
- miss overhead: from 1 connection, requests with unique prompts, each a real miss (lookup,
  upstream call, store), against the gateway and then directly against the upstream; the
  added latency is the difference of the medians.
- hits per endpoint (wrk only): the same question as chat, Anthropic's `/v1/messages`
  (translated to the upstream's chat on its miss) and OpenAI's `/v1/responses` (sent to the
  upstream natively), each stored once, then exact hits from 1 and `--concurrency`
  connections, the endpoints alternated over `--rounds` rounds (each going first in turn);
  each endpoint's median rate against chat's (issue 25: within 20%).
Client and servers share the same 2 cores, so throughput is a floor, not a ceiling.
`--without` runs the gateway with per-request features off (bench/without.py lists them), to
measure what they cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import httpx
import without

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


RESPONSE = {
    "id": "resp_bench", "object": "response", "created_at": 1_700_000_000, "status": "completed",
    "model": "bench-model", "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
    "output": [{"type": "message", "id": "msg_bench", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": "Paris is the capital of France.",
                             "annotations": []}]}],
    "usage": {"input_tokens": 30, "output_tokens": 8, "total_tokens": 38},
}  # fmt: skip
SYSTEM = "You are a helpful support assistant."
QUESTION = "Question 0: what is the capital of France?"
# The same question on each cached endpoint: (path, body)
ENDPOINT_BODIES = {
    "chat": ("/chat/completions", {"model": "bench-model", "temperature": 0, "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]}),
    "messages": ("/messages", {"model": "bench-model", "temperature": 0, "max_tokens": 64,
                               "system": SYSTEM,
                               "messages": [{"role": "user", "content": QUESTION}]}),
    "responses": ("/responses", {"model": "bench-model", "temperature": 0,
                                 "instructions": SYSTEM, "input": QUESTION}),
}  # fmt: skip


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

    async def responses(request: Request) -> JSONResponse:
        await request.body()
        return JSONResponse(RESPONSE)

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
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


HIT_LUA = """
wrk.method = "POST"
wrk.body = [[BODY]]
wrk.headers["Content-Type"] = "application/json"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) hits = 0; others = 0 end
function response(status, headers, body)
  if headers["x-infercache"] == "exact-hit" then hits = hits + 1 else others = others + 1 end
end
function done(summary, latency, requests)
  local h, o = 0, 0
  for _, t in ipairs(threads) do h = h + t:get("hits"); o = o + t:get("others") end
  io.write(string.format("layers %d %d\\n", h, o))
end
"""

MISS_LUA = """
local n = 0
request = function()
  n = n + 1
  local body = '{"model":"bench-model","temperature":0,"messages":[{"role":"user","content":'
    .. '"RUN question ' .. n .. ' of this run: what is the capital of France?"}]}'
  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)
end
"""


def wrk(url: str, script: str, connections: int, seconds: int) -> dict[str, float]:
    """Run wrk; return requests/s, p50 and p99 in ms, and the hit/other counts if printed."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    threads = min(2, connections)
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", f.name,
         url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    os.unlink(f.name)
    units = {"us": 1e-3, "ms": 1.0, "s": 1e3}

    def latency(label: str) -> float:
        match = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        assert match, out
        return float(match.group(1)) * units[match.group(2)]

    result = {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50_ms": latency("50%"),
        "p99_ms": latency("99%"),
    }
    layers = re.search(r"layers (\d+) (\d+)", out)
    if layers:
        result["hits"], result["others"] = float(layers.group(1)), float(layers.group(2))
    if "Non-2xx" in out:
        raise SystemExit(f"wrk saw errors:\n{out}")
    return result


def run_wrk(gw: str, up: str, concurrency: int, seconds: int) -> None:
    hit_script = HIT_LUA.replace("BODY", json.dumps(body(0)))
    httpx.post(f"{gw}/chat/completions", json=body(0), timeout=30)  # store it
    one = wrk(f"{gw}/chat/completions", hit_script, 1, seconds)
    many = wrk(f"{gw}/chat/completions", hit_script, concurrency, seconds)
    for r in (one, many):
        assert r["others"] == 0, f"not every response was an exact hit: {r}"
    print(f"exact hit, 1 connection: {one['rps']:,.0f}/s, p50 {one['p50_ms']:.3f} ms, "
          f"p99 {one['p99_ms']:.3f} ms")  # fmt: skip
    print(f"exact hits, {concurrency} connections: {many['rps']:,.0f}/s, "
          f"p50 {many['p50_ms']:.2f} ms, p99 {many['p99_ms']:.2f} ms")  # fmt: skip
    run = f"{time.time_ns()}"
    direct = wrk(f"{up}/chat/completions", MISS_LUA.replace("RUN", run + "d"), 1, seconds)
    via = wrk(f"{gw}/chat/completions", MISS_LUA.replace("RUN", run + "g"), 1, seconds)
    print(f"miss: upstream direct p50 {direct['p50_ms']:.3f} ms; via gateway p50 "
          f"{via['p50_ms']:.3f} ms (p99 {via['p99_ms']:.2f} ms); "
          f"added p50 {via['p50_ms'] - direct['p50_ms']:.3f} ms")  # fmt: skip


def endpoint_hits(gw: str, concurrency: int, seconds: int, rounds: int) -> None:
    """Exact hits on chat, messages and responses, alternated; each one's median against
    chat's."""
    rates: dict[tuple[str, int], list[float]] = {}
    for name, (path, payload) in ENDPOINT_BODIES.items():
        stored = httpx.post(f"{gw}{path}", json=payload, timeout=30)
        assert stored.status_code == 200, stored.text
        again = httpx.post(f"{gw}{path}", json=payload, timeout=30)
        assert again.headers["x-infercache"] == "exact-hit", (name, again.headers)
    names = list(ENDPOINT_BODIES)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # each goes first in turn
        for connections in (1, concurrency):
            for name in order:
                path, payload = ENDPOINT_BODIES[name]
                script = HIT_LUA.replace("BODY", json.dumps(payload))
                result = wrk(f"{gw}{path}", script, connections, seconds)
                assert result["others"] == 0, f"{name}: not every response was a hit: {result}"
                rates.setdefault((name, connections), []).append(result["rps"])
    for connections in (1, concurrency):
        chat = statistics.median(rates[("chat", connections)])
        for name in ENDPOINT_BODIES:
            rate = statistics.median(rates[(name, connections)])
            print(f"exact hits on {name}, {connections} connection(s): {rate:,.0f}/s "
                  f"(median of {rounds}; {rate / chat:.0%} of chat's)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=10, help="per wrk run")
    parser.add_argument("--requests", type=int, default=20_000, help="httpx mode only")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--misses", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="per-endpoint hits: rounds")
    parser.add_argument(
        "--endpoints-only", action="store_true", help="only the per-endpoint hits (wrk)"
    )
    parser.add_argument("--store", help="store URL (default: SQLite in a temp dir)")
    parser.add_argument(
        "--without",
        default="",
        help="run the gateway with these per-request features off (bench/without.py)",
    )
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return 0
    cli = without.command(args.without)
    up_port, gw_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or f"sqlite:///{tmp}/bench.db"
        env = {**os.environ, "INFERCACHE_DATA_DIR": tmp}
        upstream = subprocess.Popen([sys.executable, __file__, "--serve-upstream", str(up_port)])
        gateway = subprocess.Popen(
            [*cli, "serve", "--port", str(gw_port), "--store", store,
             "--upstream", f"http://127.0.0.1:{up_port}/v1"],
            env=env,
        )  # fmt: skip
        try:
            wait_for(f"http://127.0.0.1:{up_port}/v1/models")
            wait_for(f"http://127.0.0.1:{gw_port}/healthz")
            gw, up = f"http://127.0.0.1:{gw_port}/v1", f"http://127.0.0.1:{up_port}/v1"
            print(f"store: {store.split('?')[0]}; client, gateway and upstream on one machine")
            if args.without:
                print(f"gateway features off: {args.without}")
            if shutil.which("wrk"):
                if not args.endpoints_only:
                    run_wrk(gw, up, args.concurrency, args.seconds)
                endpoint_hits(gw, args.concurrency, args.seconds, args.rounds)
                return 0
            print("wrk not found (apt-get install wrk): measuring with httpx, a heavier client")
            rate, lat = asyncio.run(hits(gw, args.requests, args.concurrency))
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
