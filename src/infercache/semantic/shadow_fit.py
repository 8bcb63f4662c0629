"""Shadow mode learns its matcher from the pairs it judges: a head refitted in the background.

In shadow the layer judges every miss's best candidate against the fresh answer (shadow.py).
Each judgment is kept here with what the matcher saw — the candidates' similarities, answers
and how many cached questions shared each answer (matcher.NearbyAnswer) — in time order, the
last `window` of them. Every `refit_every` new judgments a background refit (on the verifier's
executor, never on the request path; run in a worker process at the lowest CPU priority in a
gateway, background_process.py) does, in time order:
  1. fit a head (head_fit.py) on the earlier `fit_share` of the judgments: the features of the
     judged candidate (the background similarity being the 95th percentile of the judged-wrong
     candidates' similarities), labelled right or wrong;
  2. rescore the later judgments with it and with the matcher served now, and certify an
     operating point on each by the fixed-sequence test shadow mode serves by
     (shadow.operating_point);
  3. switch when the new head's point serves more of the later judgments than the current
     matcher's does (or the current one has none): the layer's matcher becomes the fitted head
     (`FittedMatcher` over the same embedder: no vector is re-embedded), and the live
     calibration is reset to the later judgments (those the head was not fitted on) rescored
     on the new scale (`on_switch`): a bound over the ones it learnt from would be optimistic.
Vectorised: the window is packed into a few numpy arrays (`pack`, which also crosses to the
worker), padded into one row per judgment (matcher.Candidates), and the judged candidates'
feature rows are computed once, in one numpy pass (matcher.features_at, equal to
matcher.features to the bit); the fitted head rescores from those same rows (its feature
parameters are the template's). A full window of 5,000 costs ~10–35 ms of one core
(bench/semantic_refit_cost.py; the judgment-by-judgment loops it replaced: 0.3–1.6 s).
Shadow mode's rule is unchanged: it serves at the certified point and returns to shadow when
none meets the bound. A judgment made under one matcher and applied after a switch is rescored
from its candidates, so scales never mix. Not persisted: after a restart the layer starts from
its configured matcher again (the calibration it resets is stored under the new matcher's name,
which a restart does not read). Thread-safe (one lock; the refit runs on one thread at a time).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from infercache.errors import InvalidRequestError
from infercache.semantic.background_process import LowPriorityWorker
from infercache.semantic.head_fit import fit_head
from infercache.semantic.layer_config import ShadowConfig
from infercache.semantic.matcher import (
    FEATURES,
    Candidates,
    CosineMatcher,
    FittedMatcher,
    Head,
    Matcher,
    NearbyAnswer,
    features_at,
)
from infercache.semantic.shadow import operating_point
from infercache.semantic.verify import Verifier

log = logging.getLogger(__name__)


class Judged(NamedTuple):
    neighbours: tuple[NearbyAnswer, ...]
    position: int  # which neighbour was judged
    wrong: bool


class ShadowFit:
    def __init__(
        self,
        executor: Executor,
        *,
        target_false_hit: float,
        min_pairs: int,
        on_switch: Callable[[Matcher, list[tuple[float, bool]]], None],
        current: Callable[[], Matcher],
        window: int = 5000,
        refit_every: int = 250,
        fit_share: float = 0.6,
        compute: LowPriorityWorker | None = None,
    ) -> None:
        self._executor = executor
        self._compute = compute
        self._target = target_false_hit
        self._min_pairs = min_pairs
        self._on_switch = on_switch
        self._current = current
        self._refit_every = refit_every
        self._fit_share = fit_share
        self._lock = threading.Lock()
        self._judged: deque[Judged] = deque(maxlen=window)
        self._since = 0
        self._running = False
        self.refits = 0
        self.switches = 0

    def close(self) -> None:
        """Stop the worker process a refit ran in (a refit after this fails, logged)."""
        if self._compute is not None:
            self._compute.close()

    def add(self, neighbours: Sequence[NearbyAnswer], position: int, wrong: bool) -> None:
        """One judgment; schedules a refit every `refit_every` of them (one at a time)."""
        with self._lock:
            self._judged.append(Judged(tuple(neighbours), position, wrong))
            self._since += 1
            if self._since < self._refit_every or self._running:
                return
            self._since, self._running = 0, True
            judged = list(self._judged)
        self._executor.submit(self._refit_logged, judged)

    def _refit_logged(self, judged: list[Judged]) -> None:
        try:
            self.refit(judged)
        except Exception as exc:  # noqa: BLE001 - a background refit never takes down serving
            log.warning("semantic shadow refit failed (the matcher is unchanged): %r", exc)
        finally:
            with self._lock:
                self._running = False

    def refit(self, judged: Sequence[Judged]) -> bool:
        """Steps 1–3 of the module docstring; whether the matcher was switched. Steps 1–2
        (`propose`) run where `compute` runs them: in this thread by default, in a worker
        process at the lowest CPU priority in a gateway (`shadow_fit_for`)."""
        self.refits += 1
        name = f"shadow-fit:{self.refits}"
        options = (self._fit_share, self._target, self._min_pairs, name)
        packed = pack(judged)
        if self._compute is None:
            proposal = propose(packed, self._current(), *options)
        else:
            proposal = self._compute.run(propose, packed, self._current(), *options)
        if proposal is None:
            return False
        self.switches += 1
        log.warning(
            "semantic shadow refit %d: a head fitted on %d judged pairs serves %d of the next "
            "%d within the bound (the matcher served until now: %s)",
            self.refits, proposal.fitted_on, proposal.served, proposal.later, proposal.served_now,
        )  # fmt: skip
        self._on_switch(proposal.matcher, proposal.pairs)
        return True


class Proposal(NamedTuple):
    """A head that serves more of the later judgments than the current matcher does."""

    matcher: FittedMatcher
    fitted_on: int  # judgments it was fitted on
    later: int  # judgments it was scored on
    served: int
    served_now: int | None  # what the current matcher serves of them (None: no point)
    pairs: list[tuple[float, bool]]  # the later judgments rescored on its scale


def propose(
    packed: Packed,
    current: Matcher,
    fit_share: float,
    target: float,
    min_pairs: int,
    name: str,
) -> Proposal | None:
    """Steps 1–2 of the module docstring on packed judgments (pure: the CPU-heavy part of a
    refit, what the worker process runs). Vectorised: the judged candidates' feature rows are
    computed once for the window in one numpy pass (matcher.features_at), fitted on, and
    rescored by the fitted head from the same rows."""
    wrong = packed.wrong
    cut = int(fit_share * len(wrong))
    if len(wrong) - cut < min_pairs:
        return None
    window = candidates(packed)
    background = _background(window, wrong)
    # fit_head keeps these feature parameters, so the fitted head's rows are these rows
    template = Head(weights=(0.0,) * FEATURES, bias=0.0, background=background)
    rows = features_at(window, template)
    right = np.where(wrong[:cut], 0.0, 1.0)
    try:
        head = fit_head(rows[:cut], right, int(packed.counts.max()), background=background)
    except InvalidRequestError:
        return None  # all right or all wrong so far: nothing to learn from
    fitted = FittedMatcher(head, name)
    scores = fitted.scores_of_rows(rows, window.seen[np.arange(len(wrong)), window.positions])
    new = _served(scores[cut:], wrong[cut:], target, min_pairs)
    now = _served(
        _scores_at(current, window.since(cut), packed, cut), wrong[cut:], target, min_pairs
    )
    if new is None or (now is not None and new <= now):
        return None
    # Only the judgments the head was not fitted on: its scores on those it learnt from would
    # make the live bound look better than it is.
    pairs = list(zip(scores[cut:].tolist(), wrong[cut:].tolist(), strict=True))
    return Proposal(fitted, cut, len(wrong) - cut, new, now, pairs)


def _scores_at(
    matcher: Matcher, window: Candidates, packed: Packed, start: int
) -> npt.NDArray[np.float64]:
    """`matcher`'s score of each judged candidate of `window` (packed's judgments from `start`):
    vectorised for the matchers this package has, judgment by judgment for any other."""
    if isinstance(matcher, FittedMatcher | CosineMatcher):
        return matcher.scores_at(window)
    return np.array([score_of(matcher, j) for j in unpack(packed)[start:]], dtype=np.float64)


def _served(
    scores: npt.NDArray[np.float64], wrong: npt.NDArray[np.bool_], target: float, min_pairs: int
) -> int | None:
    """How many of the judgments the certified point of `scores` serves (None: no point)."""
    point = operating_point(scores, wrong, target, min_pairs)
    return None if point.serving_at is None else int(np.sum(scores >= point.serving_at))


class Packed(NamedTuple):
    """Judgments as a few numpy arrays and the distinct answers: a refit in a worker process
    sends its whole window, and pickling 5,000 judgments' named tuples holds this process's GIL
    for hundreds of ms (arrays: well under one)."""

    counts: npt.NDArray[np.int64]  # neighbours per judgment
    similarities: npt.NDArray[np.float64]  # every neighbour, judgment after judgment
    answer_codes: npt.NDArray[np.int64]  # index into `answers`
    answers: list[str]
    seen: npt.NDArray[np.int64]
    positions: npt.NDArray[np.int64]
    wrong: npt.NDArray[np.bool_]


PACK_CHUNK = 200  # judgments packed between two yields of the GIL


def pack(judged: Sequence[Judged]) -> Packed:
    """Packed in chunks, yielding the GIL between them (`time.sleep(0)`): packing a full window
    is ~20k attribute reads, tens of ms under load, and a request thread waiting for the
    interpreter would otherwise wait up to the 5 ms switch interval at every step."""
    codes: dict[str, int] = {}
    counts: list[int] = []
    similarities: list[float] = []
    answer_codes: list[int] = []
    seen: list[int] = []
    for start in range(0, len(judged), PACK_CHUNK):
        for j in judged[start : start + PACK_CHUNK]:
            counts.append(len(j.neighbours))
            for n in j.neighbours:
                similarities.append(n.similarity)
                answer_codes.append(codes.setdefault(n.answer, len(codes)))
                seen.append(n.seen)
        time.sleep(0)
    return Packed(
        np.array(counts, dtype=np.int64),
        np.array(similarities, dtype=np.float64),
        np.array(answer_codes, dtype=np.int64),
        list(codes),
        np.array(seen, dtype=np.int64),
        np.array([j.position for j in judged], dtype=np.int64),
        np.array([j.wrong for j in judged], dtype=np.bool_),
    )


def unpack(packed: Packed) -> list[Judged]:
    similarities = packed.similarities.tolist()
    answers = [packed.answers[c] for c in packed.answer_codes.tolist()]
    seen = packed.seen.tolist()
    out, start = [], 0
    for count, position, wrong in zip(
        packed.counts.tolist(), packed.positions.tolist(), packed.wrong.tolist(), strict=True
    ):
        neighbours = tuple(
            NearbyAnswer(similarities[i], answers[i], seen[i]) for i in range(start, start + count)
        )
        out.append(Judged(neighbours, position, wrong))
        start += count
    return out


def candidates(packed: Packed) -> Candidates:
    """The packed judgments as padded rows (matcher.Candidates), an unknown answer coded -1."""
    counts = packed.counts
    width = int(counts.max()) if len(counts) else 0
    valid = np.arange(width) < counts[:, None]
    at = np.where(valid, (np.cumsum(counts) - counts)[:, None] + np.arange(width), 0)
    codes = packed.answer_codes[at] if len(packed.answer_codes) else np.zeros_like(at)
    if "" in packed.answers:
        codes = np.where(codes == packed.answers.index(""), -1, codes)
    similarities = packed.similarities[at] if len(packed.similarities) else np.zeros(at.shape)
    seen = packed.seen[at] if len(packed.seen) else np.zeros_like(at)
    return Candidates(similarities, codes, seen, counts, packed.positions)


def shadow_fit_for(
    shadow: ShadowConfig | None,
    verifier: Verifier | None,
    *,
    on_switch: Callable[[Matcher, list[tuple[float, bool]]], None],
    current: Callable[[], Matcher],
) -> ShadowFit | None:
    """The layer's background refit when it runs in shadow with `refit_every` set."""
    if shadow is None or verifier is None or not shadow.refit_every:
        return None
    return ShadowFit(
        verifier.executor,
        target_false_hit=shadow.target_false_hit,
        min_pairs=shadow.min_pairs,
        on_switch=on_switch,
        current=current,
        window=shadow.window,
        refit_every=shadow.refit_every,
        compute=LowPriorityWorker(),
    )


def score_of(matcher: Matcher, judged: Judged) -> float:
    return matcher.scores(judged.neighbours)[judged.position]


def _background(window: Candidates, wrong: npt.NDArray[np.bool_]) -> float:
    """How similar a wrong candidate gets: the 95th percentile of the judged-wrong ones."""
    judged = window.similarities[np.arange(len(wrong)), window.positions]
    return float(np.quantile(judged[wrong], 0.95)) if int(wrong.sum()) >= 20 else 0.5
