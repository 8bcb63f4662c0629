"""`tune eval` on public pairs (issue 11, acceptance 3): the fitted matcher beside the plain
threshold, on MRPC, STS-B, the GPTCache pairs and our hard cases.

    .venv/bin/python bench/semantic_tune_eval.py [--data /work/shared/data] [--target 0.01]

Served configurations, each evaluated exactly as `infercache tune eval --config` does
(`tune.score_pairs_with` + `calibrate.evaluate`, guards included):
- plain: the packaged MiniLM, cosine threshold 0.9316 with the default guards (what `tune`
  picked on STS-B train + banking77 pairs, bench/README.md "Threshold");
- fitted: `tune --fit` on every banking77 and hwu64 text (intent-labelled support and assistant
  questions), its calibrated threshold; and the plain cosine threshold `tune` picks on the
  same labelled texts (simulated lookups), for a like-for-like baseline.
Sets (read in place, never copied; MRPC has research-use terms): MRPC all splits, STS-B dev+test
(score ≥ 4 same, ≤ 2 different), GPTCache mock pairs (positives only), hard cases. A pair is a
lookup whose cache holds one text, so the fitted head sees one neighbour of unknown answer.
Beside each figure: the best hit rate a threshold on that matcher's score reaches on the set
with a false-hit rate ≤ the target (an in-sample frontier, for reading the gap).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from infercache.semantic.embedder import MiniLMEmbedder
from infercache.semantic.guards import default_guards
from infercache.semantic.matcher import CosineMatcher, load_fitted
from infercache.semantic.tuning.calibrate import ScoredPair, evaluate
from infercache.semantic.tuning.fit import FitBase, FitOptions, fit_matcher
from infercache.semantic.tuning.intents import LabelledText
from infercache.semantic.tuning.pairs import Pair, read_pairs
from infercache.semantic.tuning.tune import Served, score_pairs_with

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from semantic_public_pairs import (  # noqa: E402
    read_banking77,
    read_gptcache_pairs,
    read_hwu64,
    read_mrpc,
    read_stsb,
)
from semantic_vectors import RememberingEmbedder  # noqa: E402

HARD_CASES = HERE.parent / "tests" / "semantic" / "data" / "hard_cases.tsv"
PLAIN_THRESHOLD = 0.9316


def frontier_hit(scored: Sequence[ScoredPair], target: float) -> float | None:
    """The best hit rate of a bare threshold on the score with false-hit rate ≤ target."""
    negatives = np.sort([p.similarity for p in scored if not p.pair.same])[::-1]
    positives = np.array([p.similarity for p in scored if p.pair.same])
    if not len(positives) or not len(negatives):
        return None
    allowed = int(target * len(negatives))
    if allowed >= len(negatives):
        return 1.0
    return float(np.mean(positives > negatives[allowed]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--out", type=Path, default=HERE / "out" / "semantic_tune_eval")
    parser.add_argument("--target", type=float, default=0.01)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()}")
    base = RememberingEmbedder(MiniLMEmbedder(threads=args.threads), HERE / "out" / "vectors")
    sets: dict[str, list[Pair]] = {
        "MRPC": read_mrpc(args.data / "mrpc.tsv"),
        "STS-B dev+test": read_stsb(args.data / "stsb.tsv", splits={"dev", "test"}),
        "GPTCache": read_gptcache_pairs(args.data / "gptcache_mock_pairs.json"),
        "hard cases": read_pairs(HARD_CASES),
    }
    labelled = [
        LabelledText(t, f"banking77:{i}")
        for t, i in read_banking77(args.data / "banking77_train.csv")
    ] + [LabelledText(t, f"hwu64:{i}") for t, i in read_hwu64(args.data / "hwu64_intents.tsv")]
    labelled = list({r.text: r for r in labelled}.values())
    base.warm(
        [r.text for r in labelled] + [t for ps in sets.values() for p in ps for t in (p.a, p.b)]
    )
    guards = default_guards()
    started = time.perf_counter()
    fitted = fit_matcher(
        labelled, FitBase(base, "minilm", args.out / "matcher"),
        options=FitOptions(target_false_hit=args.target, guards=tuple(guards)),
    )  # fmt: skip
    print(f"fitted on {len(labelled)} labelled texts in {time.perf_counter() - started:.0f} s: "
          f"threshold {fitted.fitted.evaluation.threshold:.4f}")  # fmt: skip
    parts = load_fitted(args.out / "matcher", base)
    served = {
        f"plain cosine {PLAIN_THRESHOLD}": Served(
            base, CosineMatcher(), PLAIN_THRESHOLD, guards, None),
        f"fitted {fitted.fitted.evaluation.threshold:.4f}": Served(
            parts.embedder, parts.matcher, fitted.fitted.evaluation.threshold, guards, "matcher"),
    }  # fmt: skip
    if fitted.plain is not None:
        served[f"plain cosine tuned on the same texts {fitted.plain.threshold:.4f}"] = Served(
            base, CosineMatcher(), fitted.plain.threshold, guards, None)  # fmt: skip
    results: dict[str, Any] = {"fit": fitted.report, "load": os.getloadavg()}
    for set_name, pairs in sets.items():
        print(f"\n== {set_name}: {sum(p.same for p in pairs)} same / "
              f"{sum(not p.same for p in pairs)} different")  # fmt: skip
        for label, s in served.items():
            scored = score_pairs_with(pairs, s.embedder, s.matcher)
            e = evaluate(scored, s.threshold, guards=s.guards)
            best = frontier_hit(scored, args.target)
            results.setdefault(set_name, {})[label] = {**e.to_dict(), "frontier_hit": best}
            fh = "   -  " if e.false_hit_rate is None else f"{e.false_hit_rate:6.2%}"
            hit = "   -  " if e.hit_rate is None else f"{e.hit_rate:6.1%}"
            front = "-" if best is None else f"{best:.1%}"
            print(f"  {label:<46} false-hit {fh}  hit {hit}  "
                  f"(best hit at false-hit <= {args.target:.0%}: {front})")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
