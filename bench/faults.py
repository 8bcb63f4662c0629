"""What the gateway's dependencies failing costs its clients: per fault, the requests that
failed, latency during the fault, and the time to recover.

    .venv/bin/python bench/faults.py [--fault-s 10] [--concurrency 8]

Processes, as a user runs them: redis-server (its own, on a free port), a stand-in upstream
(this script with --serve-upstream: answers at once unless told to be slow or to reset its
streams), and the gateway (`infercache serve --upstream ... --store ...`). The load: a
health-check prober every 20 ms, and `--concurrency` clients alternating a hot question (one of
8, cached before the fault) and a fresh one (a miss), streaming every fourth fresh one.

Faults, each `--fault-s` long, on a fresh gateway and store:
  redis paused      SIGSTOP, then SIGCONT
  redis restarted   killed, and after the fault a new empty redis-server on the same port
  sqlite locked     another process holds BEGIN EXCLUSIVE on the gateway's SQLite file
  upstream down     the upstream process killed, then started again
  upstream slow     every upstream answer 2 s late
  upstream resets   every upstream stream broken mid-answer (a connection reset)
A request failed when it got no answer: a non-200, a transport error, or a stream that ended
in an error event. Fresh questions need the upstream, so while it is down or resetting they
fail by nature; hot questions and health checks never should. Recovery: from the end of the
fault until a hot question is an exact hit again (store faults) or a fresh one is answered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).parent / "infercache")


# -- the stand-in upstream (a separate process) --


def serve_upstream(port: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    state: dict[str, Any] = {"delay_s": 0.0, "reset": False}

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "chatcmpl-fault",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model", "bench-model"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "An answer."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 30, "completion_tokens": 3, "total_tokens": 33},
        }

    async def chunks(body: dict[str, Any]) -> Any:
        base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
        delta = {"role": "assistant", "content": "An "}
        first = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        yield f"data: {json.dumps(first)}\n\n".encode()
        if state["reset"]:
            raise ConnectionResetError("reset mid-stream")
        last = {**base, "choices": [{"index": 0, "delta": {"content": "answer."},
                                     "finish_reason": "stop"}]}  # fmt: skip
        yield f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode()

    async def chat(request: Request) -> Response:
        body = json.loads(await request.body())
        if state["delay_s"]:
            await asyncio.sleep(state["delay_s"])
        if body.get("stream"):
            return StreamingResponse(chunks(body), media_type="text/event-stream")
        return JSONResponse(answer(body))

    async def control(request: Request) -> Response:
        state.update(json.loads(await request.body()))
        return JSONResponse(state)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "bench-model"}]})

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", models),
            Route("/control", control, methods=["POST"]),
        ]
    )
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")


# -- processes --


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_line(process: subprocess.Popen[str], marker: str) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        if marker in line:
            return
    raise SystemExit(f"process exited before {marker!r}")


def start_redis(port: int, workdir: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(workdir), "--maxmemory-policy", "volatile-lru"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    wait_line(process, "Ready to accept connections")
    return process


def start_upstream(port: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve-upstream", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # a bench: polling a port it just launched is fine
        try:
            httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
            return process
        except httpx.HTTPError:
            time.sleep(0.05)
    raise SystemExit("the stand-in upstream did not start")


def start_gateway(port: int, upstream: str, store: str, data_dir: Path) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [EXE, "serve", "--port", str(port), "--upstream", upstream, "--store", store],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "INFERCACHE_DATA_DIR": str(data_dir)},
    )  # fmt: skip
    wait_line(process, "gateway ready")
    return process


def stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        process.wait(30)


# -- load --


def question(kind: str, i: int, stream: bool = False) -> dict[str, Any]:
    text = f"hot question {i % 8}" if kind == "hot" else f"fresh question {i} {time.time_ns()}"
    return {
        "model": "bench-model",
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
        "stream": stream,
    }


class Load:
    def __init__(self, url: str, concurrency: int) -> None:
        self.url = url
        self.concurrency = concurrency
        self.samples: list[tuple[float, str, float, bool, str]] = []  # t, kind, s, ok, layer
        self.running = True

    async def client(self, w: int, http: httpx.AsyncClient) -> None:
        i = w
        while self.running:
            i += 1
            for kind in ("hot", "fresh"):
                stream = kind == "fresh" and i % 4 == 0
                started = time.monotonic()
                ok, layer = False, ""
                try:
                    r = await http.post("/v1/chat/completions", json=question(kind, i, stream))
                    ok = r.status_code == 200 and '"error"' not in r.text[-300:]
                    layer = r.headers.get("x-infercache", "")
                except httpx.HTTPError:
                    ok = False
                self.samples.append((started, kind, time.monotonic() - started, ok, layer))

    async def prober(self, http: httpx.AsyncClient) -> None:
        while self.running:
            started = time.monotonic()
            try:
                ok = (await http.get("/healthz")).status_code == 200
            except httpx.HTTPError:
                ok = False
            self.samples.append((started, "healthz", time.monotonic() - started, ok, ""))
            await asyncio.sleep(0.02)

    async def run(self, until: asyncio.Event) -> None:
        limits = httpx.Limits(max_connections=self.concurrency + 2)
        async with httpx.AsyncClient(base_url=self.url, timeout=60, limits=limits) as http:
            tasks = [asyncio.ensure_future(self.client(w, http)) for w in range(self.concurrency)]
            tasks.append(asyncio.ensure_future(self.prober(http)))
            await until.wait()
            self.running = False
            await asyncio.gather(*tasks)


def p99_ms(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] * 1000 if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[98] * 1000


# -- one fault --


@contextmanager
def world(tmp: Path, store_kind: str) -> Iterator[dict[str, Any]]:
    redis_port, upstream_port, gateway_port = free_port(), free_port(), free_port()
    redis = start_redis(redis_port, tmp)
    upstream = start_upstream(upstream_port)
    store = (
        f"redis://127.0.0.1:{redis_port}/0"
        if store_kind == "redis"
        else f"sqlite:///{tmp / 'faults.db'}"
    )
    gateway = start_gateway(gateway_port, f"http://127.0.0.1:{upstream_port}/v1", store, tmp)
    w = {
        "redis": redis, "redis_port": redis_port, "upstream": upstream,
        "upstream_port": upstream_port, "gateway": gateway, "tmp": tmp,
        "url": f"http://127.0.0.1:{gateway_port}", "db": tmp / "faults.db",
    }  # fmt: skip
    try:
        yield w
    finally:
        for name in ("gateway", "upstream", "redis"):
            if w[name].poll() is None:
                os.kill(w[name].pid, signal.SIGCONT)
            stop(w[name])


def control(w: dict[str, Any], **state: Any) -> None:
    httpx.post(f"http://127.0.0.1:{w['upstream_port']}/control", json=state, timeout=5)


async def measure(name: str, store_kind: str, fault_s: float, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, world(Path(tmp), store_kind) as w:
        async with httpx.AsyncClient(base_url=w["url"], timeout=30) as http:
            for i in range(8):  # warm the hot questions
                await http.post("/v1/chat/completions", json=question("hot", i))
        load = Load(w["url"], concurrency)
        stop_load = asyncio.Event()
        runner = asyncio.ensure_future(load.run(stop_load))
        await asyncio.sleep(2.0)  # before the fault
        holder: subprocess.Popen[str] | None = None
        fault_started = time.monotonic()
        if name == "redis paused":
            os.kill(w["redis"].pid, signal.SIGSTOP)
        elif name == "redis restarted":
            w["redis"].kill()
        elif name == "sqlite locked":
            holder = subprocess.Popen(
                [sys.executable, "-c",
                 f"import sqlite3,sys\nc=sqlite3.connect({str(w['db'])!r},isolation_level=None)\n"
                 "c.execute('BEGIN EXCLUSIVE')\nprint('locked',flush=True)\nsys.stdin.read()"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            wait_line(holder, "locked")
        elif name == "upstream down":
            w["upstream"].kill()
        elif name == "upstream slow":
            control(w, delay_s=2.0)
        elif name == "upstream resets":
            control(w, reset=True)
        await asyncio.sleep(fault_s)
        fault_ended = time.monotonic()
        if name == "redis paused":
            os.kill(w["redis"].pid, signal.SIGCONT)
        elif name == "redis restarted":
            w["redis"].wait(10)
            w["redis"] = start_redis(w["redis_port"], w["tmp"])
        elif name == "sqlite locked" and holder is not None:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(10)
        elif name == "upstream down":
            w["upstream"] = start_upstream(w["upstream_port"])
        elif name == "upstream slow":
            control(w, delay_s=0.0)
        elif name == "upstream resets":
            control(w, reset=False)
        await asyncio.sleep(6.0)  # after the fault
        stop_load.set()
        await runner
    during = [s for s in load.samples if fault_started <= s[0] < fault_ended]
    after = [s for s in load.samples if s[0] >= fault_ended]
    by_kind: dict[str, list[tuple[float, str, float, bool, str]]] = defaultdict(list)
    for s in during:
        by_kind[s[1]].append(s)
    store_fault = name.startswith(("redis", "sqlite"))
    recovered = [
        s[0] for s in after
        if (s[1] == "hot" and s[4] == "exact-hit") if store_fault
    ] if store_fault else [s[0] for s in after if s[1] == "fresh" and s[3]]  # fmt: skip
    return {
        "fault": name,
        "requests": len(during),
        "failed": {k: sum(not s[3] for s in v) for k, v in sorted(by_kind.items())},
        "hot_hits": sum(s[4] == "exact-hit" for s in by_kind["hot"]),  # coalesced ones too
        "p99_ms": {k: round(p99_ms([s[2] for s in v]), 1) for k, v in sorted(by_kind.items())},
        "recover_s": round(min(recovered) - fault_ended, 2) if recovered else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fault-s", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--only", help="run one fault, by name")
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return 0
    faults = [
        ("redis paused", "redis"), ("redis restarted", "redis"), ("sqlite locked", "sqlite"),
        ("upstream down", "sqlite"), ("upstream slow", "sqlite"), ("upstream resets", "sqlite"),
    ]  # fmt: skip
    print(f"load: {args.concurrency} clients + a health prober; each fault {args.fault_s:.0f} s")
    print(f"machine load average: {os.getloadavg()[0]:.1f}")
    header = "| fault | requests | failed (healthz / hot / fresh) | p99 ms (healthz / hot / fresh)"
    print(header + " | hot hits | recovered after |")
    print("|---|---:|---|---|---:|---:|")
    for name, store_kind in faults:
        if args.only and args.only != name:
            continue
        r = asyncio.run(measure(name, store_kind, args.fault_s, args.concurrency))
        failed = " / ".join(str(r["failed"].get(k, 0)) for k in ("healthz", "hot", "fresh"))
        p99 = " / ".join(
            f"{r['p99_ms'].get(k, float('nan')):.0f}" for k in ("healthz", "hot", "fresh")
        )
        recover = "—" if r["recover_s"] is None else f"{r['recover_s']:.2f} s"
        print(f"| {name} | {r['requests']} | {failed} | {p99} | {r['hot_hits']} | {recover} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
