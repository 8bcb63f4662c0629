"""Hit latency of a gateway while shadow mode's background refit runs, against the same gateway
with no refit running, paired in one run (issue 23, acceptance 6: background refits move the
p99 hit latency by at most 10%).

    .venv/bin/python bench/semantic_refit_paired.py [--rounds 8] [--seconds 4] [--window 5000]

One gateway, in this process as `serve` runs it (the app under uvicorn on a thread), the stand-in
upstream beside it, the semantic layer on with the packaged MiniLM (1 torch thread) and a plain
cosine threshold, and its verifier's background thread (where shadow mode's refits run). The
refit is `ShadowFit.refit` (semantic/shadow_fit.py) over a full window of `--window` judgments,
the largest a shadow gateway keeps: each holds k = 4 candidates' similarities, answers and
counts, drawn from a seeded mix of right and wrong pairs; submitted to the verifier's executor
back to back for the whole phase (a worst case: a shadow gateway refits once per
`shadow_refit_every` judged pairs; the measured time of one refit is printed), or with
`--every S` one refit started every S seconds (a cadence: 250 judged pairs every S seconds).
Two refits: `refit`, built by `shadow_fit_for` as a shadow gateway builds it (its CPU-heavy part
in a worker process at nice 19 and SCHED_IDLE), and `refit_in_thread`, the same refit run on
the verifier's thread itself (how it ran before). Each round measures three phases in rotating
order, quiet and one per refit; a phase runs `wrk`
from one connection for `--seconds` on an exact hit (the cached question) and then on a
semantic hit (a paraphrase of it, answered from the semantic layer: embedding, search, accept).
Printed per refit and hit kind: the median over rounds of p50 and p99 in each phase, and the
median of the per-round p99 ratio (refit / quiet) with its range. Needs `wrk`. Results to
OUT/refit.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from gateway import HIT_LUA, wrk  # noqa: E402

from infercache.gateway.build import build  # noqa: E402
from infercache.gateway.config import GatewayConfig  # noqa: E402
from infercache.gateway.semantic_setup import enable_from_settings  # noqa: E402
from infercache.semantic.embedder import MiniLMEmbedder  # noqa: E402
from infercache.semantic.layer import SemanticLayer  # noqa: E402
from infercache.semantic.layer_config import ShadowConfig  # noqa: E402
from infercache.semantic.matcher import NearbyAnswer  # noqa: E402
from infercache.semantic.shadow_fit import Judged, ShadowFit, shadow_fit_for  # noqa: E402
from infercache.settings import SemanticSettings, Settings  # noqa: E402
from tests.harness.servers import serve  # noqa: E402
from tests.harness.upstreams import FakeUpstream  # noqa: E402

CACHED = "How do I reset the PIN of my card?"
PARAPHRASE = "How can I reset the PIN on my card?"
SEMANTIC_LUA = HIT_LUA.replace('"exact-hit"', '"semantic-hit"')


def body(text: str) -> dict[str, Any]:
    return {"model": "m", "temperature": 0, "messages": [{"role": "user", "content": text}]}


def judgments(window: int, k: int, seed: int) -> list[Judged]:
    """`window` judged candidates: right ones more similar than wrong ones, as on traffic."""
    rng = random.Random(seed)
    out = []
    for _ in range(window):
        wrong = rng.random() < 0.3
        top = min(1.0, rng.gauss(0.78 if wrong else 0.88, 0.06))
        neighbours = tuple(
            NearbyAnswer(top - 0.03 * i, f"answer-{rng.randrange(200)}", rng.randint(1, 5))
            for i in range(k)
        )
        out.append(Judged(neighbours, 0, wrong))
    return out


class Refits:
    """Refits back to back on the gateway's verifier executor while `running`."""

    def __init__(self, fit: ShadowFit, judged: list[Judged], executor: Any, every_s: float) -> None:
        self._fit, self._judged, self._executor = fit, judged, executor
        self._every_s = every_s
        self._stop = threading.Event()
        self.durations_s: list[float] = []

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self._executor.submit(self._fit.refit, self._judged).result()
            self.durations_s.append(time.perf_counter() - started)
            self._stop.wait(max(0.0, self._every_s - (time.perf_counter() - started)))

    def close(self) -> None:
        self._fit.close()

    @contextmanager
    def running(self) -> Iterator[None]:
        self._stop.clear()
        driver = threading.Thread(target=self._loop)
        driver.start()
        try:
            yield
        finally:
            self._stop.set()
            driver.join()


def phase(url: str, seconds: int) -> dict[str, dict[str, float]]:
    exact = HIT_LUA.replace("BODY", json.dumps(body(CACHED)))
    semantic = SEMANTIC_LUA.replace("BODY", json.dumps(body(PARAPHRASE)))
    out = {
        "exact": wrk(f"{url}/v1/chat/completions", exact, 1, seconds),
        "semantic": wrk(f"{url}/v1/chat/completions", semantic, 1, seconds),
    }
    for kind, result in out.items():
        if result.get("others", 0) or not result.get("hits"):
            raise SystemExit(f"{kind} phase was not all {kind} hits: {result}")
    return out


def summary(rounds: Sequence[dict[str, Any]], kind: str, refit: str) -> dict[str, float]:
    def med(which: str, figure: str) -> float:
        return statistics.median(r[which][kind][figure] for r in rounds)

    ratios = [r[refit][kind]["p99_ms"] / r["quiet"][kind]["p99_ms"] for r in rounds]
    return {
        "quiet_p50_ms": med("quiet", "p50_ms"),
        "quiet_p99_ms": med("quiet", "p99_ms"),
        "refit_p50_ms": med(refit, "p50_ms"),
        "refit_p99_ms": med(refit, "p99_ms"),
        "p99_ratio_median": statistics.median(ratios),
        "p99_ratio_min": min(ratios),
        "p99_ratio_max": max(ratios),
    }


def measure(url: str, variants: dict[str, Refits], rounds: int, seconds: int) -> list[Any]:
    """Rounds of three phases (quiet, then each refit running), in rotating order."""
    out = []
    order = ["quiet", *variants]
    for r in range(rounds):
        measured: dict[str, Any] = {"load": os.getloadavg()[0]}
        for which in order[r % 3 :] + order[: r % 3]:
            if which == "quiet":
                measured[which] = phase(url, seconds)
                continue
            with variants[which].running():
                measured[which] = phase(url, seconds)
        out.append(measured)
        p99s = [f"{w} {measured[w]['exact']['p99_ms']:.2f} / "
                f"{measured[w]['semantic']['p99_ms']:.2f}" for w in order]  # fmt: skip
        print(f"round {r}: load {measured['load']:.1f}, p99 ms exact / semantic: "
              + ", ".join(p99s), flush=True)  # fmt: skip
    return out


def report(rounds: list[Any], variants: dict[str, Refits], window: int) -> dict[str, Any]:
    results: dict[str, Any] = {"window": window, "rounds": rounds}
    for name, refits in variants.items():
        refit_ms = statistics.median(refits.durations_s) * 1e3
        results[name] = {"refits": len(refits.durations_s), "refit_median_ms": refit_ms}
        print(f"{name}: {len(refits.durations_s)} refits of {window} judgments, median "
              f"{refit_ms:.0f} ms each")  # fmt: skip
        for kind in ("exact", "semantic"):
            s = results[name][kind] = summary(rounds, kind, name)
            print(f"  {kind:>9} hits: quiet p50/p99 {s['quiet_p50_ms']:.2f}/{s['quiet_p99_ms']:.2f}"
                  f" ms, {name} {s['refit_p50_ms']:.2f}/{s['refit_p99_ms']:.2f} ms; p99 ratio "
                  f"median {s['p99_ratio_median']:.3f} [{s['p99_ratio_min']:.3f}, "
                  f"{s['p99_ratio_max']:.3f}]")  # fmt: skip
    return results


def refit_variants(layer: SemanticLayer, window: int, every_s: float) -> dict[str, Refits]:
    """The refit as a shadow gateway builds it, and the same refit on the verifier's thread."""
    assert layer.verifier is not None
    executor = layer.verifier.executor
    judged = judgments(window, 4, seed=0)
    shadow = ShadowConfig(target_false_hit=0.01, min_pairs=300, window=window, refit_every=250)
    as_served = shadow_fit_for(shadow, layer.verifier, on_switch=lambda *_: None,
                               current=lambda: layer.matcher)  # fmt: skip
    assert as_served is not None
    in_thread = ShadowFit(executor, target_false_hit=0.01, min_pairs=300,
                          on_switch=lambda *_: None, current=lambda: layer.matcher)  # fmt: skip
    executor.submit(as_served.refit, judged).result()  # starts the worker process
    return {"refit": Refits(as_served, judged, executor, every_s),
            "refit_in_thread": Refits(in_thread, judged, executor, every_s)}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--window", type=int, default=5000)
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--every", type=float, default=0.0, help="s from refit to refit start")
    parser.add_argument("--out", type=Path, default=HERE / "out" / "semantic_refit")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "g.db").unlink(missing_ok=True)
    upstream = FakeUpstream()
    semantic = SemanticSettings(enabled=True, mode="calibrated", threshold=args.threshold,
                                judge="exact", verify_sample_rate=1e-9, k=4)  # fmt: skip
    with serve(upstream.app) as upstream_url:
        settings = Settings(data_dir=args.out, store_url=f"sqlite:///{args.out / 'g.db'}")
        built = build(settings, GatewayConfig(upstreams=(f"{upstream_url}/v1",)))
        layer = enable_from_settings(built.cache, semantic, embedder=MiniLMEmbedder(threads=1))
        variants = refit_variants(layer, args.window, args.every)
        with serve(built.app) as url:
            with httpx.Client(base_url=url, timeout=60) as client:
                first = client.post("/v1/chat/completions", json=body(CACHED))
                assert first.headers["x-infercache"] == "miss", first.headers
                for text, layer_name in ((CACHED, "exact-hit"), (PARAPHRASE, "semantic-hit")):
                    reply = client.post("/v1/chat/completions", json=body(text))
                    assert reply.headers["x-infercache"] == layer_name, (text, reply.headers)
            try:
                rounds = measure(url, variants, args.rounds, args.seconds)
            finally:
                for refits in variants.values():
                    refits.close()  # the worker process, before interpreter exit
    results = report(rounds, variants, args.window)
    (args.out / "refit.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
