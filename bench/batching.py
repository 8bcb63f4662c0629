"""The built-in engine per weight format: aggregate decode rate, TTFT, prefill and memory with
1, 4, 8 and 16 concurrent streams, every format in the same run.

    .venv/bin/python bench/batching.py [--weights fp32,fp16] [--baseline-src DIR]
        [--streams 1,4,8,16] [--rounds 5] [--new-tokens 64] [--threads N]
        [--out bench/out/batching]

Each variant is the real `Engine` (its worker thread, scheduler, streaming bridge) of the
packaged SmolLM2-135M-Instruct with `max_batch` = the largest stream count, in a subprocess of
its own (two engines in one process would keep two OpenMP teams on 2 cores, and libgomp then
stops spin-waiting: both slow down by a third, engine/worker.py), driven through its
`achat_stream` / `atext_completion_stream` from one asyncio loop. Variants: this tree's engine
in each `--weights` format, and with `--baseline-src DIR` the engine of another source tree in
its default format (`git archive 377426c src | tar -x -C DIR`: the engine before issue 28, fp32
held twice, the baseline of its targets; main's own engine serves fp16 since).
Every round runs every variant in turn, and the best of `--rounds` is kept: on a shared
machine a neighbour's burst only ever slows a run down, and interleaving makes drift hit
every variant alike.

Per variant and round:
- a wave of N streams started together, for each N of `--streams`: each stream a distinct
  ~40-token chat prompt (its own tenant: no stream reuses another's prefix) asking for exactly
  `--new-tokens` greedy tokens (`ignore_eos`). Aggregate decode tok/s is the wave's tokens
  after each stream's first over the time from the first first token to the last token; TTFT
  is from the call to the first text, over every stream of every round;
- prefill: a unique 512-token prompt (token ids, legacy completions) with `max_tokens` 1,
  timed from the call to the end of the answer;
- cached prefix: a unique 1,024-token prefix is sent once (with 16 other tokens after it),
  then the same prefix with 16 new tokens is timed the same way; the bench asserts that the
  1,024 tokens were reused;
- memory: RSS once loaded and warm, the peak since start (load included), and the peak during
  the waves (`VmHWM`, reset before each wave; the prefix cache fills towards its 512 MiB),
  with the prefix cache's KV at the end of the wave that set the peak.
Targets (issue 28): single-stream decode and 16 streams ≥ 2× the fp32 engine's; prefill no
slower than fp32; cached-prefix TTFT within 10%; RSS loaded, the peak while loading and the
peak serving 16 streams ≤ 0.6× the baseline's (the last also less the prefix cache's KV, a
budget both engines fill alike).
Everything printed is also written to `<out>/results-<threads>t.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tee import Tee

if TYPE_CHECKING:  # imported where used: `--as-engine` may run over another source tree
    from infercache.engine.engine import Engine

SRC = Path(__file__).resolve().parents[1] / "src"
TOPICS = [
    "lighthouses", "glaciers", "honeybees", "volcanoes", "coral reefs", "comets", "deserts",
    "rainforests", "tides", "owls", "caves", "rivers", "bridges", "windmills", "orchards", "kites",
]  # fmt: skip


@dataclass(frozen=True)
class Stream:
    started_s: float
    first_s: float
    last_s: float
    tokens: int


def rss_mib(field_name: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss() -> None:
    with contextlib.suppress(OSError):  # Linux only; elsewhere the peak is since start
        Path("/proc/self/clear_refs").write_text("5")


def chat_body(model: str, i: int, wave: int, new_tokens: int) -> dict[str, Any]:
    topic = TOPICS[i % len(TOPICS)]
    return {
        "model": model,
        "messages": [
            {"role": "user", "content": f"Wave {wave}, writer {i}: write a long, detailed essay "
             f"about {topic}, their history, how they work and why people love them."}
        ],
        "temperature": 0,
        "max_tokens": new_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }  # fmt: skip


async def one_stream(engine: Engine, request: dict[str, Any], tenant: str) -> Stream:
    started = time.perf_counter()
    first = last = None
    tokens = 0
    async for chunk in engine.achat_stream(request, tenant):
        now = time.perf_counter()
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            first = first if first is not None else now
            last = now
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    if first is None or last is None:
        raise RuntimeError("a stream produced no text")
    return Stream(started, first, last, tokens)


async def wave(engine: Engine, n: int, wave_id: int, new_tokens: int) -> list[Stream]:
    calls = [
        one_stream(engine, chat_body(engine.model_id, i, wave_id, new_tokens), f"w{wave_id}-s{i}")
        for i in range(n)
    ]
    streams = await asyncio.gather(*calls)
    assert all(s.tokens == new_tokens for s in streams)
    return list(streams)


def decode_rate(streams: list[Stream]) -> float:
    window = max(s.last_s for s in streams) - min(s.first_s for s in streams)
    return sum(s.tokens - 1 for s in streams) / window


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def one_token_ms(engine: Engine, ids: list[int], tenant: str) -> tuple[float, int]:
    """The time from the call to the end of a 1-token completion of `ids`, and the prompt
    tokens it reused."""
    body = {
        "model": engine.model_id,
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    cached = -1
    async for chunk in engine.atext_completion_stream(body, tenant):
        if chunk.get("usage"):
            cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    return (time.perf_counter() - started) * 1e3, cached


def random_ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 40_000) for _ in range(n)]


def as_engine(args: argparse.Namespace) -> None:
    """The subprocess side: one engine, one JSON command per line on stdin, one answer each."""
    import torch

    import infercache
    from infercache.engine.config import EngineConfig
    from infercache.engine.engine import Engine
    from infercache.settings import default_data_dir

    torch.set_num_threads(args.threads)
    weights = {"weights": args.engine_weights} if args.engine_weights else {}
    config = EngineConfig(
        data_dir=default_data_dir(os.environ),
        threads=args.threads,
        max_context_tokens=2048,
        max_batch=args.max_batch,
        **weights,
    )
    with Engine(config) as engine:
        asyncio.run(wave(engine, 1, -1, 4))  # warm-up: first touch of weights and kernels
        models = engine.models()[0]
        ready = {"source": str(Path(infercache.__file__).parent), "version": models["version"],
                 "weights": models.get("weights", "fp32"), "rss_mib": rss_mib("VmRSS"),
                 "load_peak_mib": rss_mib("VmHWM")}  # fmt: skip
        print(json.dumps(ready), flush=True)
        for line in sys.stdin:
            print(json.dumps(_command(engine, json.loads(line), args.new_tokens)), flush=True)


def _command(engine: Engine, command: dict[str, Any], new_tokens: int) -> dict[str, Any]:
    r = command["round"]
    if command["op"] == "wave":
        reset_peak_rss()
        streams = asyncio.run(wave(engine, command["n"], r, new_tokens))
        ttfts = [(s.first_s - s.started_s) * 1e3 for s in streams]
        cache = engine.stats()["prefix_cache"] or {}
        return {"rate": decode_rate(streams), "ttfts": ttfts, "peak_mib": rss_mib("VmHWM"),
                "cached_kv_mib": cache.get("total_bytes", 0) / 2**20}  # fmt: skip
    if command["op"] == "prefill":
        ms, _ = asyncio.run(one_token_ms(engine, random_ids(512, 10_000 + r), f"p{r}"))
        return {"ms": ms}
    prefix = random_ids(1024, 20_000 + r)
    asyncio.run(one_token_ms(engine, prefix + random_ids(16, 30_000 + r), f"c{r}"))
    ms, cached = asyncio.run(one_token_ms(engine, prefix + random_ids(16, 40_000 + r), f"c{r}"))
    assert cached >= 1024, f"the prefix was not reused: {cached} cached tokens"
    return {"ms": ms}


@dataclass
class Variant:
    """One engine in its subprocess, and what it measured."""

    label: str
    process: subprocess.Popen[str]
    ready: dict[str, Any]
    rates: dict[int, list[float]] = field(default_factory=dict)
    ttfts: dict[int, list[float]] = field(default_factory=dict)
    peaks: dict[int, float] = field(default_factory=dict)
    cached_kv: dict[int, float] = field(default_factory=dict)  # prefix cache MiB at the peak
    prefill_ms: list[float] = field(default_factory=list)
    cached_ms: list[float] = field(default_factory=list)

    @classmethod
    def start(cls, label: str, src: Path, weights: str | None, args: argparse.Namespace) -> Variant:
        command = [sys.executable, __file__, "--as-engine", "--threads", str(args.threads),
                   "--new-tokens", str(args.new_tokens),
                   "--max-batch", str(args.max_batch)]  # fmt: skip
        if weights:
            command += ["--engine-weights", weights]
        env = {**os.environ, "PYTHONPATH": str(src.resolve())}
        process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        assert process.stdout is not None
        return cls(label, process, json.loads(process.stdout.readline()))

    def ask(self, **command: Any) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def run_round(self, r: int, counts: list[int]) -> None:
        for n in counts:
            got = self.ask(op="wave", n=n, round=r)
            self.rates.setdefault(n, []).append(got["rate"])
            self.ttfts.setdefault(n, []).extend(got["ttfts"])
            if got["peak_mib"] >= self.peaks.get(n, 0.0):
                self.peaks[n], self.cached_kv[n] = got["peak_mib"], got["cached_kv_mib"]
        self.prefill_ms.append(self.ask(op="prefill", round=r)["ms"])
        self.cached_ms.append(self.ask(op="cached", round=r)["ms"])

    def best(self, n: int) -> float:
        return max(self.rates[n])

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(120)


def report(variants: list[Variant], counts: list[int], chosen: str | None) -> None:
    for v in variants:
        print(f"\n### {v.label} ({v.ready['version']}, from {v.ready['source']})\n")
        print(f"RSS loaded and warm {v.ready['rss_mib']:,.0f} MiB; peak while loading "
              f"{v.ready['load_peak_mib']:,.0f} MiB; prefill 512 tokens "
              f"{min(v.prefill_ms):.0f} ms; 1,024 cached + 16 new: "
              f"{min(v.cached_ms):.1f} ms\n")  # fmt: skip
        print("| streams | decode tok/s (aggregate) | per stream | × 1 stream | TTFT p50 ms | "
              "TTFT p99 ms | peak RSS MiB | of it, prefix cache KV MiB |")  # fmt: skip
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n in counts:
            best, one = v.best(n), v.best(counts[0])
            print(
                f"| {n} | {best:.1f} | {best / n:.1f} | {best / one:.2f}× "
                f"| {statistics.median(v.ttfts[n]):.0f} | {percentile(v.ttfts[n], 0.99):.0f} "
                f"| {v.peaks[n]:,.0f} | {v.cached_kv[n]:,.0f} |"
            )
    by_label = {v.label: v for v in variants}
    if chosen is None or chosen not in by_label:
        return
    new = by_label[chosen]
    print("\n## Targets")
    for base in (v for v in variants if v is not new and v.ready["weights"] == "fp32"):
        print(f"\n{new.label} against {base.label}:")
        for n in (1, max(counts)):
            if n in new.rates and n in base.rates:
                print(f"- {n} stream(s): {new.best(n):.1f} / {base.best(n):.1f} tok/s = "
                      f"{new.best(n) / base.best(n):.2f}× (target ≥ 2×)")  # fmt: skip
        print(f"- prefill 512 tokens: {min(new.prefill_ms):.0f} / {min(base.prefill_ms):.0f} ms = "
              f"{min(new.prefill_ms) / min(base.prefill_ms):.2f}× (target ≤ 1×)")  # fmt: skip
        print(f"- 1,024 cached + 16: {min(new.cached_ms):.1f} / {min(base.cached_ms):.1f} ms = "
              f"{min(new.cached_ms) / min(base.cached_ms):.2f}× (target ≤ 1.10×)")  # fmt: skip
        print(f"- RSS loaded: {new.ready['rss_mib']:,.0f} / {base.ready['rss_mib']:,.0f} MiB = "
              f"{new.ready['rss_mib'] / base.ready['rss_mib']:.2f}× (target ≤ 0.6×)")  # fmt: skip
        load_new, load_base = new.ready["load_peak_mib"], base.ready["load_peak_mib"]
        print(f"- peak while loading: {load_new:,.0f} / {load_base:,.0f} MiB = "
              f"{load_new / load_base:.2f}× (target ≤ 0.6×)")  # fmt: skip
        n = max(counts)
        rest_new, rest_base = new.peaks[n] - new.cached_kv[n], base.peaks[n] - base.cached_kv[n]
        print(f"- peak serving {n} streams: {new.peaks[n]:,.0f} / {base.peaks[n]:,.0f} MiB = "
              f"{new.peaks[n] / base.peaks[n]:.2f}×; less the prefix cache's KV: "
              f"{rest_new:,.0f} / {rest_base:,.0f} MiB = {rest_new / rest_base:.2f}×")  # fmt: skip


def run(args: argparse.Namespace) -> None:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    counts = [int(n) for n in args.streams.split(",")]
    args.max_batch = max(counts)
    print(
        f"# bench/batching.py: {platform.processor() or platform.machine()}, {os.cpu_count()} "
        f"cores, torch {torch.__version__}, {args.threads} threads, {args.new_tokens}-token "
        f"streams, max_batch {args.max_batch}, best of {args.rounds} rounds; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    formats = args.weights.split(",")
    variants = [Variant.start(w, SRC, w, args) for w in formats]
    if args.baseline_src:
        variants.append(Variant.start("baseline", args.baseline_src, None, args))
    try:
        for r in range(args.rounds):
            for v in variants:
                v.run_round(r, counts)
            print(f"round {r + 1}: load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
    finally:
        for v in variants:
            v.close()
    chosen = next((w for w in formats if w != "fp32"), None)
    report(variants, counts, chosen)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", default="fp32,fp16", help="this tree's formats to run")
    parser.add_argument("--baseline-src", type=Path, help="another tree's src: its engine too")
    parser.add_argument("--streams", default="1,4,8,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--as-engine", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--max-batch", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument("--engine-weights", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "batching")
    args = parser.parse_args()
    if args.as_engine:
        as_engine(args)
        return
    tee = Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"results-{args.threads}t.md").write_text(tee.getvalue())


if __name__ == "__main__":
    main()
