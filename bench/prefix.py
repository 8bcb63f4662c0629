"""Prefix reuse in the built-in engine: time to first token, overhead, decode speed, memory.

    .venv/bin/python bench/prefix.py [--trials 5] [--threads N] [--dtype float32]
        [--stat min|median] [--sections ...] [--out bench/out/prefix]

One process, one set of weights (the packaged SmolLM2-135M-Instruct), the same torch threads
for every variant. Every variant is run once per trial, interleaved, and the best (minimum) of
the trials is kept (`--stat median` for medians): on a shared machine a neighbour's burst only
ever adds time, so the minimum is the figure least disturbed by it.

- TTFT (time to first token) of a prompt = shared prefix (256, 1024, 2048 tokens) + a fresh
  suffix (16, 64 tokens), measured by the engine's own accounting (lookup + KV gather +
  prefill + first token):
  `reuse`: the prefix is cached (warmed once); `no cache`: the prefix cache is off;
  `HF generate`: transformers' `generate(max_new_tokens=1)` on the same ids, no reuse;
  `floor`: the suffix alone, nothing before it (what reuse can at best approach).
- Overhead when nothing is shared: unique 1024-token prompts, cache on vs off: TTFT, and a
  whole 16-token request (which also pays for storing the KV in the tree).
- Decode tokens/s after a 256-token prompt, 64 new tokens, ours vs HF `generate`
  (HF's decode time = generate(64) − generate(1)).
- KV bytes per token, and peak RSS while 12 unique 1024-token prompts stream through a 32 MiB
  KV budget (measured first, before the HF model is loaded).
- Eviction cost against tree size (the radix tree alone, no model): trees of 1k, 10k and 100k
  leaves filled to the budget, then inserts that each must evict: µs per insert. Flat in the
  tree's size, since the evictable leaves are kept in a heap rather than found by a walk.
- Under load: TTFT of a 1024-token cached prefix + 16 new tokens against the same prompt with a
  prefix never seen (a full prefill, cut into the engine's 256-token chunks), while `--streams`
  other sequences keep decoding in the same batch (the engine's scheduler, one step at a time).
- KV tiers below RAM (`restart`, `shared`, `tiers-memory`, not run by default): warm restart
  from the disk tier in a new process, two replicas sharing one Redis, memory with a disk tier;
  bench/prefix_tiers.py describes them.
The single-request sections run the runner with a step budget above the longest prompt, so a
prompt is prefilled in one forward as before continuous batching; the load section uses the
engine's default budget.
Everything printed is also written to `<out>/results-<threads>t-<dtype>.md`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from prefix_tiers import (
    memory_child,
    restart_child,
    restart_section,
    shared_section,
    tiers_memory_section,
)
from tee import Tee

from infercache.clock import SystemClock
from infercache.engine.config import BatchLimits, default_data_dir
from infercache.engine.model import LlamaModel
from infercache.engine.prefix_cache import PrefixCache
from infercache.engine.radix import RadixTree
from infercache.engine.runner import Runner
from infercache.engine.sampling import SamplingParams
from infercache.engine.sequence import GenerationRequest
from infercache.engine.tokenizer import ChatTokenizer
from infercache.engine.weights import load_checkpoint, resolve_model

PREFIXES = (256, 1024, 2048)
SUFFIXES = (16, 64)
CONTEXT = 4096
TEXT = (
    "Section {i}. The quarterly report covers revenue, costs and the outlook for each region. "
    "Sales in the north grew while the south held steady; logistics costs fell after the new "
    "warehouse opened, and the support team resolved most tickets within a day. "
)


class Bench:
    def __init__(self, threads: int, dtype: torch.dtype, trials: int, stat: str) -> None:
        torch.set_num_threads(threads)
        self.trials = trials
        self.pick = STATS[stat]
        resolved = resolve_model(None, default_data_dir(os.environ))
        self.directory = resolved.directory
        self.version = resolved.version
        ck = load_checkpoint(resolved.directory)
        self.model = LlamaModel(ck.spec, ck.tensors, dtype=dtype, max_positions=CONTEXT)
        self.tokenizer = ChatTokenizer(ck.tokenizer, ck.eos_token_ids)
        self.dtype = dtype
        self.hf: Any = None
        corpus = "".join(TEXT.format(i=i) for i in range(400))
        self.corpus_ids = self.tokenizer.encode(corpus)
        self.calls = 0
        self.rng = torch.Generator().manual_seed(0)

    def interleaved(
        self, variants: dict[str, Callable[[], float]], scale: int = 1
    ) -> dict[str, float]:
        """Each variant once per trial, in turn; the chosen statistic of each."""
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(self.trials * scale):
            for name, fn in variants.items():
                samples[name].append(fn())
        return {name: self.pick(values) for name, values in samples.items()}

    def runner(
        self, *, cache: bool, max_kv_bytes: int = 1 << 30, max_step_tokens: int = CONTEXT
    ) -> Runner:
        prefix = PrefixCache(self.model.kv_shape, max_kv_bytes=max_kv_bytes) if cache else None
        return Runner(
            self.model,
            self.tokenizer,
            prefix_cache=prefix,
            clock=SystemClock(),
            max_context_tokens=CONTEXT,
            limits=BatchLimits(max_step_tokens=max_step_tokens),
        )

    def tokens(self, n: int, offset: int) -> tuple[int, ...]:
        """n real-text tokens; different offsets give different sequences."""
        start = (offset * 997) % (len(self.corpus_ids) - n)
        return tuple(self.corpus_ids[start : start + n])

    def fresh(self, n: int) -> tuple[int, ...]:
        """n tokens never seen before: a random first token, so no cached branch (not even a
        previous suffix after the same prefix) can extend into them."""
        self.calls += 1
        first = int(torch.randint(1000, 40_000, (1,), generator=self.rng))
        return (first, *self.tokens(n - 1, 10_000 + self.calls))

    def ttft_s(self, runner: Runner, prompt: tuple[int, ...], *, reused: int = 0) -> float:
        """Time to first token, checking the tokens reused are exactly `reused`."""
        request = GenerationRequest(prompt, SamplingParams(max_tokens=1, temperature=0))
        stats = runner.generate(request).stats
        assert stats.cached_tokens == reused, (stats.cached_tokens, reused)
        return stats.ttft_s

    def total_s(self, runner: Runner, prompt: tuple[int, ...], max_tokens: int) -> float:
        started = time.perf_counter()
        runner.generate(GenerationRequest(prompt, SamplingParams(max_tokens, temperature=0)))
        return time.perf_counter() - started

    def hf_generate_s(self, prompt: tuple[int, ...], new_tokens: int) -> float:
        if self.hf is None:
            from transformers import LlamaForCausalLM

            self.hf = LlamaForCausalLM.from_pretrained(
                self.directory, dtype=self.dtype, local_files_only=True
            ).eval()
        ids = torch.tensor([prompt])
        started = time.perf_counter()
        with torch.inference_mode():
            self.hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
            )
        return time.perf_counter() - started


STATS: dict[str, Callable[[list[float]], float]] = {"min": min, "median": statistics.median}


def rss_mib(field: str) -> float:
    """`VmRSS` (now) or `VmHWM` (peak since the last `reset_peak_rss`) of this process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux: VmHWM := VmRSS


def memory_section(b: Bench) -> None:
    budget = 32 * 2**20
    before = rss_mib("VmRSS")
    reset_peak_rss()
    runner = b.runner(cache=True, max_kv_bytes=budget)
    cache = runner.prefix_cache
    assert cache is not None
    evicted = 0
    worst = 0
    for _ in range(12):
        request = GenerationRequest(b.fresh(1024), SamplingParams(max_tokens=4, temperature=0))
        evicted += runner.generate(request).stats.evicted_tokens
        worst = max(worst, cache.stats().total_bytes)
    print("\n## KV memory")
    print(f"KV bytes per token ({b.model.dtype}): {b.model.kv_shape.bytes_per_token:,}")
    print(
        f"max_kv_bytes {budget / 2**20:.0f} MiB: cached KV peaked at {worst / 2**20:.1f} MiB "
        f"(never above the budget), {evicted:,} tokens evicted over 12 unique 1024-token prompts"
    )
    print(
        f"RSS: {before:.0f} MiB after loading the model; peak {rss_mib('VmHWM'):.0f} MiB during "
        f"the workload, which first touches the memory-mapped weights (~260 MiB of page cache), "
        f"the request workspace and the KV pool"
    )


def variants(
    b: Bench, warm: Runner, cold: Runner, prefix: tuple[int, ...], s: int
) -> dict[str, Callable[[], float]]:
    return {
        "reuse": lambda: b.ttft_s(warm, prefix + b.fresh(s), reused=len(prefix)),
        "cold": lambda: b.ttft_s(cold, prefix + b.fresh(s)),
        "hf": lambda: b.hf_generate_s(prefix + b.fresh(s), 1),
        "floor": lambda: b.ttft_s(cold, b.fresh(s)),
    }


def ttft_section(b: Bench) -> dict[tuple[int, int], dict[str, float]]:
    warm, cold = b.runner(cache=True), b.runner(cache=False)
    results: dict[tuple[int, int], dict[str, float]] = {}
    print("\n## Time to first token (ms)")
    print(
        "| prefix | suffix | reuse | no cache | HF generate | floor "
        "| no cache / reuse | reuse / floor |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for p in PREFIXES:
        prefix = b.tokens(p, p)
        b.ttft_s(warm, prefix + b.fresh(16))  # cache the prefix once
        for s in SUFFIXES:
            r = b.interleaved(variants(b, warm, cold, prefix, s))
            results[(p, s)] = r
            print(
                f"| {p} | {s} | {r['reuse'] * 1e3:.1f} | {r['cold'] * 1e3:.1f} | "
                f"{r['hf'] * 1e3:.1f} | {r['floor'] * 1e3:.1f} | "
                f"{r['cold'] / r['reuse']:.1f}× | {r['reuse'] / r['floor']:.2f}× |"
            )
    return results


def overhead_section(b: Bench) -> dict[str, float]:
    """A/B timing of cache on vs off, plus the prefix cache's own cost measured directly
    (lookup + gather before prefill, storing the KV and evicting after), which is not
    drowned by the machine's noise the way a difference of two 2-second timings is."""
    on, off = b.runner(cache=True, max_kv_bytes=256 * 2**20), b.runner(cache=False)
    own: list[float] = []

    def request_on() -> float:
        started = time.perf_counter()
        request = GenerationRequest(b.fresh(1024), SamplingParams(16, temperature=0))
        stats = on.generate(request).stats
        total = time.perf_counter() - started
        own.append((stats.lookup_s + stats.store_s) / total)
        return total

    same: list[tuple[int, ...]] = []

    def ttft_off() -> float:  # runs first in each trial, on a prompt new to both runners
        same[:] = [b.fresh(1024)]
        return b.ttft_s(off, same[0])

    r = b.interleaved(
        {
            "ttft_off": ttft_off,
            "ttft_on": lambda: b.ttft_s(on, same[0]),
            "req_on": request_on,
            "req_off": lambda: b.total_s(off, b.fresh(1024), 16),
        },
        scale=2,
    )
    r["own"] = statistics.median(own)
    print("\n## Overhead when nothing is shared (unique 1024-token prompts)")
    print(
        f"TTFT: cache on {r['ttft_on'] * 1e3:.1f} ms, off {r['ttft_off'] * 1e3:.1f} ms "
        f"({(r['ttft_on'] / r['ttft_off'] - 1) * 100:+.1f}%)"
    )
    print(
        f"16-token request incl. storing the KV: on {r['req_on'] * 1e3:.1f} ms, "
        f"off {r['req_off'] * 1e3:.1f} ms ({(r['req_on'] / r['req_off'] - 1) * 100:+.1f}%)"
    )
    print(
        f"prefix cache's own time (lookup + gather + store + evict), median share of the "
        f"16-token request: {r['own'] * 100:.2f}%"
    )
    return r


def decode_section(b: Bench) -> tuple[float, float]:
    runner = b.runner(cache=False)
    new = 64

    def ours() -> float:
        request = GenerationRequest(b.fresh(256), SamplingParams(max_tokens=new, temperature=0))
        stats = runner.generate(request).stats
        return (stats.completion_tokens - 1) / stats.decode_s

    def hf() -> float:
        prompt = b.fresh(256)
        return (new - 1) / (b.hf_generate_s(prompt, new) - b.hf_generate_s(prompt, 1))

    r = b.interleaved({"ours": ours, "hf": hf})
    print("\n## Decode (256-token prompt, 64 new tokens)")
    print(
        f"ours {r['ours']:.1f} tok/s, HF generate {r['hf']:.1f} tok/s ({r['ours'] / r['hf']:.2f}×)"
    )
    return r["ours"], r["hf"]


class _Run:
    """A radix payload standing for `n` tokens at one byte each."""

    __slots__ = ("n",)

    def __init__(self, n: int) -> None:
        self.n = n

    @property
    def nbytes(self) -> int:
        return self.n

    def split(self, at_tokens: int) -> tuple[_Run, _Run]:
        return _Run(at_tokens), _Run(self.n - at_tokens)


def _put(tree: RadixTree[_Run], first: int) -> int:
    """Cache 4 new tokens as the engine does (match, lock, evict, insert, unlock)."""
    m = tree.match_prefix("ns", (first, 1, 2, 3))
    tree.lock(m.node)
    evicted = len(tree.evict(4).payloads)
    tree.insert(m.node, (first, 1, 2, 3), _Run(4))
    tree.unlock(m.node)
    return evicted


def radix_section() -> dict[int, float]:
    """µs per insert that must evict, in full trees of 1k, 10k and 100k 4-token leaves."""
    rng = random.Random(0)
    results: dict[int, float] = {}
    print("\n## Eviction cost against tree size (radix tree alone)")
    print("| leaves | µs per insert that evicts |")
    print("|---:|---:|")
    for leaves in (1_000, 10_000, 100_000):
        tree: RadixTree[_Run] = RadixTree(max_kv_bytes=4 * leaves)
        for _ in range(leaves):
            _put(tree, rng.randrange(10**12))
        started = time.perf_counter()
        evicted = sum(_put(tree, rng.randrange(10**12)) for _ in range(2000))
        results[leaves] = (time.perf_counter() - started) / 2000 * 1e6
        assert evicted == 2000, evicted
        print(f"| {leaves:,} | {results[leaves]:.1f} |")
    return results


def load_section(b: Bench, streams: int) -> dict[str, float]:
    """TTFT of 1024 cached + 16 new tokens vs a full prefill, while `streams` others decode."""
    runner = b.runner(cache=True, max_step_tokens=256)
    prefix = b.tokens(1024, 1024)
    b.ttft_s(runner, prefix + b.fresh(16))  # cache the prefix once
    others = [  # long answers: they decode through every probe below
        runner.submit(GenerationRequest(b.fresh(64), SamplingParams(3000, temperature=0)))
        for _ in range(streams)
    ]
    while any(s.pending is None for s in others):
        runner.step()

    def probe(prompt: tuple[int, ...], reused: int) -> float:
        seq = runner.submit(GenerationRequest(prompt, SamplingParams(1, temperature=0)))
        decoding = 0
        while seq.first_token_s is None:
            decoding = max(decoding, runner.step().decode_tokens)
        assert seq.reused_tokens == reused, (seq.reused_tokens, reused)
        assert decoding >= streams, "the other streams were not decoding"
        return seq.first_token_s - seq.arrived_s

    r = b.interleaved(
        {
            "reuse": lambda: probe(prefix + b.fresh(16), 1024),
            "full": lambda: probe(b.fresh(1024 + 16), 0),
        }
    )
    print(f"\n## Prefix reuse under load ({streams} other streams decoding in the same batch)")
    print(
        f"1024 cached + 16 new tokens: TTFT {r['reuse'] * 1e3:.1f} ms; the same prompt with an "
        f"uncached prefix (full prefill, in 256-token chunks): {r['full'] * 1e3:.1f} ms "
        f"({r['full'] / r['reuse']:.1f}×)"
    )
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--stat", choices=sorted(STATS), default="min")
    parser.add_argument(
        "--sections",
        default="memory,ttft,overhead,decode,radix,load",
        help="comma-separated subset",
    )
    parser.add_argument("--streams", type=int, default=7, help="decoding streams under load")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "prefix")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # a restarted engine (prefix_tiers)
    parser.add_argument("--child-dir", help=argparse.SUPPRESS)
    parser.add_argument("--child-suffix", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
        b = Bench(args.threads, dtype, args.trials, args.stat)
        if args.child == "restart":
            restart_child(b, b.version, args)
        else:
            memory_child(b, b.version, args, rss_mib)
        return
    tee = Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"results-{args.threads}t-{args.dtype}.md").write_text(tee.getvalue())


def run(args: argparse.Namespace) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    b = Bench(args.threads, dtype, args.trials, args.stat)
    print(
        f"# bench/prefix.py: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, {args.threads} threads, "
        f"{args.dtype}, {args.stat} of {args.trials} trials; load average {os.getloadavg()[0]:.1f}"
    )
    sections = set(args.sections.split(","))
    targets = []
    if "memory" in sections:
        memory_section(b)
    if "ttft" in sections:
        r = ttft_section(b)[(1024, 16)]
        targets.append(f"1024+16 reuse / floor = {r['reuse'] / r['floor']:.2f}× (target ≤ 1.5×)")
        targets.append(f"1024+16 no cache / reuse = {r['cold'] / r['reuse']:.1f}× (target ≥ 5×)")
    if "overhead" in sections:
        o = overhead_section(b)
        added = (o["ttft_on"] / o["ttft_off"] - 1) * 100
        targets.append(
            f"no-sharing overhead = {added:+.1f}% TTFT A/B, {o['own'] * 100:.2f}% measured "
            "directly (target ≤ 3%)"
        )
    if "decode" in sections:
        ours, hf = decode_section(b)
        targets.append(f"decode ours / HF = {ours / hf:.2f}× (target ≥ 1×)")
    if "radix" in sections:
        costs = radix_section()
        targets.append(
            f"eviction: {costs[100_000] / costs[1_000]:.1f}× the cost at 100k leaves as at 1k "
            "(flat: no walk of the tree)"
        )
    if "load" in sections:
        loaded = load_section(b, args.streams)
        targets.append(
            f"under load, 1024+16 full prefill / reuse = {loaded['full'] / loaded['reuse']:.1f}× "
            "(target ≥ 5×)"
        )
    if "restart" in sections:
        r = restart_section(b, b.version, args)
        targets.append(
            f"restart: 1024+16 from disk in a new process / in RAM = "
            f"{r['restart'] / r['ram']:.2f}× (target ≤ 2×); full prefill / restart = "
            f"{r['full'] / r['restart']:.1f}× (target ≥ 10×)"
        )
    if "shared" in sections:
        r = shared_section(b, b.version)
        targets.append(
            f"shared: 1024+16 on replica B from Redis / in B's RAM = "
            f"{r['shared'] / r['ram']:.2f}× (target ≤ 3×)"
        )
    if "tiers-memory" in sections:
        peaks = tiers_memory_section(b, args)
        added = peaks["with a disk tier"] - peaks["without tiers"]
        targets.append(f"disk tier: peak RSS {added:+.0f} MiB against none (target: one block)")
    print("\n## Targets")
    print("\n".join(targets))
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
