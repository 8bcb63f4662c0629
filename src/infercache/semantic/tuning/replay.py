"""Calibration that simulates serving: texts replayed in order through a cache that starts empty.

Served traffic is not a labelled file looked up against all its other texts (where nearly every
query's answer is already cached and nothing comes from outside the domain); a calibration
measured that way promised 0.6% wrong answers and served 2.8% (issue 23). So every calibration
replays a stream as the layer would meet it (`serving_stream`, then `replay_lookups`):

1. Order: a log's requests in time order; a labelled file's texts shuffled with a seed (files
   are often sorted by label, which no traffic is).
2. Held-out labels: a seeded `held_out_share` of the labels never enter the cache — questions
   whose answer is not there yet, where every candidate is wrong.
3. Out-of-domain questions: `ood_share` of the stream is drawn from an out-of-domain set
   (semantic/ood_set.py), each its own answer, interleaved at seeded positions; they enter the
   cache like any answered question (as distractors for later lookups).
4. Replay: for text i, the k nearest among the texts cached before it (same scope only); an
   exact repeat of a cached text is the exact layer's and is skipped; then text i is cached
   (unless its label is held out). Each lookup with a candidate is a `cache_sim.LookupCase`,
   with how many cached texts shared each candidate's label at that moment (the layer's
   `registry.answer_count`).
5. The floor (`ood_floor`): the rest of the out-of-domain set, disjoint from the stream's, is
   looked up in a cache holding every in-domain text whose label has two wordings at least
   (`recurring`: a one-off question is no answer the cache serves again); the `quantile`
   (0.999) of the score the rule would serve each at is what unrelated text reaches. No
   written config serves below it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from infercache.semantic.guards import Guard
from infercache.semantic.matcher import Matcher
from infercache.semantic.tuning.cache_sim import (
    Embedded,
    LookupCase,
    LookupEvaluation,
    ceilings,
    evaluate_lookups,
    simulate_lookups,
    tune_lookups,
)
from infercache.semantic.tuning.intents import LabelledText

OOD_LABEL = "\0ood:"
BLOCK = 512


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """How a stream is built from labelled texts (module docstring, steps 1–3)."""

    held_out_share: float = 0.2
    ood_share: float = 0.15
    seed: int = 0
    shuffle: bool = True  # False: the texts are in time order already (a log)

    def __post_init__(self) -> None:
        if not (0 <= self.held_out_share < 1 and 0 <= self.ood_share < 1):
            raise ValueError(f"shares must lie in [0, 1): {self}")


@dataclass(frozen=True, slots=True)
class ReplayStream:
    texts: list[LabelledText]
    scopes: list[str]  # one per text
    held_out: frozenset[str]  # labels never cached
    ood_left: list[str]  # out-of-domain texts not in the stream (for the floor)


def serving_stream(
    rows: Sequence[LabelledText],
    ood: Sequence[str],
    plan: ReplayPlan,
    scopes: Sequence[str] | None = None,
) -> ReplayStream:
    """The stream a calibration replays (module docstring, steps 1–3). `scopes`: one per row
    (a log's); an out-of-domain text is asked in the scope of the text before it."""
    rng = random.Random(plan.seed)
    items = list(zip(rows, scopes if scopes is not None else [""] * len(rows), strict=True))
    if plan.shuffle:
        rng.shuffle(items)
    labels = sorted({r.label for r in rows})
    held = frozenset(rng.sample(labels, round(plan.held_out_share * len(labels))))
    pool = list(ood)
    rng.shuffle(pool)
    wanted = round(plan.ood_share / (1 - plan.ood_share) * len(items)) if pool else 0
    wanted = min(wanted, len(pool) // 2)  # the other half at least measures the floor
    for i, text in enumerate(pool[:wanted]):
        at = rng.randrange(len(items) + 1)
        scope = items[max(0, at - 1)][1] if items else ""
        items.insert(at, (LabelledText(text, f"{OOD_LABEL}{i}"), scope))
    return ReplayStream([r for r, _ in items], [c for _, c in items], held, pool[wanted:])


def replay_lookups(
    stream: Sequence[LabelledText],
    vectors: npt.NDArray[np.float32],
    *,
    k: int,
    held_out: frozenset[str] = frozenset(),
    scopes: Sequence[str] | None = None,
) -> list[LookupCase]:
    """Each text looked up, in order, in the cache of the texts before it (module docstring,
    step 4). `scopes`: one per text; candidates only come from the text's own scope."""
    if len(stream) != len(vectors) or (scopes is not None and len(scopes) != len(stream)):
        raise ValueError("texts, vectors and scopes must have the same length")
    scope_ids = _ids(scopes) if scopes is not None else np.zeros(len(stream), dtype=np.int64)
    first: dict[tuple[int, str], int] = {}
    cached = np.zeros(len(stream), dtype=bool)
    asked = np.zeros(len(stream), dtype=bool)
    for i, row in enumerate(stream):
        key = (int(scope_ids[i]), row.text)
        if key in first:
            continue  # an exact repeat: the exact layer answers it
        first[key] = i
        asked[i] = True
        cached[i] = row.label not in held_out
    cases: list[LookupCase] = []
    counts: dict[tuple[int, str], int] = {}  # cached texts per (scope, label), as replayed
    for start in range(0, len(stream), BLOCK):
        end = min(start + BLOCK, len(stream))
        block = vectors[start:end] @ vectors[:end].T
        for offset in range(end - start):
            i = start + offset
            if not asked[i]:
                continue
            usable = cached[:i] & (scope_ids[:i] == scope_ids[i])
            similarities = np.where(usable, block[offset, :i], -np.inf)
            order = np.argsort(-similarities, kind="stable")[:k]
            picked = tuple(
                (stream[int(j)], float(similarities[j]))
                for j in order
                if np.isfinite(similarities[j])
            )
            scope = int(scope_ids[i])
            if picked:
                seen = tuple(counts.get((scope, c.label), 1) for c, _ in picked)
                cases.append(LookupCase(stream[i], picked, seen))
            if cached[i]:
                counts[(scope, stream[i].label)] = counts.get((scope, stream[i].label), 0) + 1
    return cases


def ood_floor(
    ood: Sequence[str],
    ood_vectors: npt.NDArray[np.float32],
    domain: Embedded,
    matcher: Matcher,
    guards: Sequence[Guard],
    *,
    k: int,
    quantile: float = 0.999,
) -> float | None:
    """The score unrelated text reaches (module docstring, step 5); None without OOD texts."""
    if not ood or not domain.texts:
        return None
    queries = [LabelledText(text, f"{OOD_LABEL}floor{i}") for i, text in enumerate(ood)]
    cases = simulate_lookups(Embedded(queries, ood_vectors), domain, k=k)
    reached = [score for score, _ in ceilings(cases, matcher, guards)]
    if not reached:
        return None
    # Lookups the guards refused everywhere never reach anything: they count as the lowest.
    padded = np.array(reached + [-1.0] * (len(queries) - len(reached)))
    return float(np.quantile(padded, quantile))


def recurring(texts: Sequence[LabelledText], among: Sequence[int]) -> list[int]:
    """The positions in `among` whose label has two distinct texts at least: the answers a
    cache serves again and again (one-off questions, a log's own out-of-domain ones among them,
    are what unrelated text resembles, not what it must stay below)."""
    wordings: dict[str, set[str]] = {}
    for i in among:
        wordings.setdefault(texts[i].label, set()).add(texts[i].text)
    return [i for i in among if len(wordings[texts[i].label]) > 1]


def _ids(values: Sequence[str]) -> npt.NDArray[np.int64]:
    index: dict[str, int] = {}
    return np.array([index.setdefault(v, len(index)) for v in values], dtype=np.int64)


@dataclass(frozen=True, slots=True)
class ReplayCalibration:
    evaluation: LookupEvaluation
    floor: float | None
    stream: int  # texts replayed (out-of-domain ones included)
    ood: int  # out-of-domain texts in the stream
    ood_floor_texts: int  # out-of-domain texts the floor was measured on
    held_out_labels: int

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.evaluation.to_dict(),
            "floor": self.floor,
            "replayed": self.stream,
            "ood_in_stream": self.ood,
            "ood_for_floor": self.ood_floor_texts,
            "held_out_labels": self.held_out_labels,
        }


def replay_calibration(
    rows: Sequence[LabelledText],
    embed: Callable[[Sequence[str]], npt.NDArray[np.float32]],
    matcher: Matcher,
    guards: Sequence[Guard],
    *,
    target_false_hit: float | None,
    ood: Sequence[str],
    plan: ReplayPlan,
    k: int = 8,
    threshold: float | None = None,
    scopes: Sequence[str] | None = None,
) -> ReplayCalibration:
    """Replay `rows` as served traffic (module docstring) and tune the threshold on it
    (`target_false_hit`), or measure a given `threshold`. `embed` turns texts into the
    matcher's vectors. Raises InvalidRequestError when tuning finds no certified threshold."""
    stream = serving_stream(rows, ood, plan, scopes)
    vectors = embed([r.text for r in stream.texts] + stream.ood_left)
    stream_vectors, left_vectors = vectors[: len(stream.texts)], vectors[len(stream.texts) :]
    cases = replay_lookups(
        stream.texts, stream_vectors, k=k, held_out=stream.held_out, scopes=stream.scopes
    )
    domain = [i for i, r in enumerate(stream.texts) if not r.label.startswith(OOD_LABEL)]
    floor = ood_floor(
        stream.ood_left,
        left_vectors,
        Embedded(stream.texts, stream_vectors).rows(recurring(stream.texts, domain)),
        matcher,
        guards,
        k=k,
    )
    if threshold is None:
        assert target_false_hit is not None
        evaluation = tune_lookups(
            cases, matcher, target_false_hit=target_false_hit, guards=guards, floor=floor
        )
    else:
        evaluation = evaluate_lookups(cases, matcher, threshold, guards=guards)
    return ReplayCalibration(
        evaluation,
        floor,
        stream=len(stream.texts),
        ood=len(stream.texts) - len(domain),
        ood_floor_texts=len(stream.ood_left),
        held_out_labels=len(stream.held_out),
    )
