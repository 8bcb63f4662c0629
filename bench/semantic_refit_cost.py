"""The cost of one shadow-mode refit's computation (issue 23, acceptance 6): the vectorised refit
(semantic/shadow_fit.py: pack the window, then `propose`, one numpy pass for the
features) against the judgment-by-judgment refit it replaced (tests/semantic/refit_reference.py),
in the same process, in alternating order, on the same windows.

    .venv/bin/python bench/semantic_refit_cost.py [--rounds 7] [--window 5000]

Windows: `gateway`, the paired bench's (bench/semantic_refit_paired.py: k = 4, the matcher
served now the plain cosine); `mixed`, widths 2–14 with unknown answers and the judged one not
always first (tests/semantic/test_shadow_fit.py's generator), the matcher served now a fitted
head (so it is rescored on its own features: the loops computed features three times). Printed
per window: the median over rounds of wall and CPU ms (process time: this thread alone runs),
the decisions compared (they must match). Results to OUT/refit_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from semantic_refit_paired import judgments  # noqa: E402

from infercache.semantic.matcher import CosineMatcher, FittedMatcher, Head, Matcher  # noqa: E402
from infercache.semantic.shadow_fit import Judged, pack, propose  # noqa: E402
from tests.semantic.refit_reference import propose_by_loops  # noqa: E402
from tests.semantic.test_shadow_fit import mixed_judgments  # noqa: E402

OPTIONS = (0.6, 0.01, 300, "shadow-fit:1")  # fit share, target, min pairs, name (a gateway's)


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3


def window_cost(judged: Sequence[Judged], current: Matcher, rounds: int) -> dict[str, Any]:
    figures: dict[str, list[float]] = {k: [] for k in ("loops", "loops_cpu", "pack", "propose")}
    figures["vectorised_cpu"] = []
    decisions = []
    for r in range(rounds):
        for which in ("loops", "vectorised")[:: 1 if r % 2 else -1]:
            if which == "loops":
                old, wall, cpu = timed(lambda: propose_by_loops(judged, current, *OPTIONS))
                figures["loops"].append(wall)
                figures["loops_cpu"].append(cpu)
                continue
            packed, pack_ms, pack_cpu = timed(lambda: pack(judged))
            new, wall, cpu = timed(lambda p=packed: propose(p, current, *OPTIONS))
            figures["pack"].append(pack_ms)
            figures["propose"].append(wall)
            figures["vectorised_cpu"].append(pack_cpu + cpu)
        decisions.append((None if old is None else old[1:5], None if new is None else new[1:5]))
    out: dict[str, Any] = {k: statistics.median(v) for k, v in figures.items()}
    out["vectorised"] = statistics.median(
        p + q for p, q in zip(figures["pack"], figures["propose"], strict=True)
    )
    out["decision_loops"], out["decision_vectorised"] = decisions[-1]
    out["same_decisions"] = all(a == b for a, b in decisions)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--window", type=int, default=5000)
    parser.add_argument("--out", type=Path, default=HERE / "out" / "semantic_refit")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    fitted = FittedMatcher(Head((5.0, 0.0, 0.0, 0.5, 0.0), -4.0, background=0.4), "fitted")
    windows = {
        "gateway": (judgments(args.window, 4, seed=0), CosineMatcher()),
        "mixed": (mixed_judgments(args.window, seed=6), fitted),
    }
    results: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    for name, (judged, current) in windows.items():
        r = results[name] = window_cost(judged, current, args.rounds)
        print(f"{name}: loops {r['loops']:.0f} ms (CPU {r['loops_cpu']:.0f}); vectorised "
              f"{r['vectorised']:.1f} ms = pack {r['pack']:.1f} + propose {r['propose']:.1f} "
              f"(CPU {r['vectorised_cpu']:.1f}); ×{r['loops'] / r['vectorised']:.0f}; same "
              f"decisions: {r['same_decisions']} {r['decision_vectorised']}")  # fmt: skip
    results["load_after"] = os.getloadavg()[0]
    print(f"load average {results['load_before']:.1f} → {results['load_after']:.1f}")
    (args.out / "refit_cost.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
