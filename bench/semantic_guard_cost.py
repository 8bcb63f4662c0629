"""What the poisoning guards cost in recall on the generated days (issue 23, acceptance 5).

    .venv/bin/python bench/semantic_guard_cost.py [--bots banking77,hwu64] [--requests 3000]

The guards are text rules (semantic/guards.py, content_guards.py): whether they veto a
candidate does not depend on the embedder or the matcher, so their cost is measured on the
texts alone. For every same-answer paraphrase of day 2 (kind `paraphrase`: an FAQ asked in
words day 1 never used) against every day-1 text of its label (what a cache filled by day 1
holds for it), with three guard sets — none, the classic ones (numbers, dates, negation) and
the default (classic plus the content guards that stop poisoning: surplus, contacts,
instructions, swaps):
- `pairs vetoed`: the share of (paraphrase, cached same-answer text) pairs the set refuses;
- `reachable`: the share of paraphrases with at least one cached same-answer text the set
  lets through — the most any matcher could answer with those guards (a ceiling: the layer
  only tries the k nearest, so the served recall is lower).
The recall the content guards cost is the drop from classic to default. Figures to stdout and
OUT/results.json (default bench/out/semantic_guard_cost). No model is loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from infercache.semantic.decision import accept  # noqa: E402
from infercache.semantic.guards import DEFAULT_GUARDS, Guard, build_guards  # noqa: E402
from tests.semantic.days import day  # noqa: E402

CLASSIC = ("numbers", "dates", "negation")
GUARD_SETS = {"none": (), "classic": CLASSIC, "default": DEFAULT_GUARDS}


def passes(query: str, cached: str, guards: Sequence[Guard]) -> bool:
    """Whether the accept rule lets `cached`'s answer serve `query` at a score above any
    threshold (only the guards can refuse)."""
    return accept(1.0, query, cached, 0.0, guards).accepted


def measure(bot_name: str, requests: int) -> dict[str, Any]:
    bot = day.support_bot(bot_name)
    spec = day.DaySpec(requests=requests)
    first, second = day.bot_day(bot, 1, spec), day.bot_day(bot, 2, spec)
    cached: dict[str, set[str]] = defaultdict(set)
    for r in first.requests:
        cached[r.label].add(r.text)
    queries = list(
        dict.fromkeys(
            (r.text, r.label) for r in second.requests if r.kind == "paraphrase" and cached[r.label]
        )
    )
    out: dict[str, Any] = {"paraphrases": len(queries)}
    for name, names in GUARD_SETS.items():
        guards = build_guards(names)
        started = time.perf_counter()
        pairs = vetoed = reachable = 0
        for text, label in queries:
            verdicts = [passes(text, other, guards) for other in sorted(cached[label])]
            pairs += len(verdicts)
            vetoed += verdicts.count(False)
            reachable += any(verdicts)
        out[name] = {
            "pairs": pairs,
            "pairs_vetoed": vetoed / pairs if pairs else None,
            "reachable": reachable / len(queries) if queries else None,
            "seconds": round(time.perf_counter() - started, 1),
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "out" / "semantic_guard_cost")
    parser.add_argument("--bots", default="banking77,hwu64")
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args(argv)
    results = {}
    for name in args.bots.split(","):
        figures = results[name] = measure(name, args.requests)
        print(f"{name}: {figures['paraphrases']} day-2 paraphrases with a day-1 answer")
        for guards in GUARD_SETS:
            f = figures[guards]
            print(
                f"  {guards:8} pairs vetoed {f['pairs_vetoed']:.1%} of {f['pairs']}, "
                f"reachable {f['reachable']:.1%}"
            )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
