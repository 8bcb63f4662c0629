"""Continuous batching in the built-in engine: aggregate decode rate, TTFT and memory with 1, 4,
8 and 16 concurrent streams.

    .venv/bin/python bench/batching.py [--streams 1,4,8,16] [--rounds 3] [--new-tokens 64]
        [--threads N] [--out bench/out/batching]

One process, the packaged SmolLM2-135M-Instruct (fp32), the real `Engine` (its worker thread,
scheduler, streaming bridge), driven through `achat_stream` from one asyncio loop. For each
concurrency N, a wave of N streams starts together, once a round; each stream is a distinct
~40-token prompt (its own tenant, so no stream reuses another's prefix) asking for exactly
`--new-tokens` greedy tokens (`ignore_eos`).

- aggregate decode tok/s: the wave's tokens after each stream's first, divided by the time from
  the first stream's first token to the last stream's last token (the best of `--rounds` is
  kept: on a shared machine a neighbour's burst only ever slows a wave down, and each round
  runs every variant in turn, so a slow spell hits them alike);
- TTFT p50/p99: from the call to the first content chunk, over every stream of every wave;
- peak RSS during the waves (`VmHWM`, reset before each wave).
Baseline, in the same process: today's single-stream decode before batching, a plain loop of
one-token forwards over unpacked weights (the path the engine took for every request), run once
a round beside the waves. Targets: 8 streams ≥ 4× the engine's single-stream rate measured in
the same run; the engine's single stream no slower than the baseline.
Everything printed is also written to `<out>/results-<threads>t.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from infercache.engine.config import EngineConfig, default_data_dir
from infercache.engine.engine import Engine
from infercache.engine.model import LlamaModel
from infercache.engine.weights import load_checkpoint, resolve_model

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


def rss_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss() -> None:
    with contextlib.suppress(OSError):  # Linux only; elsewhere the peak is since start
        Path("/proc/self/clear_refs").write_text("5")


def body(engine: Engine, i: int, wave: int, new_tokens: int) -> dict[str, Any]:
    topic = TOPICS[i % len(TOPICS)]
    return {
        "model": engine.model_id,
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
        one_stream(engine, body(engine, i, wave_id, new_tokens), f"w{wave_id}-s{i}")
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


class Baseline:
    """Today's single-stream decode before batching: one token a forward, plain weights."""

    def __init__(self, directory: Path) -> None:
        ck = load_checkpoint(directory)
        self.model = LlamaModel(ck.spec, ck.tensors, max_positions=1024, packed=False)

    def rate(self, new_tokens: int, seed: int) -> float:
        ws = self.model.new_workspace(512)
        prompt = torch.randint(1000, 40_000, (40,), generator=torch.Generator().manual_seed(seed))
        token = int(self.model.forward(prompt, ws, 0).argmax())
        started = time.perf_counter()
        for step in range(new_tokens - 1):
            token = int(self.model.forward(torch.tensor([token]), ws, 40 + step).argmax())
        return (new_tokens - 1) / (time.perf_counter() - started)


def run(args: argparse.Namespace) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    counts = [int(n) for n in args.streams.split(",")]
    print(
        f"# bench/batching.py: {platform.processor() or platform.machine()}, {os.cpu_count()} "
        f"cores, torch {torch.__version__}, {args.threads} threads, float32, "
        f"{args.new_tokens}-token streams, best of {args.rounds} rounds; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    torch.set_num_threads(args.threads)
    data_dir = default_data_dir(os.environ)
    baseline = Baseline(resolve_model(None, data_dir).directory)
    config = EngineConfig(
        data_dir=data_dir, max_batch=max(counts), threads=args.threads, max_context_tokens=1024
    )
    rates: dict[int, list[float]] = {n: [] for n in counts}
    ttfts: dict[int, list[float]] = {n: [] for n in counts}
    peaks: dict[int, float] = dict.fromkeys(counts, 0.0)
    base: list[float] = []
    with Engine(config) as engine:
        asyncio.run(wave(engine, 1, -1, 4))  # warm-up: first-touch of weights and kernels
        for r in range(args.rounds):  # rounds interleave every variant: drift hits them alike
            base.append(baseline.rate(args.new_tokens, r))
            for n in counts:
                reset_peak_rss()
                streams = asyncio.run(wave(engine, n, r, args.new_tokens))
                peaks[n] = max(peaks[n], rss_mib("VmHWM"))
                rates[n].append(decode_rate(streams))
                ttfts[n] += [(s.first_s - s.started_s) * 1e3 for s in streams]
            print(f"round {r + 1}: load average {os.getloadavg()[0]:.1f}", file=sys.stderr)
        batches = engine.metrics.snapshot()["strategies"]["prefix"]["histograms"]["batch_size"]
    best = {n: max(v) for n, v in rates.items()}
    print("\n| streams | decode tok/s (aggregate) | per stream | × 1 stream | TTFT p50 ms | "
          "TTFT p99 ms | peak RSS MiB |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in counts:
        print(
            f"| {n} | {best[n]:.1f} | {best[n] / n:.1f} | {best[n] / best[counts[0]]:.2f}× "
            f"| {statistics.median(ttfts[n]):.0f} | {percentile(ttfts[n], 0.99):.0f} "
            f"| {peaks[n]:.0f} |"
        )
    print(f"\nbatch sizes over all steps: {batches['count']} steps, "
          f"mean {batches['sum'] / batches['count']:.1f} sequences a step")  # fmt: skip
    print(f"baseline (today's unbatched decode loop, same process): {max(base):.1f} tok/s")
    print("\n## Targets")
    if 8 in best and 1 in best:
        print(f"8 streams / 1 stream = {best[8] / best[1]:.2f}× (target ≥ 4×)")
    if 1 in best:
        print(f"1 stream / baseline = {best[1] / max(base):.2f}× (target ≥ 1×)")
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


class _Tee(io.StringIO):
    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self._out = out

    def write(self, text: str) -> int:
        self._out.write(text)
        self._out.flush()
        return super().write(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="1,4,8,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "batching")
    args = parser.parse_args()
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"results-{args.threads}t.md").write_text(tee.getvalue())


if __name__ == "__main__":
    main()
