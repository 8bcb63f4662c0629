"""Gateway variants side by side: paired rounds of miss and hit latency, one upstream behind all.

    .venv/bin/python bench/gateway_paired.py [--rounds 20] [--seconds 4] [--concurrency 32]
                                             VARIANT...

A VARIANT is `shipped` (this tree, as `infercache serve` runs), `without:FEATURES` (this tree
with per-request features off, bench/without.py), or `tree:DIR` (another checkout's `src`,
for example the code before a change: `git archive REV src | tar -x -C DIR`, then
`tree:DIR/src`). Every variant's gateway (SQLite store in a temp dir) runs at once behind one
stand-in upstream (bench/gateway.py's), each idle while another is measured. Each round runs,
for every variant in turn, `wrk` from one connection for `--seconds`: requests with prompts
unique to that run (each a miss: lookup, upstream call, store) and then one cached request
(each an exact hit, checked); with `--concurrency N`, the cached request again from N
connections (hits/s). Each round also runs the misses against the upstream directly, so what a
miss adds (its p50 through a gateway minus the upstream's own) is printed too. Alternating
within a round puts every variant under the same conditions, so the paired difference of each
round against the first variant is the figure; its median and sign counts are printed beside
each variant's median and range. The variants run in reverse order every other round, so none
is always measured right after another's load. `wrk` reports latencies above 1 ms to 10 µs.

Needs `wrk` (Debian's package).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import without
from gateway import HIT_LUA, MISS_LUA, body, free_port, wait_for, wrk

BENCH = Path(__file__).parent


def command(variant: str, port: int, store: str, upstream: str) -> tuple[list[str], dict[str, str]]:
    """The gateway process of `variant` and its environment."""
    serve = ["serve", "--port", str(port), "--store", store, "--upstream", upstream]
    env = dict(os.environ)
    if variant == "shipped":
        return [*without.command(""), *serve], env
    if variant.startswith("without:"):
        return [*without.command(variant.removeprefix("without:")), *serve], env
    if variant.startswith("tree:"):
        env["PYTHONPATH"] = variant.removeprefix("tree:")
        return [*without.command(""), *serve], env
    raise SystemExit(f"unknown variant {variant!r}: shipped, without:FEATURES or tree:DIR")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="+", help="the first is the baseline")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seconds", type=int, default=4, help="per wrk run")
    parser.add_argument("--concurrency", type=int, default=0, help="hits/s from N connections")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk not found (apt-get install wrk)")
    up_port = free_port()
    processes: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            processes.append(
                subprocess.Popen(
                    [sys.executable, str(BENCH / "gateway.py"), "--serve-upstream", str(up_port)]
                )
            )
            upstream = f"http://127.0.0.1:{up_port}/v1"
            urls: list[str] = []
            for i, variant in enumerate(args.variants):
                port = free_port()
                cmd, env = command(variant, port, f"sqlite:///{tmp}/{i}.db", upstream)
                env["INFERCACHE_DATA_DIR"] = f"{tmp}/{i}"
                processes.append(subprocess.Popen(cmd, env=env))
                urls.append(f"http://127.0.0.1:{port}/v1/chat/completions")
            wait_for(f"{upstream}/models")
            for url in urls:
                wait_for(url.replace("/v1/chat/completions", "/healthz"))
                httpx.post(url, json=body(0), timeout=30)  # stores the hit
            direct = f"{upstream}/chat/completions"
            return measure(args.variants, urls, direct, args)
        finally:
            for p in processes:
                p.terminate()
            for p in processes:
                p.wait(30)


def measure(variants: list[str], urls: list[str], direct: str, args: argparse.Namespace) -> int:
    rounds, seconds = args.rounds, args.seconds
    hit_script = HIT_LUA.replace("BODY", json.dumps(body(0)))
    for url in urls:  # warm: connections, code paths
        wrk(url, MISS_LUA.replace("RUN", f"warm{time.time_ns()}"), 1, 1)
    miss: list[list[float]] = [[] for _ in variants]
    adds: list[list[float]] = [[] for _ in variants]
    hit: list[list[float]] = [[] for _ in variants]
    rps: list[list[float]] = [[] for _ in variants]
    for r in range(rounds):
        upstream_p50 = wrk(direct, MISS_LUA.replace("RUN", f"d{time.time_ns()}"), 1, seconds)
        # Every other round in reverse order: a variant measured right after another's
        # 32-connection burst reads ~40 µs slower on a miss (measured), whichever it is.
        order = list(enumerate(urls)) if r % 2 == 0 else list(enumerate(urls))[::-1]
        for i, url in order:
            miss[i].append(
                wrk(url, MISS_LUA.replace("RUN", f"r{time.time_ns()}"), 1, seconds)["p50_ms"]
            )
            adds[i].append(miss[i][-1] - upstream_p50["p50_ms"])
            hit[i].append(_hits(variants[i], wrk(url, hit_script, 1, seconds))["p50_ms"])
            if args.concurrency:
                many = wrk(url, hit_script, args.concurrency, seconds)
                rps[i].append(_hits(variants[i], many)["rps"])
        print(f"round {r + 1}/{rounds}: miss p50 "
              + ", ".join(f"{m[-1]:.3f}" for m in miss) + " ms; hit p50 "
              + ", ".join(f"{h[-1]:.3f}" for h in hit) + " ms"
              + ("; hits/s " + ", ".join(f"{x[-1]:,.0f}" for x in rps) if args.concurrency else ""),
              flush=True)  # fmt: skip
    series = [("miss p50 (ms)", miss, 1000), ("what a miss adds, p50 (ms)", adds, 1000),
              ("exact hit p50 (ms)", hit, 1000)]  # fmt: skip
    if args.concurrency:
        series.append((f"exact hits/s, {args.concurrency} connections", rps, 1))
    for label, xs_by_variant, scale in series:
        unit = "µs" if scale == 1000 else "/s"
        print(f"\n{label}, {rounds} rounds (median (range); paired difference against "
              f"{variants[0]}: median, rounds higher / lower / equal)")  # fmt: skip
        for variant, xs in zip(variants, xs_by_variant, strict=True):
            diffs = [x - b for x, b in zip(xs, xs_by_variant[0], strict=True)]
            print(f"  {variant:60s} {statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})  "
                  f"{statistics.median(diffs) * scale:+.0f} {unit}  "
                  f"{sum(d > 0 for d in diffs)}/{sum(d < 0 for d in diffs)}/"
                  f"{sum(d == 0 for d in diffs)}")  # fmt: skip
    return 0


def _hits(variant: str, result: dict[str, float]) -> dict[str, float]:
    if result["others"] != 0:
        raise SystemExit(f"{variant}: not every response was an exact hit: {result}")
    return result


if __name__ == "__main__":
    sys.exit(main())
