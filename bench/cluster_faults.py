"""A Redis Cluster master killed under load (issue 30): two gateway processes on a 3-master
cluster, a paced load through both, one master killed and restarted; what it costs clients.

    .venv/bin/python bench/cluster_faults.py [--replicas 0|1] [--restart aof|empty]
        [--full-coverage no|yes] [--reads-when-down no|yes] [--duration-s 60]
        [--kill-at-s 20] [--restart-at-s 40] [--rate 10] [--questions 12]

Processes, as a user runs them: the cluster (tests/conftest.py's `start_redis_cluster`, with
`cluster-require-full-coverage no` unless `--full-coverage yes`, `cluster-allow-reads-when-down
yes` with `--reads-when-down yes`, and a 5 s `cluster-node-timeout`; with `--replicas 1` each
master has a replica), the stand-in upstream of bench/faults.py, and two `infercache serve
--store redis+cluster://...` gateways. The load is open-loop: `--rate` requests per second,
sent on schedule whatever the answers take, alternating the gateways, cycling over
`--questions` questions (each cached before the run). `--restart aof`: the nodes keep an
append-only file, so the killed master comes back with its data, as a production master does;
`empty`: it comes back empty and its questions are misses once more.

Reported: failed requests (not a 200); latency p50, p99 and max over the whole run and per
phase; per phase, the hit rate of the questions on the killed master ("dead") and on the others
("live"); from when on every request on a dead question was a hit again, counted from the
restart command and from the node serving again (a master stays in `cluster_state:fail` ~2 s
after it starts: Redis' own rejoin delay; with `--reads-when-down yes` it serves reads
meanwhile); with replicas, the failover time (kill until the
replica is master) and from when on every dead question was a hit again after the kill.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # tests.conftest: the clusters the tests use
import faults  # noqa: E402  (this directory)

from tests.conftest import RedisClusterServers, start_redis_cluster  # noqa: E402

PREFIX = "bench:"


@dataclass(frozen=True, slots=True)
class Sample:
    started_s: float  # since the run began
    gateway: int
    question: str
    seconds: float
    ok: bool
    layer: str


def question_body(text: str) -> dict[str, Any]:
    return {
        "model": "bench-model",
        "messages": [{"role": "user", "content": text}],
        "temperature": 0,
    }


def entry_keys(cluster: RedisClusterServers) -> dict[bytes, int]:
    """Every entry key under the bench's prefix, with the port of the master holding it."""
    found = {}
    for port in cluster.masters():
        with redis.Redis(port=port) as node:
            for key in node.scan_iter(match=f"{PREFIX}{{b*}}e:*", count=1000):
                found[key] = port
    return found


def warm(urls: list[str], cluster: RedisClusterServers, questions: list[str]) -> dict[str, int]:
    """Cache each question; return the port of the master holding each."""
    where: dict[str, int] = {}
    with httpx.Client(timeout=30) as http:
        for q in questions:
            known = entry_keys(cluster)
            http.post(f"{urls[0]}/v1/chat/completions", json=question_body(q))
            deadline = time.monotonic() + 5  # the write may land just after the answer
            while not (new := {k: p for k, p in entry_keys(cluster).items() if k not in known}):
                assert time.monotonic() < deadline, f"no entry stored for {q!r} within 5 s"
            assert len(new) == 1, f"expected one new entry for {q!r}, found {len(new)}"
            where[q] = next(iter(new.values()))
            for url in urls:
                r = http.post(f"{url}/v1/chat/completions", json=question_body(q))
                assert r.headers.get("x-infercache") == "exact-hit", (q, url, r.headers)
    return where


class Timeline:
    """When things happened, in seconds since the run began."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.events: dict[str, float] = {}

    def now(self) -> float:
        return time.monotonic() - self.t0

    def mark(self, name: str) -> None:
        self.events[name] = self.now()


async def load(
    urls: list[str], questions: list[str], args: argparse.Namespace, timeline: Timeline
) -> list[Sample]:
    samples: list[Sample] = []
    limits = httpx.Limits(max_connections=64)

    async def one(http: httpx.AsyncClient, i: int) -> None:
        gateway, q = i % len(urls), questions[(i // len(urls)) % len(questions)]
        started = timeline.now()
        ok, layer = False, ""
        try:
            r = await http.post(f"{urls[gateway]}/v1/chat/completions", json=question_body(q))
            ok, layer = r.status_code == 200, r.headers.get("x-infercache", "")
        except httpx.HTTPError as exc:
            layer = f"error: {type(exc).__name__}"  # not ok
        samples.append(Sample(started, gateway, q, timeline.now() - started, ok, layer))

    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        tasks = []
        for i in range(int(args.duration_s * args.rate)):
            delay_s = i / args.rate - timeline.now()
            if delay_s > 0:
                await asyncio.sleep(delay_s)  # the schedule: open-loop load
            tasks.append(asyncio.create_task(one(http, i)))
        await asyncio.gather(*tasks)
    return samples


def watch_failover(cluster: RedisClusterServers, timeline: Timeline, stop: threading.Event) -> None:
    """Mark `failover` when there are three live masters again after the kill."""
    while not stop.wait(0.05):
        if "killed" in timeline.events and len(cluster.masters()) == 3:
            timeline.mark("failover")
            return


async def faults_in(cluster: RedisClusterServers, victim: int, args: argparse.Namespace,
                    timeline: Timeline) -> None:  # fmt: skip
    await asyncio.sleep(max(0.0, args.kill_at_s - timeline.now()))
    await asyncio.to_thread(cluster.kill, victim)
    timeline.mark("killed")
    await asyncio.sleep(max(0.0, args.restart_at_s - timeline.now()))
    timeline.mark("restart")
    await asyncio.to_thread(cluster.restart, victim)  # returns when every node says ok
    timeline.mark("node ok")


def pct(values: list[float], q: int) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0] * 1000
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000


def hit_rate(samples: list[Sample]) -> str:
    if not samples:
        return "—"
    return f"{100 * sum(s.layer == 'exact-hit' for s in samples) / len(samples):.0f}%"


def report(samples: list[Sample], dead: set[str], timeline: Timeline) -> dict[str, Any]:
    ev = timeline.events
    phases = {
        "before": (0.0, ev["killed"]),
        "outage": (ev["killed"], ev["restart"]),
        "after": (ev["restart"], float("inf")),
    }
    out: dict[str, Any] = {
        "requests": len(samples),
        "failed": sum(not s.ok for s in samples),
        "p50_ms": round(pct([s.seconds for s in samples], 50), 1),
        "p99_ms": round(pct([s.seconds for s in samples], 99), 1),
        "max_ms": round(max(s.seconds for s in samples) * 1000, 1),
        "events_s": {k: round(v, 2) for k, v in ev.items()},
        "phases": {},
    }
    for name, (start, end) in phases.items():
        inside = [s for s in samples if start <= s.started_s < end]
        out["phases"][name] = {
            "p99_ms": round(pct([s.seconds for s in inside], 99), 1),
            "max_ms": round(max((s.seconds for s in inside), default=0) * 1000, 1),
            "dead_hits": hit_rate([s for s in inside if s.question in dead]),
            "live_hits": hit_rate([s for s in inside if s.question not in dead]),
        }
    out["slowest_ms"] = " ".join(
        f"{s.seconds * 1000:.0f}@{s.started_s:.1f}s({s.layer})"
        for s in sorted(samples, key=lambda s: -s.seconds)[:8]
    )

    def last_dead_miss(start: float, end: float = float("inf")) -> float:
        """When the last request on a dead question that was not a hit started (or `start`)."""
        return max(
            (s.started_s for s in samples
             if s.question in dead and start <= s.started_s < end and s.layer != "exact-hit"),
            default=start,
        )  # fmt: skip

    # From then on every request on a dead question was a hit.
    out["dead_all_hits_from_restart_s"] = round(last_dead_miss(ev["restart"]) - ev["restart"], 2)
    out["dead_first_hit_after_restart_s"] = round(
        min((s.started_s for s in samples if s.question in dead
             and s.started_s >= ev["restart"] and s.layer == "exact-hit"), default=float("nan"))
        - ev["restart"], 2,
    )  # fmt: skip
    out["dead_all_hits_from_node_ok_s"] = round(
        max(0.0, last_dead_miss(ev["restart"]) - ev["node ok"]), 2
    )
    out["dead_first_hit_after_node_ok_s"] = round(
        min((s.started_s for s in samples if s.question in dead
             and s.started_s >= ev["node ok"] and s.layer == "exact-hit"), default=float("nan"))
        - ev["node ok"], 2,
    )  # fmt: skip
    if "failover" in ev:
        out["failover_s"] = round(ev["failover"] - ev["killed"], 2)
        out["dead_all_hits_from_kill_s"] = round(
            last_dead_miss(ev["killed"], ev["restart"]) - ev["killed"], 2
        )
    return out


async def run(args: argparse.Namespace, cluster: RedisClusterServers, tmp: Path) -> None:
    upstream_port = faults.free_port()
    upstream = faults.start_upstream(upstream_port)
    store = f"{cluster.url()}?prefix={PREFIX}"
    gateways, urls = [], []
    try:
        for i in range(2):
            port = faults.free_port()
            data_dir = tmp / f"gateway-{i}"
            data_dir.mkdir()
            gateways.append(faults.start_gateway(
                port, f"http://127.0.0.1:{upstream_port}/v1", store, data_dir
            ))  # fmt: skip
            urls.append(f"http://127.0.0.1:{port}")
        questions = [f"cluster question {i}" for i in range(args.questions)]
        where = warm(urls, cluster, questions)
        victim = max(set(where.values()), key=lambda p: (list(where.values()).count(p), -p))
        dead = {q for q, port in where.items() if port == victim}
        timeline = Timeline()
        stop = threading.Event()
        watcher = threading.Thread(target=watch_failover, args=(cluster, timeline, stop))
        if args.replicas:
            watcher.start()
        samples, _ = await asyncio.gather(
            load(urls, questions, args, timeline), faults_in(cluster, victim, args, timeline)
        )
        stop.set()
        if args.replicas:
            watcher.join(10)
    finally:
        for process in [*gateways, upstream]:
            faults.stop(process)
    if args.trace:
        for smp in sorted(samples, key=lambda x: x.started_s):
            if smp.started_s > timeline.events["killed"] - 1:
                print(
                    round(smp.started_s, 2),
                    smp.gateway,
                    smp.question,
                    smp.layer,
                    round(smp.seconds * 1000, 1),
                )
    result = report(samples, dead, timeline)
    result["dead_questions"] = f"{len(dead)} of {len(questions)}"
    print(json.dumps(result, indent=2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, choices=(0, 1), default=0)
    parser.add_argument("--restart", choices=("aof", "empty"), default="aof")
    parser.add_argument(
        "--full-coverage",
        choices=("no", "yes"),
        default="no",
        help="cluster-require-full-coverage (Redis' default is yes)",
    )
    parser.add_argument(
        "--reads-when-down",
        choices=("no", "yes"),
        default="no",
        help="cluster-allow-reads-when-down (Redis' default is no)",
    )
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--kill-at-s", type=float, default=20.0)
    parser.add_argument("--restart-at-s", type=float, default=40.0)
    parser.add_argument("--rate", type=float, default=10.0)
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--trace", action="store_true", help="print every request from the kill")
    args = parser.parse_args()
    print(
        f"replicas {args.replicas}, restart {args.restart}, full coverage "
        f"{args.full_coverage}, reads when down {args.reads_when_down}, {args.rate:g} req/s for "
        f"{args.duration_s:g} s, kill at {args.kill_at_s:g} s, restart at "
        f"{args.restart_at_s:g} s; load average {os.getloadavg()[0]:.1f}"
    )
    with (
        tempfile.TemporaryDirectory() as tmp,
        start_redis_cluster(
            Path(tmp) / "cluster",
            replicas=args.replicas,
            full_coverage=args.full_coverage == "yes",
            persist=args.restart == "aof",
            reads_when_down=args.reads_when_down == "yes",
        ) as cluster,
    ):
        asyncio.run(run(args, cluster, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
