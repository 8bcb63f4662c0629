"""Support-bot days (issue 11, acceptance 1): fit the matcher on some intents' labelled texts,
replay a day of other phrasings through the real semantic layer with a stand-in upstream that
answers per intent, and count what the layer answered and how much of it was wrong — beside the
plain cosine threshold, in the same run.

    .venv/bin/python bench/semantic_support_day.py [--data /work/shared/data]
        [--datasets banking77,hwu64] [--requests 5000] [--known-share 0.75] [--seed 0]

Per data set (banking77: 10,003 texts, 77 intents; hwu64: 11,106 texts, 64 intents; CC BY 4.0,
read in place):
- intents: a seeded `known_share` of them are "labelled" — 60% of their texts go to `tune`
  (which itself fits on half and calibrates on the rest); the day draws from the other 40% and
  from every text of the intents `tune` never saw.
- the day: `requests` questions; an intent is drawn from a Zipf(1) law over the intents in a
  seeded order; half the time an earlier question of it is repeated word for word, otherwise
  a phrasing not asked yet is drawn (when none is left, a repeat).
- the upstream answers each question with its intent's answer, so a served answer is right
  exactly when the cached question had the same intent; the judge is `exact`.
- same-answer paraphrases: requests that are not exact repeats of a stored question while an
  answer of their intent is cached. Answered = served the right answer from the semantic layer;
  wrong = semantic answers of another intent / all semantic answers.
Every configuration replays the same day through `Cache.complete` with its own memory store.
MiniLM vectors are remembered on disk (bench/semantic_vectors.py: each distinct text embedded
once, ever); the layer is otherwise real.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.semantic.answer_stats import AnswerStatsConfig
from infercache.semantic.embedder import Embedder
from infercache.semantic.from_settings import answer_stats_for
from infercache.semantic.guards import default_guards
from infercache.semantic.judges import ExactAnswerJudge
from infercache.semantic.layer import SemanticConfig, ShadowConfig
from infercache.semantic.matcher import CosineMatcher, Matcher
from infercache.semantic.tuning.cache_sim import Embedded, simulate_lookups, tune_lookups
from infercache.semantic.tuning.fit import FitBase, FitOptions, fit_matcher
from infercache.semantic.tuning.intents import LabelledText, split_labelled
from infercache.semantic.verify import FalseHitMonitor, Verifier
from infercache.settings import Settings

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from semantic_public_pairs import read_banking77, read_hwu64  # noqa: E402
from semantic_vectors import RememberingEmbedder  # noqa: E402

SYSTEM = "You are the support assistant of a bank. Answer in one paragraph."


class InlineExecutor(Executor):
    """Runs judgments at once (the gateway runs them on a background thread)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


@dataclass(frozen=True)
class Day:
    requests: list[tuple[str, str]]  # (text, intent)
    tune_rows: list[LabelledText]
    known: frozenset[str]


def build_day(
    rows: Sequence[tuple[str, str]], *, requests: int, known_share: float, seed: int
) -> Day:
    rng = random.Random(seed)
    by_intent: dict[str, list[str]] = defaultdict(list)
    seen: set[str] = set()
    for text, intent in rows:
        if text not in seen:
            seen.add(text)
            by_intent[intent].append(text)
    intents = sorted(by_intent)
    rng.shuffle(intents)
    known = frozenset(intents[: round(len(intents) * known_share)])
    labelled = [LabelledText(t, i) for i in sorted(known) for t in by_intent[i]]
    tune_part, day_part = split_labelled(labelled, (0.6, 0.4), salt=f"day{seed}")
    pools = {i: [] for i in intents}
    for row in day_part:
        pools[row.label].append(row.text)
    for intent in intents:
        if intent not in known:
            pools[intent] = list(by_intent[intent])
        rng.shuffle(pools[intent])
    weights = np.cumsum([1.0 / (rank + 1) for rank in range(len(intents))])
    weights /= weights[-1]
    asked: dict[str, list[str]] = defaultdict(list)
    day = []
    for _ in range(requests):
        intent = intents[int(np.searchsorted(weights, rng.random()))]
        if asked[intent] and (rng.random() < 0.5 or not pools[intent]):
            text = rng.choice(asked[intent])
        else:
            text = pools[intent].pop()
            asked[intent].append(text)
        day.append((text, intent))
    return Day(day, tune_part, known)


def answer_of(intent: str) -> str:
    return f"Answer for «{intent}»: here is what to do, step by step."


class IntentUpstream:
    """Answers every question with its intent's answer; counts calls."""

    def __init__(self, intent_of: dict[str, str]) -> None:
        self.intent_of = intent_of
        self.calls = 0

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        intent = self.intent_of[body["messages"][-1]["content"]]
        return {
            "id": f"chatcmpl-{self.calls}",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer_of(intent)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 40, "completion_tokens": 30, "total_tokens": 70},
        }


def ask(text: str) -> dict[str, Any]:
    return {
        "model": "support-model",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
        "temperature": 0,
    }


def replay(
    day: Day,
    embedder: Embedder,
    config: SemanticConfig,
    *,
    verify_rate: float,
    data_dir: Path,
    seed: int = 0,
) -> dict[str, Any]:
    """One configuration through the real layer; the figures of the module docstring."""
    clock = ManualClock()
    settings = Settings(data_dir=data_dir, store_url="memory://", max_store_bytes=1 << 31)
    cache = Cache(settings, clock=clock)
    needs_judge = config.shadow is not None or verify_rate > 0
    verifier = (
        Verifier(
            ExactAnswerJudge(),
            FalseHitMonitor(target_false_hit=0.01),
            sample_rate=verify_rate,
            rng=random.Random(seed),
            executor=InlineExecutor(),
        )
        if needs_judge
        else None
    )
    layer = cache.enable_semantic(
        embedder, config=config, guards=default_guards(), verifier=verifier
    )
    upstream = IntentUpstream(dict(day.requests))
    stored_intents: set[str] = set()
    stored_texts: set[str] = set()
    answerable = answered = served = wrong = exact = 0
    first_serving: int | None = None
    for index, (text, intent) in enumerate(day.requests):
        is_paraphrase = text not in stored_texts and intent in stored_intents
        done = cache.complete(ask(text), upstream)
        clock.advance(1.0)
        answerable += is_paraphrase
        if done.layer is Layer.SEMANTIC:
            served += 1
            right = done.response["choices"][0]["message"]["content"] == answer_of(intent)
            answered += right and is_paraphrase
            wrong += not right
        elif done.layer is Layer.EXACT:
            exact += 1
        else:
            stored_texts.add(text)
            stored_intents.add(intent)
        if first_serving is None and layer.threshold is not None:
            first_serving = index
    state = layer.state()
    return {
        "requests": len(day.requests),
        "exact_hits": exact,
        "same_answer_paraphrases": answerable,
        "answered": answered,
        "semantic_answers": served,
        "wrong": wrong,
        "answered_share": answered / answerable if answerable else None,
        "wrong_share": wrong / served if served else None,
        "upstream_calls": upstream.calls,
        "serving_from_request": first_serving,
        "final_threshold": layer.threshold,
        "calibration": state["calibration"],
    }


def plain_threshold(day: Day, embedder: Embedder, target: float) -> float | None:
    """The plain cosine threshold `tune` picks (without --fit) on the same labelled texts."""
    rows = day.tune_rows
    vectors = embedder.embed([r.text for r in rows])
    held = Embedded(rows, vectors)
    cases = simulate_lookups(held, held, k=8)
    try:
        return tune_lookups(
            cases, CosineMatcher(), target_false_hit=target, guards=default_guards()
        ).threshold
    except ValueError:
        return None


def configurations(
    day: Day, base: RememberingEmbedder, out: Path, target: float, seed: int
) -> dict[str, tuple[Embedder, SemanticConfig, float]]:
    """name → (embedder, config, verification rate), the plain baselines first."""
    started = time.perf_counter()
    fitted = fit_matcher(
        day.tune_rows,
        FitBase(base, "minilm", out),
        options=FitOptions(target_false_hit=target, seed=seed, guards=tuple(default_guards())),
    )
    print(f"  fitted in {time.perf_counter() - started:.0f} s: {json.dumps(fitted.report)}")
    from infercache.semantic.matcher import load_fitted

    parts = load_fitted(out, base)
    adapted = parts.embedder  # its base remembers every vector
    matcher: Matcher = parts.matcher
    t_fit = fitted.fitted.evaluation.threshold
    shadow = ShadowConfig(target_false_hit=target, min_pairs=300, window=5000)
    stats = answer_stats_for(matcher)  # what `serve` uses with a fitted matcher
    plain_t = plain_threshold(day, base, target)
    configs: dict[str, tuple[Embedder, SemanticConfig, float]] = {
        "plain cosine 0.93 (issue's baseline)": (
            base, SemanticConfig(threshold=0.93, answer_stats=None), 0.0),
        "plain cosine 0.80": (base, SemanticConfig(threshold=0.80, answer_stats=None), 0.0),
        "plain cosine, shadow (live calibration)": (
            base, SemanticConfig(threshold=None, shadow=shadow, answer_stats=None), 0.1),
        f"fitted, calibrated {t_fit:.4f}": (
            adapted, SemanticConfig(threshold=t_fit, matcher=matcher, answer_stats=None), 0.0),
        f"fitted, calibrated {t_fit:.4f} + per-answer (default, lower 0.15)": (
            adapted, SemanticConfig(threshold=t_fit, matcher=matcher, answer_stats=stats), 0.1),
        f"fitted, calibrated {t_fit:.4f} + per-answer (lower 0.02)": (
            adapted, SemanticConfig(threshold=t_fit, matcher=matcher,
                                    answer_stats=AnswerStatsConfig(max_lower=0.02)), 0.1),
        f"fitted, calibrated {t_fit:.4f} + per-answer (lower 0.05)": (
            adapted, SemanticConfig(threshold=t_fit, matcher=matcher,
                                    answer_stats=AnswerStatsConfig(max_lower=0.05)), 0.1),
        "fitted, shadow (live calibration)": (
            adapted, SemanticConfig(threshold=None, matcher=matcher, shadow=shadow,
                                    answer_stats=None), 0.1),
        "fitted, shadow + per-answer": (
            adapted, SemanticConfig(threshold=None, matcher=matcher, shadow=shadow,
                                    answer_stats=stats), 0.1),
    }  # fmt: skip
    if plain_t is not None:
        configs[f"plain cosine, tuned {plain_t:.4f}"] = (
            base, SemanticConfig(threshold=plain_t, answer_stats=None), 0.0)  # fmt: skip
    return configs


def run_dataset(
    name: str, rows: list[tuple[str, str]], base: RememberingEmbedder, args: argparse.Namespace
) -> dict[str, Any]:
    day = build_day(rows, requests=args.requests, known_share=args.known_share, seed=args.seed)
    base.warm([t for t, _ in day.requests] + [r.text for r in day.tune_rows])
    load = os.getloadavg()[0]
    print(f"\n== {name}: {len(day.tune_rows)} labelled texts of {len(day.known)} intents to "
          f"tune, a day of {len(day.requests)} requests (load {load:.1f})")  # fmt: skip
    out = args.out / f"matcher-{name}"
    results: dict[str, Any] = {}
    for label, (embedder, config, rate) in configurations(
        day, base, out, args.target_false_hit, args.seed
    ).items():
        if args.only and not any(word in label for word in args.only.split(",")):
            continue
        started = time.perf_counter()
        r = replay(day, embedder, config, verify_rate=rate, data_dir=args.out, seed=args.seed)
        r["seconds"] = round(time.perf_counter() - started, 1)
        results[label] = r
        share = "n/a" if r["answered_share"] is None else f"{r['answered_share']:.1%}"
        wrong = "n/a" if r["wrong_share"] is None else f"{r['wrong_share']:.2%}"
        print(f"  {label:<60} answered {share:>6} of {r['same_answer_paraphrases']} "
              f"paraphrases, wrong {wrong:>6} of {r['semantic_answers']} semantic answers"
              f" (serving from request {r['serving_from_request']})")  # fmt: skip
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data"))
    parser.add_argument("--out", type=Path, default=HERE / "out" / "semantic_support_day")
    parser.add_argument("--datasets", default="banking77,hwu64")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--known-share", type=float, default=0.75)
    parser.add_argument("--target-false-hit", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", default="", help="comma list: run configurations naming one")
    args = parser.parse_args(argv)
    from infercache.semantic.embedder import MiniLMEmbedder

    base = RememberingEmbedder(MiniLMEmbedder(threads=args.threads), HERE / "out" / "vectors")
    readers = {
        "banking77": lambda: read_banking77(args.data / "banking77_train.csv"),
        "hwu64": lambda: read_hwu64(args.data / "hwu64_intents.tsv"),
    }
    results = {"load_before": os.getloadavg(), "known_share": args.known_share}
    for name in args.datasets.split(","):
        results[name] = run_dataset(name, readers[name](), base, args)
    results["load_after"] = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"results-known{args.known_share}-seed{args.seed}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
