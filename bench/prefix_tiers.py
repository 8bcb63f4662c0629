"""KV tiers below RAM (engine/kv_tiers.py), timed: the `restart`, `shared` and `tiers-memory`
sections of bench/prefix.py (which imports this module; run them from there).

    .venv/bin/python bench/prefix.py --sections restart,shared,tiers-memory [--trials 5]

- `restart` (issue 27, acceptance 2): a 1,024-token prefix is cached by a runner whose prefix
  cache has a disk tier, which then stops. Each trial starts a new engine *process* on the same
  directory (`--child restart`: it loads the model, serves one unrelated 32-token request, as a
  restarted server would have, then prefix + 16 fresh tokens, whose 1,024 reused tokens must all
  come from disk) and, in this process, the same prompt on a runner holding the prefix in RAM
  (`ram`) and on a runner without a prefix cache (`full`: a full prefill). Interleaved; the best
  of the trials of each. Targets: restart ≤ 2× ram, and ≥ 10× faster than full.
- `shared` (acceptance 3): a redis-server on loopback, two runners (replicas A and B, each its
  own prefix cache) over one shared tier. Each trial: A computes a fresh 1,024-token prefix
  (a full prefill, written through to Redis), then B asks prefix + 16 (`shared`: loaded from
  Redis) and prefix + 16 other tokens (`ram`: now in B's RAM). Target: shared ≤ 3× ram.
- `tiers-memory` (acceptance 6): peak RSS while 12 unique 1,024-token prompts stream through a
  32 MiB RAM budget, then are all asked again (loaded back from disk), with a disk tier; against
  the same without one, measured first. The tiers' own memory is one staged block.
TTFT is the engine's own accounting (admission to first token: the RAM match and gather, the
tier load, prefill).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
from stores_servers import redis_server

from infercache.clock import SystemClock
from infercache.engine.config import BatchLimits, TierSettings
from infercache.engine.kv_tiers import TierBackends
from infercache.engine.prefix_cache import PrefixCache
from infercache.engine.runner import Runner
from infercache.engine.sampling import SamplingParams
from infercache.engine.sequence import GenerationRequest
from infercache.metrics import StrategyMetrics

CONTEXT = 4096
PREFIX_TOKENS = 1024


class Bench(Protocol):  # bench/prefix.py's Bench, as used here
    model: Any
    tokenizer: Any
    dtype: torch.dtype

    def interleaved(
        self, variants: dict[str, Callable[[], float]], scale: int = 1
    ) -> dict[str, float]: ...

    def runner(
        self, *, cache: bool, max_kv_bytes: int = ..., max_step_tokens: int = ...
    ) -> Runner: ...

    def tokens(self, n: int, offset: int) -> tuple[int, ...]: ...

    def fresh(self, n: int) -> tuple[int, ...]: ...

    def ttft_s(self, runner: Runner, prompt: tuple[int, ...], *, reused: int = 0) -> float: ...


def tiered_runner(
    b: Bench, settings: TierSettings, version: str, *, max_kv_bytes: int = 1 << 30
) -> tuple[Runner, TierBackends, StrategyMetrics]:
    events = StrategyMetrics("prefix")
    backends = TierBackends(settings, clock=SystemClock(), events=events)
    tiers = backends.for_model(version, b.model.kv_shape)
    cache = PrefixCache(b.model.kv_shape, max_kv_bytes=max_kv_bytes, tiers=tiers)
    runner = Runner(
        b.model,
        b.tokenizer,
        prefix_cache=cache,
        clock=SystemClock(),
        max_context_tokens=CONTEXT,
        limits=BatchLimits(max_step_tokens=CONTEXT),
    )
    return runner, backends, events


def first_token(runner: Runner, prompt: tuple[int, ...]) -> Any:
    request = GenerationRequest(prompt, SamplingParams(max_tokens=1, temperature=0))
    return runner.generate(request).stats


# -- restart ------------------------------------------------------------------------------


def restart_section(b: Bench, version: str, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="infercache-kv-") as tmp:
        settings = TierSettings(disk_bytes=1 << 30, disk_dir=Path(tmp) / "kv")
        prefix = b.tokens(PREFIX_TOKENS, PREFIX_TOKENS)
        writer, backends, events = tiered_runner(b, settings, version)
        b.ttft_s(writer, b.fresh(PREFIX_TOKENS + 16))  # first touches of the pool and files
        before = events.snapshot()["counters"]["kv_blocks_written:disk"]
        # Computed once, written through to disk: what that costs the request's end.
        store_s = first_token(writer, prefix + b.fresh(16)).store_s
        backends.close()
        written = events.snapshot()["counters"]["kv_blocks_written:disk"] - before
        warm, cold = b.runner(cache=True), b.runner(cache=False)
        b.ttft_s(warm, prefix + b.fresh(16))
        (Path(tmp) / "prefix.json").write_text(json.dumps(list(prefix)))

        def restarted() -> float:
            return child(args, "restart", tmp, b.fresh(16))["ttft_s"]

        r = b.interleaved(
            {
                "restart": restarted,
                "ram": lambda: b.ttft_s(warm, prefix + b.fresh(16), reused=PREFIX_TOKENS),
                "full": lambda: b.ttft_s(cold, prefix + b.fresh(16)),
            }
        )
    print("\n## Warm restart from the disk tier (1,024-token prefix + 16 new tokens)")
    print(
        f"{written} blocks of {settings.block_tokens} tokens written through at the end of the "
        f"request that computed them, in {store_s * 1e3:.0f} ms (its RAM insert included); "
        "TTFT, ms:"
    )
    print(
        "| restarted process, from disk | in RAM | full prefill | restart / RAM | full / restart |"
    )
    print("|---:|---:|---:|---:|---:|")
    print(
        f"| {r['restart'] * 1e3:.1f} | {r['ram'] * 1e3:.1f} | {r['full'] * 1e3:.1f} | "
        f"{r['restart'] / r['ram']:.2f}× | {r['full'] / r['restart']:.1f}× |"
    )
    r["store"] = store_s
    return r


def child(args: argparse.Namespace, what: str, tmp: str, suffix: tuple[int, ...]) -> Any:
    command = [
        sys.executable,
        str(Path(__file__).parent / "prefix.py"),
        *("--child", what, "--child-dir", tmp, "--child-suffix", json.dumps(list(suffix))),
        *("--threads", str(args.threads), "--dtype", args.dtype),
    ]
    out = subprocess.run(command, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the restarted engine failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def restart_child(b: Bench, version: str, args: argparse.Namespace) -> None:
    """A new process on the directory: one unrelated request, then prefix + suffix."""
    tmp = Path(args.child_dir)
    settings = TierSettings(disk_bytes=1 << 30, disk_dir=tmp / "kv")
    runner, backends, _ = tiered_runner(b, settings, version)
    first_token(runner, b.fresh(32))
    prefix = tuple(json.loads((tmp / "prefix.json").read_text()))
    stats = first_token(runner, prefix + tuple(json.loads(args.child_suffix)))
    backends.close()
    assert stats.disk_tokens == PREFIX_TOKENS, stats
    print(json.dumps({"ttft_s": stats.ttft_s, "disk_load_s": stats.disk_load_s}))


# -- shared ---------------------------------------------------------------------------------


def shared_section(b: Bench, version: str) -> dict[str, float]:
    with redis_server() as url, tempfile.TemporaryDirectory(prefix="infercache-kv-") as tmp:
        settings = TierSettings(shared_url=url, shared_bytes=1 << 30, disk_dir=Path(tmp))
        a, a_backends, _ = tiered_runner(b, settings, version)
        replica_b, b_backends, b_events = tiered_runner(b, settings, version)
        prefixes: list[tuple[int, ...]] = []

        def computed_on_a() -> float:
            prefixes.append(b.fresh(PREFIX_TOKENS))
            return float(first_token(a, prefixes[-1] + b.fresh(16)).ttft_s)

        def asked_on_b(source: str) -> float:
            stats = first_token(replica_b, prefixes[-1] + b.fresh(16))
            got = stats.shared_tokens if source == "shared" else stats.ram_tokens
            assert got == PREFIX_TOKENS, (source, stats)
            return float(stats.ttft_s)

        r = b.interleaved(
            {
                "full": computed_on_a,
                "shared": lambda: asked_on_b("shared"),
                "ram": lambda: asked_on_b("ram"),
            }
        )
        loaded = b_events.snapshot()["counters"].get("kv_load_bytes:shared", 0)
        a_backends.close()
        b_backends.close()
    print("\n## Two replicas, one Redis (1,024-token prefix computed on A, asked on B + 16)")
    print(f"B loaded {loaded / 2**20:.0f} MiB from Redis over the trials; TTFT, ms:")
    print("| B, from Redis | B, in RAM | A, full prefill | shared / RAM | full / shared |")
    print("|---:|---:|---:|---:|---:|")
    print(
        f"| {r['shared'] * 1e3:.1f} | {r['ram'] * 1e3:.1f} | {r['full'] * 1e3:.1f} | "
        f"{r['shared'] / r['ram']:.2f}× | {r['full'] / r['shared']:.1f}× |"
    )
    return r


# -- memory -------------------------------------------------------------------------------


def tiers_memory_section(b: Bench, args: argparse.Namespace) -> dict[str, float]:
    """Each variant in a process of its own (`--child memory`), so neither inherits the other's
    allocations; the peak RSS of each."""
    peaks: dict[str, float] = {}
    for variant in ("without tiers", "with a disk tier"):
        with tempfile.TemporaryDirectory(prefix="infercache-kv-") as tmp:
            suffix = () if variant == "without tiers" else (1,)  # the child's switch
            peaks[variant] = child(args, "memory", tmp, suffix)["peak_mib"]
    block = 64 * b.model.kv_shape.bytes_per_token / 2**20
    print("\n## Memory with a disk tier (12 unique 1,024-token prompts, twice, 32 MiB RAM budget)")
    print(
        f"peak RSS without tiers {peaks['without tiers']:.0f} MiB, with a disk tier "
        f"{peaks['with a disk tier']:.0f} MiB (one block: {block:.1f} MiB); each in its own "
        "process, after one warm-up prompt"
    )
    return peaks


def memory_child(
    b: Bench, version: str, args: argparse.Namespace, rss_mib: Callable[[str], float]
) -> None:
    """One variant: 12 unique prompts through a 32 MiB RAM budget, then again (the second pass
    loads back from disk what RAM evicted, with a tier); the peak RSS after a warm-up."""
    budget = 32 * 2**20
    tiers = bool(json.loads(args.child_suffix))
    backends: TierBackends | None = None
    if tiers:
        settings = TierSettings(disk_bytes=1 << 30, disk_dir=Path(args.child_dir) / "kv")
        runner, backends, _ = tiered_runner(b, settings, version, max_kv_bytes=budget)
    else:
        runner = b.runner(cache=True, max_kv_bytes=budget)
    prompts = [b.fresh(PREFIX_TOKENS) for _ in range(12)]
    first_token(runner, b.fresh(PREFIX_TOKENS))  # the workspace and pool pages, once
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    for prompt in prompts * 2:
        first_token(runner, prompt)
    if backends is not None:
        backends.close()
    print(json.dumps({"peak_mib": rss_mib("VmHWM")}))
