"""The ceiling of each scorer on the generated support-bot days (issue 23, items 2 and 3): how
many of day 2's same-answer paraphrases a semantic cache can answer with at most 1% of its
answers wrong, in process (no gateway).

    .venv/bin/python bench/semantic_ceiling.py [--bots banking77,hwu64] [--requests 3000]
        [--segment 250] [--target 0.01] [--only cosine,cosine-seen2,fitted,answers,local]
        [--top 150] [--vectors /tmp/semceiling] [--out DIR]

Days: tests/semantic/days (seed 0, one phrasing: the label is the answer, as the exact judge
makes it). Day 2 is replayed in time order from an empty cache as the layer serves it: an exact
repeat is the exact layer's, every other request is a lookup among the texts cached before it,
then cached with its own label (replay.replay_lookups; a served request's text is cached too,
which the gateway does not do). Recall = right answers / lookups whose label was cached before
them (the same-answer paraphrases); wrong = wrong answers / answers. The default guards apply
as the layer applies them (decision.accept on the candidate served), so every figure is what
would be served. Per scorer: the recall at <= target wrong with the threshold chosen on day 2
itself (hindsight: a ceiling, not a configuration), and day 2's recall / wrong at the threshold
chosen on day 1's outcomes by point estimate (the lowest whose wrong share is <= target) and
by the 95% upper bound (cache_sim.certify, `tune`'s fixed-sequence rule).

`as_stored` (semantic_ceiling_stored.py): day 2 replayed as the gateway stores it — an
answered request is not cached and, asked again, is a lookup again that the days' scorer
counts again — which is what acceptance 2 measures through a gateway (checked against one by
bench/semantic_ceiling_gateway.py: the same counts). For the per-question matchers: the best
recall at <= target over a sweep of thresholds, at day 1's point estimate, and (`fitted`) at the
threshold `tune`'s walk certifies on day 1's cross-fitted halves replayed the same way; for the
answer scorers, at their hindsight and day-1 point thresholds only (each replay is slow).

Scorers:
- `cosine`, `cosine-seen2`: the plain MiniLM cosine (matcher.CosineMatcher, min_seen 1 and 2);
  day-1 outcomes from day 1 replayed the same way.
- `fitted`: today's matcher as `tune LOG --fit` fits it on day 1 (fit_log's fit_part on each
  half, the served model A on the first; day-1 outcomes = the pooled cross-fitted calibration,
  thresholds never below fit_log's out-of-domain floor). `fitted-whole`: the same day-1
  outcomes, day 2 under the model fit_part fits on the whole of day 1.
- `centroid-*` and `combined-*` (semantic_ceiling_answers.py): an adapter (fit.py's SupCon) on
  the log's own same-answer labels, answers scored by a logistic head over answer-centroid
  features (`centroid`: 3 features) or centroid and nearest-neighbour features together
  (`combined`: 6). Day-1 outcomes are prequential: day 1 replayed in blocks of `--segment`
  requests, each under an adapter trained on the requests before it (the first block plain
  MiniLM); the head is fitted on those day-1 lookups. Day 2 under the adapter trained on all of
  day 1 (`-static`), or retrained before each block on day 1 plus day 2 so far (`-online`: the
  labels of day 2's requests as they arrive, the stored vectors re-projected); `-plain`: no
  adapter at all. `-cross`: day 2 as `-static`, but the head and the day-1 outcomes come from
  day 1 cross-fitted in halves (an adapter on one half, the other half replayed from an empty
  cache under it), which is how day 2 meets its adapter. `nearest-*`: the same with a head over
  the nearest-neighbour features and log(seen) only. `local-*` (`--only local`): the answer
  scorers as the layer could compute them, from the k nearest questions alone.
Embeddings are computed once into VECTORS (bench/semantic_vectors.py); torch on one thread.
Figures to stdout and OUT/results.json (default bench/out/semantic_ceiling). The wrong answers
among each scorer's `--top` highest-scored answers of day 2 go to OUT/wrong-BOT-SCORER.json,
each with a kind (`kind_of`: hwu64's labels are intent plus slot values, so a wrong answer may
be another intent, another slot value, a slot one side lacks, or the same slot value in another
surface form, "vacuuming" / "vacuum"); their counts per kind are in the results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import semantic_ceiling_answers as answers  # noqa: E402
import semantic_ceiling_stored as storing  # noqa: E402
from semantic_ceiling_points import (  # noqa: E402
    at,
    bound_threshold,
    hindsight,
    kind_of,
    point_threshold,
)
from semantic_vectors import RememberingEmbedder  # noqa: E402

from infercache.semantic.decision import accept, ranked  # noqa: E402
from infercache.semantic.embedder import Embedder, MiniLMEmbedder, l2_normalise  # noqa: E402
from infercache.semantic.guards import Guard, default_guards  # noqa: E402
from infercache.semantic.matcher import CosineMatcher, Matcher  # noqa: E402
from infercache.semantic.ood_set import ood_texts  # noqa: E402
from infercache.semantic.tuning import fit_log as fl  # noqa: E402
from infercache.semantic.tuning.cache_sim import LookupCase  # noqa: E402
from infercache.semantic.tuning.fit import (  # noqa: E402
    FitBase,
    FitOptions,
    background_similarity,
    train_adapter,
)
from infercache.semantic.tuning.intents import LabelledText  # noqa: E402
from infercache.semantic.tuning.replay import replay_lookups  # noqa: E402
from infercache.semantic.tuning.request_log import LoggedTexts  # noqa: E402
from tests.semantic.days import day  # noqa: E402

K = 8
Served = answers.Served
Run = tuple[list[tuple[float, bool]], list[Served], float | None, dict[str, Any]]
"""Day-1 outcomes, day 2 served at each ceiling, the floor, figures as the gateway stores."""


def stream_of(d: day.Day) -> list[LabelledText]:
    return [LabelledText(r.text, r.label) for r in d.requests]


def paraphrases(stream: Sequence[LabelledText]) -> int:
    """Lookups (first asking of a text) whose label was cached before them."""
    asked: set[str] = set()
    cached: set[str] = set()
    count = 0
    for row in stream:
        if row.text not in asked:
            asked.add(row.text)
            count += row.label in cached
            cached.add(row.label)
    return count


def detailed(
    cases: Sequence[LookupCase], matcher: Matcher, guards: Sequence[Guard]
) -> list[Served]:
    """cache_sim.ceilings, keeping what was served."""
    out = []
    for case in cases:
        neighbours = case.neighbours()
        scores = matcher.scores(neighbours)
        for j in ranked(scores, [n.similarity for n in neighbours]):
            hit = case.candidates[j][0]
            if accept(scores[j], case.query.text, hit.text, scores[j], guards).accepted:
                right = hit.label == case.query.label
                out.append(Served(scores[j], right, case.query, hit.label, hit.text))
                break
    return out


def judged(served: Sequence[Served]) -> list[tuple[float, bool]]:
    return [(s.score, s.right) for s in served]


# --- scorers --------------------------------------------------------------------------------


def cosine_run(
    embed: Embedder, days: tuple[list[LabelledText], list[LabelledText]],
    guards: Sequence[Guard], min_seen: int, target: float,
) -> Run:  # fmt: skip
    matcher = CosineMatcher(min_seen=min_seen)
    out, vectors = [], []
    for stream in days:
        vectors.append(embed.embed([r.text for r in stream]))
        cases = replay_lookups(stream, vectors[-1], k=K)
        out.append(detailed(cases, matcher, guards))
    day1 = judged(out[0])
    stored = stored_figures(days[1], vectors[1], matcher, guards, (day1, out[1], None), target)
    return day1, out[1], None, stored


def stored_figures(
    stream: Sequence[LabelledText], vectors: np.ndarray, matcher: Matcher,
    guards: Sequence[Guard], run: tuple[list[tuple[float, bool]], list[Served], float | None],
    target: float,
) -> dict[str, Any]:  # fmt: skip
    """Day 2 as the gateway stores (semantic_ceiling_stored.py): the best of a sweep of
    thresholds, and at day 1's point estimate."""
    day1, day2, floor = run
    out = {"sweep": storing.stored_sweep(stream, vectors, matcher, guards,
                                        [s.score for s in day2], target)}  # fmt: skip
    point = point_threshold(day1, target)
    if point is not None:
        point = point if floor is None else max(point, floor)
        out["day1_point"] = storing.stored_at(stream, vectors, matcher, guards, point)
    return out


def fitted_run(
    embed: Embedder, days: tuple[list[LabelledText], list[LabelledText]],
    guards: Sequence[Guard], work: Path, target: float,
) -> dict[str, Run]:  # fmt: skip
    """`tune LOG --fit`'s steps (fit_log.fit_log) with the pooled outcomes kept; `fitted-whole`:
    the same day-1 outcomes, day 2 under a model fit_part fits on the whole of day 1."""
    first, second = days
    o = fl.LogFitOptions(target_false_hit=0.01, guards=tuple(guards), ood=tuple(ood_texts()))
    logged = LoggedTexts(first, [""] * len(first), [float(i) for i in range(len(first))],
                         len(first), 0)  # fmt: skip
    cut = round(o.fit_share * len(first))
    early, late = fl.Part(first[:cut], [""] * cut), fl.Part(first[cut:], [""] * (len(first) - cut))
    vectors = fl._Vectors(embed, None)
    model_a = fl.fit_part(early, vectors, o)
    model_b = fl.fit_part(late, vectors, o)
    pooled = [
        *fl.calibration_outcomes(model_a, late, vectors, o, seed=o.seed).judged,
        *fl.calibration_outcomes(model_b, early, vectors, o, seed=o.seed + 1).judged,
    ]
    floor = fl._floor(model_a, logged, vectors, o)
    FitBase(embed, "minilm", work).save(model_a.adapter, model_a.matcher.head, {})
    whole = fl.fit_part(fl.Part(first, [""] * len(first)), vectors, o)
    halves = [
        (late.rows, vectors.of([r.text for r in late.rows], model_a.adapter), model_a.matcher),
        (early.rows, vectors.of([r.text for r in early.rows], model_b.adapter), model_b.matcher),
    ]
    ranked = sorted((score for score, _ in pooled), reverse=True)
    grid = [ranked[i] for i in range(49, len(ranked), 25)]
    certified = storing.certify_stored(halves, guards, grid, target, floor)
    runs = {}
    for name, model in (("fitted", model_a), ("fitted-whole", whole)):
        day2 = l2_normalise(embed.embed([r.text for r in second]) @ model.adapter.T)
        served = detailed(replay_lookups(second, day2, k=o.k), model.matcher, guards)
        figures = stored_figures(
            second, day2, model.matcher, guards, (pooled, served, floor), target
        )
        figures["day1_stored_bound"] = certified
        if certified["threshold"] is not None:
            figures["at_stored_bound"] = storing.stored_at(
                second, day2, model.matcher, guards, certified["threshold"]
            )
        runs[name] = (pooled, served, floor, figures)
    return runs


def adapter_on(embed: Embedder, rows: Sequence[LabelledText]) -> np.ndarray | None:
    """fit.py's SupCon adapter on the distinct texts of `rows`; None when no label repeats."""
    unique = list({r.text: r for r in rows}.values())
    labels = [r.label for r in unique]
    if len(set(labels)) == len(labels):
        return None
    return train_adapter(embed.embed([r.text for r in unique]), labels, FitOptions(seed=0))


def segments(
    embed: Embedder, stream: Sequence[LabelledText], history: Sequence[LabelledText],
    size: int | None, adapt: bool,
) -> list[answers.Segment]:  # fmt: skip
    """Per block of `size` requests (None: one block), the stream's vectors under an adapter
    trained on `history` plus the stream before the block (semantic_ceiling_answers.Segment)."""
    base = embed.embed([r.text for r in stream])
    out = []
    for start in range(0, len(stream), size or len(stream)):
        seen = [*history, *stream[:start]]
        adapter = adapter_on(embed, seen) if adapt else None
        vectors = base if adapter is None else l2_normalise(base @ adapter.T)
        known = list({r.text: r for r in seen or stream[: size or len(stream)]}.values())
        space = _project(embed, known, adapter)
        background = background_similarity(space, [r.label for r in known], 0)
        out.append(answers.Segment(start, vectors, background))
    return out


def _project(
    embed: Embedder, rows: Sequence[LabelledText], adapter: np.ndarray | None
) -> np.ndarray:
    base = embed.embed([r.text for r in rows])
    return base if adapter is None else l2_normalise(base @ adapter.T)


def answer_runs(
    embed: Embedder, days: tuple[list[LabelledText], list[LabelledText]],
    guards: Sequence[Guard], size: int, target: float, top: int, sweep: Sequence[str] = (),
) -> dict[str, Run]:  # fmt: skip
    """The answer-level scorers (module docstring); `top` 0: the layer's view only (`local-`,
    semantic_ceiling_answers.py), for the static adapter. The scorers named in `sweep` are also
    replayed as stored at 16 thresholds (`stored_sweep`'s grid), the best at <= target kept."""
    first, second = days
    half = len(first) // 2

    def replay(stream: list[LabelledText], space: list[answers.Segment]) -> list[answers.Lookup]:
        return answers.lookups(stream, space, guards, k=K, top=top)

    day1 = {
        "prequential": replay(first, segments(embed, first, [], size, True)),
        "cross": [
            found
            for train, test in ((first[:half], first[half:]), (first[half:], first[:half]))
            for found in replay(test, segments(embed, test, train, None, True))
        ],
    }
    spaces = {"static": segments(embed, second, first, None, True)}
    if top:
        day1["plain"] = replay(first, segments(embed, first, [], None, False))
        spaces["online"] = segments(embed, second, first, size, True)
        spaces["plain"] = segments(embed, second, [], None, False)
    spaces["cross"] = spaces["static"]
    training = {"static": "prequential", "cross": "cross", "online": "prequential"}
    replayed = {name: replay(second, space) for name, space in spaces.items()}
    asked = paraphrases(second)
    runs: dict[str, Run] = {}
    for name, columns in answers.HEADS.items():
        for variant, space in spaces.items():
            own = day1[training.get(variant, variant)]
            head = answers.fit_head(own, columns, min_seen=2)
            outcomes = judged(answers.ceilings(own, head, 2))
            served = answers.ceilings(replayed[variant], head, 2)
            points = {
                "hindsight": hindsight(judged(served), asked, target)["threshold"],
                "day1_point": point_threshold(outcomes, target),
            }
            stored = {
                key: as_stored(second, space, guards, head, t, top)
                for key, t in points.items()
                if t is not None
            }
            scorer = f"{'' if top else 'local-'}{name}-{variant}"
            if scorer in sweep:
                ranked = sorted((s.score for s in served), reverse=True)
                grid = [ranked[int(r)] for r in np.linspace(100, len(ranked) - 1, 16)]
                tried = [as_stored(second, space, guards, head, t, top) for t in grid]
                passing = [x for x in tried if x["wrong"] <= target * x["served"]]
                stored["sweep"] = max(passing, key=lambda x: x["recall"], default=None)
            runs[scorer] = (outcomes, served, None, stored)
    return runs


def as_stored(
    stream: Sequence[LabelledText], space: Sequence[answers.Segment], guards: Sequence[Guard],
    head: answers.LogisticHead, threshold: float, top: int,
) -> dict[str, Any]:  # fmt: skip
    """Day 2 at `threshold` as the gateway stores: an answered request is not cached, and asked
    again it is a lookup again (tests/semantic/days/scoring.py counts it so)."""
    outcomes: list[tuple[bool, Served | None, str]] = []

    def serves(lookup: answers.Lookup) -> bool:
        served = answers.served_at(lookup, head, 2, threshold)
        outcomes.append((lookup.answerable, served, lookup.query.text))
        return served is not None

    answers.lookups(stream, space, guards, k=K, top=top, serves=serves)
    asked = sum(answerable for answerable, _, _ in outcomes)
    given = [s for _, s, _ in outcomes if s is not None]
    right = sum(s.right for s in given)
    return {
        "threshold": threshold,
        "paraphrases": asked,
        "recall": right / asked if asked else None,
        "served": len(given),
        "wrong": len(given) - right,
        "distinct_paraphrases": len({text for answerable, _, text in outcomes if answerable}),
        "distinct_answered": len({text for _, s, text in outcomes if s is not None and s.right}),
    }


# --- the run --------------------------------------------------------------------------------


def summarise(run: Run, asked: int, target: float) -> dict[str, Any]:
    day1, day2, floor, stored = run
    point = point_threshold(day1, target)
    if point is not None and floor is not None:
        point = max(point, floor)
    return {
        "hindsight": hindsight(judged(day2), asked, target),
        "day1_point": at(day2, point, asked),
        "day1_bound": at(day2, bound_threshold(day1, target, floor), asked),
        "floor": floor,
        "as_stored": stored,
    }


def wrong_answers(run: Run, top: int) -> list[dict[str, Any]]:
    """The wrong answers among the `top` highest-scored of day 2."""
    best = sorted(run[1], key=lambda s: -s.score)[:top]
    return [
        {
            "rank": rank,
            "score": round(s.score, 4),
            "query": s.query.text,
            "label": s.query.label,
            "served_label": s.label,
            "served_question": s.text,
            "kind": kind_of(s.query.label, s.label),
        }
        for rank, s in enumerate(best, 1)
        if not s.right
    ]


def bot_runs(
    name: str, embed: Embedder, args: argparse.Namespace, guards: Sequence[Guard]
) -> dict[str, Any]:
    bot = day.support_bot(name, phrasings=1)
    spec = day.DaySpec(requests=args.requests)
    days = (stream_of(day.bot_day(bot, 1, spec)), stream_of(day.bot_day(bot, 2, spec)))
    embed.embed([r.text for r in days[0] + days[1]])
    asked = paraphrases(days[1])
    sweep = args.sweep_answers.split(",")
    scorers: dict[str, Callable[[], Run | dict[str, Run]]] = {
        "cosine": lambda: cosine_run(embed, days, guards, 1, args.target),
        "cosine-seen2": lambda: cosine_run(embed, days, guards, 2, args.target),
        "fitted": lambda: fitted_run(embed, days, guards, Path(tempfile.mkdtemp()), args.target),
        "answers": lambda: answer_runs(embed, days, guards, args.segment, args.target, 3, sweep),
        "local": lambda: answer_runs(embed, days, guards, args.segment, args.target, 0, sweep),
    }
    out: dict[str, Any] = {"paraphrases": asked, "scorers": {}}
    for key, make in scorers.items():
        if args.only and key not in args.only.split(","):
            continue
        started = time.monotonic()
        made = make()
        runs = made if isinstance(made, dict) else {key: made}
        for scorer, run in runs.items():
            row = summarise(run, asked, args.target)
            row["seconds"] = round(time.monotonic() - started, 1)
            out["scorers"][scorer] = row
            wrong = wrong_answers(run, args.top)
            row["wrong_in_top"] = dict(Counter(w["kind"] for w in wrong))
            (args.out / f"wrong-{name}-{scorer}.json").write_text(json.dumps(wrong, indent=1))
            print(name, scorer, json.dumps(row), flush=True)
    return out


def table(results: dict[str, Any]) -> str:
    lines = [
        "| scorer | bot | hindsight recall at <= 1% (served, wrong) | day-1 point: recall / wrong "
        "| day-1 95% bound: recall / wrong | as stored: best at <= 1% (†: at the hindsight "
        "threshold) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for bot, runs in results["bots"].items():
        for scorer, row in runs["scorers"].items():
            h = row["hindsight"]
            cells = [f"{h['recall']:.1%} ({h['served']}, {h['wrong']})"]
            for key in ("day1_point", "day1_bound"):
                r = row[key]
                cells.append(
                    "no threshold" if r["threshold"] is None
                    else f"{r['recall']:.1%} / {r['wrong']} of {r['served']}"
                )  # fmt: skip
            kept = row["as_stored"]
            at = kept["sweep"] if "sweep" in kept else kept.get("hindsight")
            cells.append(
                "–" if at is None or at["threshold"] is None
                else f"{at['recall']:.1%} of {at['paraphrases']} / {at['wrong']} of "
                f"{at['served']}{'' if 'sweep' in kept else ' (†)'}"
            )  # fmt: skip
            lines.append(
                f"| {scorer} | {bot} ({runs['paraphrases']}) | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bots", default="banking77,hwu64")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--segment", type=int, default=250)
    parser.add_argument("--target", type=float, default=0.01)
    parser.add_argument("--top", type=int, default=150)
    parser.add_argument(
        "--sweep-answers", default="", help="answer scorers to sweep as stored (slow), e.g. "
        "combined-static,local-nearest-cross",
    )  # fmt: skip
    parser.add_argument("--only", default="", help="cosine,cosine-seen2,fitted,answers,local")
    parser.add_argument("--vectors", type=Path, default=Path("/tmp/semceiling"))
    parser.add_argument("--out", type=Path, default=HERE / "out" / "semantic_ceiling")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    args.out.mkdir(parents=True, exist_ok=True)
    embed = RememberingEmbedder(MiniLMEmbedder(threads=1), args.vectors)
    guards = default_guards()
    results: dict[str, Any] = {"load_before": os.getloadavg(), "args": vars(args), "bots": {}}
    for name in filter(None, args.bots.split(",")):
        results["bots"][name] = bot_runs(name, embed, args, guards)
    results["load_after"] = os.getloadavg()
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
