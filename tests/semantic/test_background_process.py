"""Shadow mode's refit in a worker process at the lowest CPU priority (background_process.py):
the worker really is another process at nice 19 and SCHED_IDLE, and a refit run there decides
exactly what the same refit decides in the calling thread."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from infercache.semantic.background_process import LowPriorityWorker
from infercache.semantic.matcher import CosineMatcher, FittedMatcher, Matcher
from infercache.semantic.shadow_fit import Judged, ShadowFit, pack, unpack
from tests.semantic.test_shadow_fit import Inline, judgments


@pytest.fixture(scope="module")
def worker() -> Iterator[LowPriorityWorker]:
    started = LowPriorityWorker()
    yield started
    started.close()


def test_the_worker_is_another_process_at_the_lowest_priority(worker: LowPriorityWorker) -> None:
    assert worker.run(os.getpid) != os.getpid()
    assert worker.run(os.getpriority, os.PRIO_PROCESS, 0) == 19
    assert worker.run(os.sched_getscheduler, 0) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) != os.SCHED_IDLE
    assert os.getpriority(os.PRIO_PROCESS, 0) < 19  # the caller keeps its own
    with pytest.raises(ZeroDivisionError):
        worker.run(divmod, 1, 0)


def test_packing_keeps_every_judgment() -> None:
    judged = [Judged(tuple(n), i % 2, w) for i, (n, w) in enumerate(judgments(50, seed=4))]
    assert unpack(pack(judged)) == judged


def _refit(compute: LowPriorityWorker | None) -> tuple[Matcher, list[tuple[float, bool]]]:
    switched: list[tuple[Matcher, list[tuple[float, bool]]]] = []
    fit = ShadowFit(
        Inline(), target_false_hit=0.05, min_pairs=60, on_switch=lambda *a: switched.append(a),
        current=CosineMatcher, refit_every=400, compute=compute,
    )  # fmt: skip
    for neighbours, wrong in judgments(400, seed=1):
        fit.add(neighbours, 0, wrong)
    assert (fit.refits, fit.switches) == (1, 1)
    return switched[0]


def test_a_refit_in_the_worker_switches_to_the_head_the_thread_would(
    worker: LowPriorityWorker,
) -> None:
    here_matcher, here_pairs = _refit(None)
    there_matcher, there_pairs = _refit(worker)
    assert isinstance(here_matcher, FittedMatcher)
    assert isinstance(there_matcher, FittedMatcher)
    assert there_matcher.head == here_matcher.head
    assert there_pairs == here_pairs


def test_a_closed_worker_runs_nothing_more_and_closing_the_refit_closes_it() -> None:
    compute = LowPriorityWorker()
    fit = ShadowFit(
        Inline(), target_false_hit=0.05, min_pairs=60, on_switch=lambda *a: None,
        current=CosineMatcher, refit_every=400, compute=compute,
    )  # fmt: skip
    assert compute.run(os.getpid) != os.getpid()  # started
    fit.close()
    with pytest.raises(RuntimeError, match="closed"):
        compute.run(os.getpid)
