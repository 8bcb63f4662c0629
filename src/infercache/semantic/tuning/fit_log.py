"""`tune REQUEST_LOG --fit`: a matcher fitted on the earlier part of the deployment's own log and
calibrated on the later part, in time order, as it will be served.

Steps (`fit_log`), on the labelled texts of request_log.py (labels from a judge):
  1. Embed every distinct text once with the base embedder.
  2. Split the log in time: the earlier `fit_share` (half) and the later rest.
  3. Fit model A on the earlier part (`fit_part`): the adapter (fit.py's SupCon) on its first
     `adapter_share` in time, the head on the rest of it, from lookups replayed in order through
     a cache that starts empty (replay.py) — as served, out-of-domain questions interleaved —
     plus the same replay with 30% of the labels held out (answers not cached yet) and every
     text against all the others. The head and the calibration see disjoint halves of the
     out-of-domain set.
  4. Calibrate A on the later part: replayed in order from an empty cache (its scopes kept),
     with out-of-domain questions interleaved; each lookup's serving ceiling under A and
     whether its answer is right is one judged outcome.
  5. Cross-fit (`cross_fit`, on by default): model B is fitted on the later part the same way
     and replayed on the earlier part, so every request of the log yields an outcome from a
     model that never saw it. One day holds too few served answers to bound a 1% rate from its
     later half alone (a bound that low needs ~300 answers served with none wrong); pooling
     the two halves doubles them.
  6. The threshold, on A's probability scale, is the one fixed-sequence testing certifies on
     the pooled outcomes (cache_sim.certify), never below A's floor (what the out-of-domain
     set reaches against the whole log, replay.ood_floor). Model A is the one served.
What the bound covers: the share of wrong answers among the answers served, on lookups replayed
from an empty cache, by models fitted with this procedure on one half of this log and applied
to the other half; pooled over both halves, at 95% one-sided (Wilson). It does not cover model
A alone (half the outcomes are B's), traffic unlike the log's (another domain, a shifted mix),
a cache that starts full, or a judge's own mistakes in labelling the log.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from infercache.errors import InvalidRequestError
from infercache.semantic.embedder import Embedder, l2_normalise
from infercache.semantic.guards import Guard
from infercache.semantic.matcher import FittedMatcher
from infercache.semantic.tuning.cache_sim import (
    Embedded,
    LookupCase,
    ceilings,
    certify,
    simulate_lookups,
)
from infercache.semantic.tuning.fit import (
    FitBase,
    FitOptions,
    FitProgress,
    background_similarity,
    embed_all,
    head_cases_rows,
    train_adapter,
    train_head,
)
from infercache.semantic.tuning.intents import LabelledText
from infercache.semantic.tuning.replay import (
    ReplayPlan,
    ood_floor,
    recurring,
    replay_lookups,
    serving_stream,
)
from infercache.semantic.tuning.request_log import LoggedTexts

Vectors = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class LogFitOptions:
    target_false_hit: float = 0.01
    fit_share: float = 0.5
    adapter_share: float = 0.6
    cross_fit: bool = True
    epochs: int = 30
    k: int = 8
    seed: int = 0
    guards: Sequence[Guard] = field(default_factory=tuple)
    ood: Sequence[str] = ()
    ood_share: float = 0.1
    min_seen: int = 2  # matcher.Head.min_seen: a one-off answer is never served

    def fit_options(self) -> FitOptions:
        return FitOptions(
            target_false_hit=self.target_false_hit,
            epochs=self.epochs,
            k=self.k,
            seed=self.seed,
            guards=self.guards,
        )


@dataclass(frozen=True, slots=True)
class Part:
    rows: list[LabelledText]
    scopes: list[str]


@dataclass(frozen=True, slots=True)
class Fitted:
    adapter: Vectors
    matcher: FittedMatcher


@dataclass(frozen=True, slots=True)
class LogFitResult:
    directory: Path
    matcher: FittedMatcher
    threshold: float
    report: dict[str, Any]


class _Vectors:
    """Base vectors by text, embedded once (`need` embeds the texts not seen yet)."""

    def __init__(self, base: Embedder, progress: FitProgress | None) -> None:
        self._base = base
        self._progress = progress
        self._known: dict[str, Vectors] = {}

    def need(self, texts: Sequence[str]) -> None:
        new = [t for t in dict.fromkeys(texts) if t not in self._known]
        if new:
            self._known.update(zip(new, embed_all(self._base, new, self._progress), strict=True))

    def of(self, texts: Sequence[str], adapter: Vectors | None = None) -> Vectors:
        self.need(texts)
        if not texts:
            return np.zeros((0, self._base.dim), np.float32)
        stacked = np.stack([self._known[t] for t in texts])
        return stacked if adapter is None else l2_normalise(stacked @ adapter.T)


def fit_log(
    logged: LoggedTexts,
    fit_base: FitBase,
    *,
    options: LogFitOptions | None = None,
    progress: FitProgress | None = None,
) -> LogFitResult:
    o = options or LogFitOptions()
    started = time.monotonic()
    cut = round(o.fit_share * len(logged.rows))
    early = Part(logged.rows[:cut], logged.scopes[:cut])
    late = Part(logged.rows[cut:], logged.scopes[cut:])
    if min(len(early.rows), len(late.rows)) < 20:
        raise InvalidRequestError(
            f"a log of {len(logged.rows)} usable requests is too short to fit and calibrate on"
        )
    vectors = _Vectors(fit_base.embedder, progress)
    vectors.need([r.text for r in logged.rows])
    model_a = fit_part(early, vectors, o, progress)
    parts = [calibration_outcomes(model_a, late, vectors, o, seed=o.seed)]
    if o.cross_fit:
        model_b = fit_part(late, vectors, o, progress)
        parts.append(calibration_outcomes(model_b, early, vectors, o, seed=o.seed + 1))
    floor = _floor(model_a, logged, vectors, o)
    pooled = [outcome for part in parts for outcome in part.judged]
    threshold = certify(
        pooled,
        target_false_hit=o.target_false_hit,
        floor=floor,
        lookups=sum(part.lookups for part in parts),
        fitted=True,
    )
    report = _report(logged, early, late, parts, threshold, floor, o, started)
    served = fit_base.save(model_a.adapter, model_a.matcher.head, report)
    return LogFitResult(fit_base.out_dir, served, threshold, report)


def fit_part(
    part: Part, vectors: _Vectors, o: LogFitOptions, progress: FitProgress | None = None
) -> Fitted:
    """Adapter on the part's first `adapter_share` in time, head on the rest (step 3)."""
    cut = round(o.adapter_share * len(part.rows))
    adapter_rows, head = part.rows[:cut], Part(part.rows[cut:], part.scopes[cut:])
    fit_o = o.fit_options()
    adapter = train_adapter(
        vectors.of([r.text for r in adapter_rows]), [r.label for r in adapter_rows], fit_o, progress
    )
    head_vectors = vectors.of([r.text for r in head.rows], adapter)
    labels = [r.label for r in head.rows]
    background = background_similarity(head_vectors, labels, o.seed)
    cases = _head_lookups(head, vectors, adapter, o)
    trained = train_head(
        head_cases_rows(cases, background), o.k, background=background, min_seen=o.min_seen
    )
    return Fitted(adapter, FittedMatcher(trained, "fitted:candidate"))


def _head_lookups(
    part: Part, vectors: _Vectors, adapter: Vectors, o: LogFitOptions
) -> list[LookupCase]:
    """The head's examples: the part replayed as served with out-of-domain questions of the
    head's own half of the set interleaved, the same with 30% of the labels held out, and
    every text against all the others."""
    plan = ReplayPlan(held_out_share=0.0, ood_share=o.ood_share, seed=o.seed, shuffle=False)
    stream = serving_stream(part.rows, _ood_half(o, 0), plan, part.scopes)
    stream_vectors = vectors.of([r.text for r in stream.texts], adapter)
    rng = np.random.default_rng(o.seed)
    labels = sorted({r.label for r in part.rows})
    held = frozenset(labels[int(i)] for i in np.flatnonzero(rng.random(len(labels)) < 0.3))
    own = Embedded(part.rows, vectors.of([r.text for r in part.rows], adapter))
    return [
        *replay_lookups(stream.texts, stream_vectors, k=o.k, scopes=stream.scopes),
        *replay_lookups(stream.texts, stream_vectors, k=o.k, scopes=stream.scopes, held_out=held),
        *simulate_lookups(own, own, k=o.k),
    ]


def _ood_half(o: LogFitOptions, half: int) -> list[str]:
    """The out-of-domain set split in two by position: 0 trains the head, 1 calibrates."""
    return list(o.ood[half::2])


@dataclass(frozen=True, slots=True)
class CalibrationOutcomes:
    judged: list[tuple[float, bool]]  # (serving ceiling, right) per lookup served at some score
    lookups: int
    answerable: int  # lookups with a right answer among their candidates
    ood: int  # out-of-domain questions interleaved in the replay


def calibration_outcomes(
    model: Fitted, part: Part, vectors: _Vectors, o: LogFitOptions, *, seed: int
) -> CalibrationOutcomes:
    """Every lookup of `part` replayed under `model` (step 4)."""
    plan = ReplayPlan(held_out_share=0.0, ood_share=o.ood_share, seed=seed, shuffle=False)
    stream = serving_stream(part.rows, _ood_half(o, 1), plan, part.scopes)
    stream_vectors = vectors.of([r.text for r in stream.texts], model.adapter)
    cases = replay_lookups(stream.texts, stream_vectors, k=o.k, scopes=stream.scopes)
    judged = ceilings(cases, model.matcher, o.guards)
    ood = len(stream.texts) - len(part.rows)
    return CalibrationOutcomes(judged, len(cases), sum(c.answerable for c in cases), ood)


def _floor(model: Fitted, logged: LoggedTexts, vectors: _Vectors, o: LogFitOptions) -> float | None:
    if not o.ood:
        return None
    unique = list({r.text: r for r in logged.rows}.values())
    domain = [unique[i] for i in recurring(unique, range(len(unique)))]
    ood = _ood_half(o, 1)
    return ood_floor(
        ood,
        vectors.of(ood, model.adapter),
        Embedded(domain, vectors.of([r.text for r in domain], model.adapter)),
        model.matcher,
        o.guards,
        k=o.k,
    )


def _report(
    logged: LoggedTexts,
    early: Part,
    late: Part,
    parts: Sequence[CalibrationOutcomes],
    threshold: float,
    floor: float | None,
    o: LogFitOptions,
    started: float,
) -> dict[str, Any]:
    from infercache.semantic.tuning.calibrate import wilson_upper

    def served(outcomes: CalibrationOutcomes) -> tuple[int, int]:
        rights = [right for score, right in outcomes.judged if score >= threshold]
        return len(rights), len(rights) - sum(rights)

    n, wrong = (sum(x) for x in zip(*(served(part) for part in parts), strict=True))
    answerable = sum(part.answerable for part in parts)
    own_n, own_wrong = served(parts[0])
    return {
        "kind": "lookups",
        "counted": "lookups",
        "source": "request log",
        "requests": len(logged.rows),
        "labels": len({r.label for r in logged.rows}),
        "split": {"earlier": len(early.rows), "later": len(late.rows)},
        "cross_fit": o.cross_fit,
        "threshold": threshold,
        "floor": floor,
        "pairs": sum(part.lookups for part in parts),
        "positives": answerable,
        "negatives": sum(part.lookups for part in parts) - answerable,
        "served": n,
        "hits": n - wrong,
        "false_hits": wrong,
        "hit_rate": (n - wrong) / answerable if answerable else None,
        "false_hit_rate": wrong / n if n else None,
        "false_hit_upper": wilson_upper(wrong, n) if n else None,
        "later_part": {"lookups": parts[0].lookups, "served": own_n, "wrong": own_wrong},
        "held_out_labels": 0,
        "ood_in_stream": sum(part.ood for part in parts),
        "ood_for_floor": len(o.ood[1::2]),
        "guards": [g.name for g in o.guards],
        "ood": len(o.ood),
        "epochs": o.epochs,
        "seconds": round(time.monotonic() - started, 1),
    }
