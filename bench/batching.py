"""Continuous batching in the built-in engine: aggregate decode rate, TTFT and memory with 1, 4,
8 and 16 concurrent streams.

    .venv/bin/python bench/batching.py [--streams 1,4,8,16] [--rounds 3] [--new-tokens 64]
        [--threads N] [--before-src DIR] [--out bench/out/batching]

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
Baselines for the single stream, once a round beside the waves:
- a plain loop of one-token forwards over unpacked weights (the model's decode with no engine
  around it: no scheduler, sampling, detokenizer or streaming), in a subprocess: run in this
  process, its thread's OpenMP team would sit beside the engine worker's, and with more OpenMP
  threads than cores libgomp stops spin-waiting and both slow down by a third (engine/worker.py);
- with `--before-src DIR`, the engine as it was before continuous batching, whole: its `src`
  folder (`git archive 2b9118b~1 src | tar -x -C DIR`) imported in a subprocess that loads the
  same model and streams one request a round, when told, through its own `achat_stream` (that
  engine knows no `ignore_eos`, so its stream may end early at the end-of-sequence token; its
  rate is over the tokens it did produce).
Targets: 8 streams ≥ 4× the engine's single-stream rate measured in the same run; the engine's
single stream no slower than before batching.
Everything printed is also written to `<out>/results-<threads>t.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import torch

if TYPE_CHECKING:  # imported where used: `--as-before` runs this file over an older tree
    from infercache.engine.engine import Engine

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


async def wave(
    engine: Engine, n: int, wave_id: int, new_tokens: int, *, exact: bool = True
) -> list[Stream]:
    calls = [
        one_stream(engine, body(engine, i, wave_id, new_tokens), f"w{wave_id}-s{i}")
        for i in range(n)
    ]
    streams = await asyncio.gather(*calls)
    assert all(s.tokens == new_tokens or not exact for s in streams)
    return list(streams)


def decode_rate(streams: list[Stream]) -> float:
    window = max(s.last_s for s in streams) - min(s.first_s for s in streams)
    return sum(s.tokens - 1 for s in streams) / window


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class DecodeLoop:
    """The model's single-stream decode alone (run by `--as-decode-loop`): one token a forward,
    plain weights, on the process's main thread."""

    def __init__(self, directory: Path) -> None:
        from infercache.engine.model import LlamaModel
        from infercache.engine.weights import load_checkpoint

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


class Subprocess:
    """A baseline in a subprocess: this file run with `mode` (`--as-before` over the source
    tree `src`, or `--as-decode-loop` over this one), one single-stream measurement each time
    `rate` is called."""

    def __init__(self, mode: str, src: Path | None, args: argparse.Namespace) -> None:
        command = [sys.executable, __file__, mode, "--threads", str(args.threads),
                   "--new-tokens", str(args.new_tokens)]  # fmt: skip
        env = dict(os.environ)
        if src is not None:
            env["PYTHONPATH"] = str(src.resolve())
        self._process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.source = self._ask("ready")["source"]

    def _ask(self, line: str) -> dict[str, Any]:
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.write(line + "\n")
        self._process.stdin.flush()
        answer: dict[str, Any] = json.loads(self._process.stdout.readline())
        return answer

    def rate(self, round_id: int) -> dict[str, Any]:
        return self._ask(str(round_id))

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(60)


def as_before(args: argparse.Namespace) -> None:
    """The subprocess side of `Before`: the older tree's engine, one wave per line on stdin."""
    import infercache
    from infercache.engine.config import EngineConfig
    from infercache.engine.engine import Engine
    from infercache.settings import default_data_dir  # where the older tree kept it

    torch.set_num_threads(args.threads)
    config = EngineConfig(
        data_dir=default_data_dir(os.environ), threads=args.threads, max_context_tokens=1024
    )
    with Engine(config) as engine:
        asyncio.run(wave(engine, 1, -1, 4, exact=False))
        for line in sys.stdin:
            if line.strip() == "ready":
                print(json.dumps({"source": str(Path(infercache.__file__).parent)}), flush=True)
                continue
            [stream] = asyncio.run(wave(engine, 1, int(line), args.new_tokens, exact=False))
            ttft_ms = (stream.first_s - stream.started_s) * 1e3
            answer = {"rate": decode_rate([stream]), "tokens": stream.tokens, "ttft_ms": ttft_ms}
            print(json.dumps(answer), flush=True)


def as_decode_loop(args: argparse.Namespace) -> None:
    """The subprocess side of the decode-loop baseline: one loop per line on stdin."""
    import infercache
    from infercache.engine.config import default_data_dir
    from infercache.engine.weights import resolve_model

    torch.set_num_threads(args.threads)
    loop = DecodeLoop(resolve_model(None, default_data_dir(os.environ)).directory)
    loop.rate(4, -1)  # warm-up
    for line in sys.stdin:
        if line.strip() == "ready":
            print(json.dumps({"source": str(Path(infercache.__file__).parent)}), flush=True)
            continue
        print(json.dumps({"rate": loop.rate(args.new_tokens, int(line))}), flush=True)


def run(args: argparse.Namespace) -> None:
    from infercache.engine.config import EngineConfig, default_data_dir
    from infercache.engine.engine import Engine

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
    decode_loop = Subprocess("--as-decode-loop", None, args)
    before = Subprocess("--as-before", args.before_src, args) if args.before_src else None
    if before is not None:
        print(f"before batching: the engine imported from {before.source}")
    config = EngineConfig(
        data_dir=data_dir, max_batch=max(counts), threads=args.threads, max_context_tokens=1024
    )
    rates: dict[int, list[float]] = {n: [] for n in counts}
    ttfts: dict[int, list[float]] = {n: [] for n in counts}
    peaks: dict[int, float] = dict.fromkeys(counts, 0.0)
    base: list[float] = []
    befores: list[dict[str, Any]] = []
    with Engine(config) as engine:
        asyncio.run(wave(engine, 1, -1, 4))  # warm-up: first-touch of weights and kernels
        print(f"RSS with the engine loaded and warm: {rss_mib('VmRSS'):.0f} MiB")
        for r in range(args.rounds):  # rounds interleave every variant: drift hits them alike
            base.append(decode_loop.rate(r)["rate"])
            if before is not None:
                befores.append(before.rate(r))
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
    decode_loop.close()
    print(f"baseline: the model's decode loop alone (subprocess): {max(base):.1f} tok/s")
    if before is not None:
        before.close()
        best_before = max(b["rate"] for b in befores)
        print(
            f"baseline: the engine before batching (subprocess), 1 stream: {best_before:.1f} tok/s"
            f" (tokens a stream: {sorted({b['tokens'] for b in befores})}; TTFT p50 "
            f"{statistics.median(b['ttft_ms'] for b in befores):.0f} ms)"
        )
    print("\n## Targets")
    if 8 in best and 1 in best:
        print(f"8 streams / 1 stream = {best[8] / best[1]:.2f}× (target ≥ 4×)")
    if 1 in best:
        print(f"1 stream / the model's decode loop alone = {best[1] / max(base):.2f}×")
        if before is not None:
            print(f"1 stream / the engine before batching = {best[1] / best_before:.2f}× (≥ 1×)")
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
    parser.add_argument("--before-src", type=Path, help="the pre-batching engine's src folder")
    parser.add_argument("--as-before", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--as-decode-loop", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "batching")
    args = parser.parse_args()
    if args.as_before:
        as_before(args)
        return
    if args.as_decode_loop:
        as_decode_loop(args)
        return
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"results-{args.threads}t.md").write_text(tee.getvalue())


if __name__ == "__main__":
    main()
