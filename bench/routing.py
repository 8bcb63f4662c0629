"""Cache-aware routing, measured: 3 built-in engine replicas; prefix-affine, round-robin, random.

    nice -n 10 .venv/bin/python bench/routing.py [--data /work/shared/data] [--concurrency 6]

Replicas: `infercache engine serve` processes on loopback at their default KV budget (512 MiB
each: ~11.6k tokens of the packaged SmolLM2-135M in float32), one torch thread each (3 engines
on 2 cores), restarted empty for each policy. The client is this process: `concurrency`
workers send the trace in its order, streaming, each request through the router under test
(`lease`) to the replica it picks (`HTTPUpstream`, the gateway's own client). Prefix-affine is
the gateway's `PrefixRouter` with its load poller reading the engines' `/metrics`.

Workload (one trace, replayed alike for every policy), arrivals shuffled:
- 10 system prompts (arena-hard-v2 prompts as a project's context, ~1,000 characters each),
  each with many short questions (banking77 queries);
- multi-turn conversations (sharegpt_multiturn_sample.jsonl): turn k sends every message up to
  the k-th user message, so each turn extends the previous one; a conversation's next turn is
  sent only after its previous one answered (a user reads before typing). Messages are cut to
  `--message-chars`.
The order is a random interleaving of the sessions (a system prompt's questions are sessions of
one request), seeded.

Figures per policy: cached-token rate (sum of `usage.prompt_tokens_details.cached_tokens` /
sum of `prompt_tokens`), overall and per part; p50 TTFT (first content chunk); load imbalance
(max/min requests per replica); wall time. Oracle: one prefix cache holding all the replicas'
memory (3 x the per-replica token capacity), the trace replayed in order through the engine's
radix tree without KV (analyze/simulated_prefix_cache.py) over the same token ids (the engine's
chat template, encoded here): the most any router can reach.

`--kill`: acceptance 5 on real engines. The real gateway (`build`, memory store) in front of 3
engines serves the trace's first `--kill-requests` requests non-streaming with `cache: no-store`
semantics avoided by unique questions; a third of the way in, one engine is SIGKILLed. Counts
failed requests (expected 0: a request that failed before any byte is retried on another
replica) and checks the victim's sessions are served by the others afterwards.

Prints a table; raw figures in bench/out/routing/routing.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from infercache.analyze.simulated_prefix_cache import SimulatedPrefixCache
from infercache.engine.config import DEFAULT_MAX_KV_BYTES, default_data_dir
from infercache.engine.tokenizer import ChatTokenizer
from infercache.engine.weights import load_checkpoint, resolve_model
from infercache.errors import InfercacheError
from infercache.gateway.replica_load import LoadPoller
from infercache.gateway.router import PrefixRouter, RouterConfig
from infercache.gateway.upstream import HTTPUpstream

TENANT = "bench"
MODEL = "SmolLM2-135M-Instruct"
KV_BYTES_PER_FLOAT = 4

# -- the workload --


@dataclass(frozen=True, slots=True)
class Request:
    session: str
    part: str  # "system" | "conversation"
    messages: tuple[tuple[str, str], ...]

    @property
    def prefix(self) -> str:
        """What its prefix is shared with: its system prompt's questions, or its conversation."""
        return self.session.split("-q")[0]

    def body(self, max_tokens: int) -> dict[str, Any]:
        return {
            "model": MODEL,
            "messages": [{"role": r, "content": c} for r, c in self.messages],
            "max_tokens": max_tokens,
            "temperature": 0,
        }


def system_sessions(data: Path, systems: int, questions: int, chars: int) -> list[list[Request]]:
    contexts = []
    with (data / "arena_hard_v2.0_questions.jsonl").open() as f:
        for line in f:
            prompt = json.loads(line)["prompt"]
            if len(prompt) >= chars:
                contexts.append(prompt[:chars])
            if len(contexts) == systems:
                break
    with (data / "banking77_train.csv").open() as f:
        queries = [row["text"] for row in csv.DictReader(f)]
    rng = random.Random(7)
    rng.shuffle(queries)
    sessions = []
    for s, context in enumerate(contexts):
        system = f"You are the assistant of project {s}. Its context follows.\n\n{context}"
        for q in range(questions):
            question = queries[s * questions + q]
            sessions.append(
                [Request(f"sys{s}-q{q}", "system", (("system", system), ("user", question)))]
            )
    return sessions


def conversation_sessions(
    data: Path, conversations: int, max_turns: int, chars: int
) -> list[list[Request]]:
    sessions = []
    with (data / "sharegpt_multiturn_sample.jsonl").open() as f:
        for line in f:
            row = json.loads(line)
            turns = row["conversations"]
            roles = [t["from"] for t in turns]
            if len(turns) < 4 or roles[0] != "human":
                continue
            messages: list[tuple[str, str]] = []
            requests = []
            for turn in turns:
                role = {"human": "user", "gpt": "assistant"}.get(turn["from"])
                if role is None or (messages and messages[-1][0] == role):
                    break  # not strictly alternating: stop the conversation here
                messages.append((role, turn["value"][:chars]))
                if role == "user":
                    requests.append(Request(f"conv{row['id']}", "conversation", tuple(messages)))
                if len(requests) == max_turns:
                    break
            if len(requests) >= 2:
                sessions.append(requests)
            if len(sessions) == conversations:
                break
    return sessions


def interleave(sessions: list[list[Request]], seed: int) -> list[Request]:
    """A random interleaving that keeps each session's own order."""
    slots = [i for i, s in enumerate(sessions) for _ in s]
    random.Random(seed).shuffle(slots)
    nexts = [0] * len(sessions)
    out = []
    for i in slots:
        out.append(sessions[i][nexts[i]])
        nexts[i] += 1
    return out


# -- the replicas --


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def engines(n: int, data_dir: Path) -> Iterator[tuple[list[str], list[subprocess.Popen[bytes]]]]:
    exe = Path(sys.executable).parent / "infercache"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    ports = [free_port() for _ in range(n)]
    procs = [
        subprocess.Popen(
            [str(exe), "engine", "serve", "--port", str(p), "--threads", "1",
             "--log-level", "warning", "--data-dir", str(data_dir)],
            env=env,
        )
        for p in ports
    ]  # fmt: skip
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        deadline = time.monotonic() + 300
        for url, proc in zip(urls, procs, strict=True):
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"engine at {url} exited with {proc.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"engine at {url} did not start")
                time.sleep(0.5)
        yield urls, procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- the policies --


class RoundRobin:
    def __init__(self, n: int) -> None:
        self.n = n
        self.next = 0

    @contextlib.contextmanager
    def lease(self, tenant: str, body: Any) -> Iterator[int]:
        i = self.next
        self.next = (self.next + 1) % self.n
        yield i


class Random:
    def __init__(self, n: int, seed: int) -> None:
        self.n = n
        self.rng = random.Random(seed)

    @contextlib.contextmanager
    def lease(self, tenant: str, body: Any) -> Iterator[int]:
        yield self.rng.randrange(self.n)


# -- one run --


@dataclass
class Result:
    replica: int
    part: str
    session: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float | None = None
    error: str | None = None


async def run_trace(
    trace: list[Request],
    router: Any,
    upstreams: list[HTTPUpstream],
    concurrency: int,
    max_tokens: int,
) -> tuple[list[Result], float]:
    done_events = [asyncio.Event() for _ in trace]
    previous: dict[int, int] = {}
    last_of: dict[str, int] = {}
    for i, r in enumerate(trace):
        if r.session in last_of:
            previous[i] = last_of[r.session]
        last_of[r.session] = i
    results: list[Result | None] = [None] * len(trace)
    position = 0

    async def one(i: int) -> None:
        request = trace[i]
        if i in previous:
            await done_events[previous[i]].wait()
        body = request.body(max_tokens)
        body["stream_options"] = {"include_usage": True}
        with router.lease(TENANT, body) as replica:
            result = Result(replica, request.part, request.session)
            started = time.perf_counter()
            try:
                async for chunk in upstreams[replica].stream(body, tenant=TENANT, api_key=None):
                    choices = chunk.get("choices") or []
                    if result.ttft_s is None and any(
                        (c.get("delta") or {}).get("content") or c.get("finish_reason")
                        for c in choices
                    ):
                        result.ttft_s = time.perf_counter() - started
                    usage = chunk.get("usage")
                    if usage:
                        result.prompt_tokens = usage["prompt_tokens"]
                        details = usage.get("prompt_tokens_details") or {}
                        result.cached_tokens = details.get("cached_tokens") or 0
            except InfercacheError as exc:  # counted and reported: the bench goes on
                result.error = repr(exc)
        results[i] = result
        done_events[i].set()

    async def worker() -> None:
        nonlocal position
        while position < len(trace):
            i = position
            position += 1
            await one(i)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall_s = time.perf_counter() - started
    return [r for r in results if r is not None], wall_s


async def run_policy(
    name: str, trace: list[Request], urls: list[str], args: argparse.Namespace
) -> tuple[list[Result], float]:
    upstreams = [HTTPUpstream(f"{u}/v1", timeout_s=600) for u in urls]
    poller = None
    if name == "prefix-affine":
        config = RouterConfig(
            block_chars=args.block_chars,
            min_match_blocks=args.min_match_blocks,
            imbalance_abs=args.imbalance_abs,
            imbalance_rel=args.imbalance_rel,
        )
        router: Any = PrefixRouter(upstreams, config)
        poller = LoadPoller(router, upstreams)
        poller.start()
    elif name == "round-robin":
        router = RoundRobin(len(urls))
    else:
        router = Random(len(urls), args.seed)
    try:
        return await run_trace(trace, router, upstreams, args.concurrency, args.max_tokens)
    finally:
        if poller is not None:
            await poller.aclose()
        for u in upstreams:
            await u.aclose()


def summarise(results: list[Result], wall_s: float, replicas: int) -> dict[str, Any]:
    ok = [r for r in results if r.error is None]
    out: dict[str, Any] = {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "wall_s": wall_s,
    }
    for part in ("all", "system", "conversation"):
        rs = [r for r in ok if part in ("all", r.part)]
        prompt = sum(r.prompt_tokens for r in rs)
        out[part] = {
            "prompt_tokens": prompt,
            "cached_tokens": sum(r.cached_tokens for r in rs),
            "cached_rate": sum(r.cached_tokens for r in rs) / prompt if prompt else 0.0,
            "ttft_p50_s": statistics.median(r.ttft_s for r in rs if r.ttft_s is not None)
            if rs
            else None,
        }
    counts = [sum(1 for r in results if r.replica == i) for i in range(replicas)]
    out["per_replica"] = counts
    out["imbalance"] = max(counts) / max(1, min(counts))
    return out


# -- the oracle --


def token_ids(trace: list[Request], data_dir: Path) -> tuple[list[list[int]], int]:
    """The engine's prompt ids of each request, and its KV bytes per token."""
    resolved = resolve_model(None, data_dir)
    checkpoint = load_checkpoint(resolved.directory)
    tokenizer = ChatTokenizer(checkpoint.tokenizer, checkpoint.eos_token_ids)
    spec = checkpoint.spec
    bytes_per_token = spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * KV_BYTES_PER_FLOAT
    ids = [
        tokenizer.encode_chat([{"role": r, "content": c} for r, c in req.messages]) for req in trace
    ]
    return ids, bytes_per_token


def oracle(trace: list[Request], ids: list[list[int]], capacity_tokens: int) -> dict[str, Any]:
    cache = SimulatedPrefixCache(capacity_tokens=capacity_tokens)
    totals: dict[str, list[int]] = {"all": [0, 0], "system": [0, 0], "conversation": [0, 0]}
    for i, (req, prompt) in enumerate(zip(trace, ids, strict=True)):
        reuse = cache.observe(
            "bench", tuple(prompt), unit_tokens=1, prompt_tokens=len(prompt), now_s=float(i)
        )
        for part in ("all", req.part):
            totals[part][0] += len(prompt)
            totals[part][1] += reuse.reused_tokens
    return {
        p: {"prompt_tokens": t[0], "cached_tokens": t[1], "cached_rate": t[1] / t[0]}
        for p, t in totals.items()
    }


# -- acceptance 5: a replica killed mid-run behind the real gateway --


def kill_run(
    trace: list[Request],
    urls: list[str],
    procs: list[subprocess.Popen[bytes]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The real gateway in front of the engines; one engine SIGKILLed a third of the way in,
    with requests in flight. Which replica served what is read off the gateway's router."""
    from infercache.gateway.build import build
    from infercache.gateway.config import GatewayConfig
    from infercache.settings import Settings

    sys.path.insert(0, str(Path(__file__).parent.parent))
    from tests.harness.servers import serve

    requests = trace[: args.kill_requests]
    data_dir = args.out / "kill-gateway"
    data_dir.mkdir(parents=True, exist_ok=True)
    built = build(
        Settings(data_dir=data_dir, store_url="memory://"),
        GatewayConfig(upstreams=tuple(f"{u}/v1" for u in urls), version_poll_s=None),
    )
    router = built.gateway.router
    routed: dict[str, list[int]] = {}  # the messages' JSON -> replicas tried, in order
    lease = router.lease

    @contextlib.contextmanager
    def recording_lease(tenant: str, body: Any, exclude: Any = ()) -> Iterator[int]:
        with lease(tenant, body, exclude) as i:
            routed.setdefault(json.dumps(body["messages"]), []).append(i)
            yield i

    router.lease = recording_lease  # type: ignore[method-assign]
    outcome: list[dict[str, Any]] = [{} for _ in requests]
    victim: int | None = None
    kill_at = len(requests) // 3

    async def drive(url: str) -> None:
        nonlocal victim
        position = 0
        done = [asyncio.Event() for _ in requests]
        previous = {}
        last: dict[str, int] = {}
        for i, r in enumerate(requests):
            if r.session in last:
                previous[i] = last[r.session]
            last[r.session] = i
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:

            async def worker() -> None:
                nonlocal position, victim
                while position < len(requests):
                    i = position
                    position += 1
                    if i in previous:
                        await done[previous[i]].wait()
                    if i == kill_at:  # the replica that served the most so far dies now
                        counts = [
                            sum(tries[-1] == k for tries in routed.values())
                            for k in range(len(urls))
                        ]
                        victim = counts.index(max(counts))
                        procs[victim].kill()
                    response = await client.post(
                        "/v1/chat/completions", json=requests[i].body(args.max_tokens)
                    )
                    usage = (
                        response.json().get("usage") or {} if response.status_code == 200 else {}
                    )
                    outcome[i] = {
                        "status": response.status_code,
                        "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                        or 0,
                        "prompt": usage.get("prompt_tokens") or 0,
                        "tries": routed.get(json.dumps(requests[i].body(0)["messages"]), []),
                        "after_kill": victim is not None,
                    }
                    done[i].set()

            await asyncio.gather(*(worker() for _ in range(args.concurrency)))

    with serve(built.app) as url:
        asyncio.run(drive(url))
        health = router.health()
    assert victim is not None
    failed = [i for i, o in enumerate(outcome) if o["status"] != 200]
    victim_prefixes = {
        r.prefix
        for r, o in zip(requests, outcome, strict=True)
        if not o["after_kill"] and o["tries"][-1:] == [victim]
    }
    moved = [
        (r, o)
        for r, o in zip(requests, outcome, strict=True)
        if o["after_kill"] and r.prefix in victim_prefixes
    ]
    retried = sum(1 for o in outcome if len(o["tries"]) > 1)
    return {
        "requests": len(requests),
        "failed": len(failed),
        "victim": victim,
        "health_after": health,
        "retried_on_another_replica": retried,
        "victim_prefixes": len(victim_prefixes),  # system prompts and conversations it held
        "their_requests_after_kill": len(moved),
        "served_by_victim_after_kill": sum(1 for _, o in moved if o["tries"][-1:] == [victim]),
        "their_cached_rate_after_kill": sum(o["cached"] for _, o in moved)
        / max(1, sum(o["prompt"] for _, o in moved)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--out", type=Path, default=Path("bench/out/routing"))
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--systems", type=int, default=10)
    parser.add_argument("--questions", type=int, default=10, help="per system prompt")
    parser.add_argument("--system-chars", type=int, default=1000)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--turns", type=int, default=4, help="at most, per conversation")
    parser.add_argument("--message-chars", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default="prefix-affine,round-robin,random")
    defaults = RouterConfig()
    parser.add_argument("--block-chars", type=int, default=defaults.block_chars)
    parser.add_argument("--min-match-blocks", type=int, default=defaults.min_match_blocks)
    parser.add_argument("--imbalance-abs", type=float, default=defaults.imbalance_abs)
    parser.add_argument("--imbalance-rel", type=float, default=defaults.imbalance_rel)
    parser.add_argument("--kill", action="store_true", help="also run acceptance 5's kill run")
    parser.add_argument("--kill-requests", type=int, default=90)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data_dir = default_data_dir(os.environ)

    sessions = system_sessions(args.data, args.systems, args.questions, args.system_chars)
    sessions += conversation_sessions(args.data, args.conversations, args.turns, args.message_chars)
    trace = interleave(sessions, args.seed)
    ids, bytes_per_token = token_ids(trace, data_dir)
    per_replica_tokens = DEFAULT_MAX_KV_BYTES // bytes_per_token
    parts = {p: sum(1 for r in trace if r.part == p) for p in ("system", "conversation")}
    print(
        f"trace: {len(trace)} requests ({parts['system']} under {args.systems} system prompts, "
        f"{parts['conversation']} conversation turns), {sum(map(len, ids)):,} prompt tokens; "
        f"KV per replica {per_replica_tokens:,} tokens; concurrency {args.concurrency}; "
        f"max_tokens {args.max_tokens}"
    )
    report: dict[str, Any] = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "requests": len(trace),
        "parts": parts,
        "prompt_tokens": sum(map(len, ids)),
        "per_replica_tokens": per_replica_tokens,
        "oracle": oracle(trace, ids, per_replica_tokens * args.replicas),
        "policies": {},
        "load_average": [],
    }
    for name in args.policies.split(","):
        with engines(args.replicas, data_dir) as (urls, _):
            results, wall_s = asyncio.run(run_policy(name, trace, urls, args))
        report["policies"][name] = summarise(results, wall_s, args.replicas)
        report["load_average"].append(os.getloadavg()[0])
        print(name, json.dumps(report["policies"][name]), flush=True)
    if args.kill:
        with engines(args.replicas, data_dir) as (urls, procs):
            report["kill"] = kill_run(trace, urls, procs, args)
        print("kill", json.dumps(report["kill"]))
    print_table(report)
    (args.out / "routing.json").write_text(json.dumps(report, indent=2))
    return 0


def print_table(report: dict[str, Any]) -> None:
    o = report["oracle"]
    print("\n| policy | cached, all | of oracle | cached, system | cached, conversation |", end="")
    print(" p50 TTFT ms | imbalance | per replica | errors | wall s |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for name, p in report["policies"].items():
        rate = p["all"]["cached_rate"]
        print(
            f"| {name} | {rate:.1%} | {rate / o['all']['cached_rate']:.1%} "
            f"| {p['system']['cached_rate']:.1%} | {p['conversation']['cached_rate']:.1%} "
            f"| {1000 * p['all']['ttft_p50_s']:.0f} | {p['imbalance']:.2f} | {p['per_replica']} "
            f"| {p['errors']} | {p['wall_s']:.0f} |"
        )
    print(
        f"| oracle: one cache, 3x memory | {o['all']['cached_rate']:.1%} | 100% "
        f"| {o['system']['cached_rate']:.1%} | {o['conversation']['cached_rate']:.1%} |||||"
    )
    policies = report["policies"]
    if "round-robin" in policies and "prefix-affine" in policies:
        pa, rr = policies["prefix-affine"], policies["round-robin"]
        for part in ("conversation", "all"):
            gain = pa[part]["cached_rate"] / max(1e-9, rr[part]["cached_rate"])
            print(f"{part}: prefix-affine / round-robin cached-token rate {gain:.2f}x")
    print(f"load average (1 min) after each policy: {report['load_average']}")


if __name__ == "__main__":
    raise SystemExit(main())
