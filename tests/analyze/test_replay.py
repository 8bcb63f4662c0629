"""The replay drives the real `Cache` (exact, semantic) on a manual clock and the engine's radix
tree below it; these tests pin what it counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infercache.analyze.analysis import Analysis
from infercache.analyze.cost_model import CostModel
from infercache.analyze.replay import ReplayResult
from infercache.analyze.replay_store import CompactMemoryStore
from infercache.analyze.report_json import to_json
from infercache.analyze.reports import replay_numbers
from infercache.clock import ManualClock
from infercache.stores.base import Entry
from infercache.stores.memory import MemoryStore
from tests.analyze.conftest import RunAnalysis
from tests.analyze.generators import write_lines

SYSTEM = "You are terse. " * 40


def strategy(result: ReplayResult, name: str, cost: CostModel) -> dict[str, Any]:
    """One strategy's figures as the JSON document holds them."""
    figures: dict[str, Any] = to_json(replay_numbers.strategy(result, name, cost))
    return figures


def layered(result: ReplayResult, cost: CostModel) -> dict[str, Any]:
    figures: dict[str, Any] = to_json(replay_numbers.layered(result, cost))
    return figures


def request(question: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "temperature": 0,
        **extra,
    }


def answer(completion_tokens: int) -> dict[str, Any]:
    text = "x" * (4 * completion_tokens)
    return {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": completion_tokens},
    }  # fmt: skip


def replay(
    tmp_path: Path, run_analysis: RunAnalysis, records: list[dict[str, Any]], **kw: Any
) -> Analysis:
    path = write_lines(tmp_path / "log.jsonl", [json.dumps(r) for r in records])
    return run_analysis([path], **kw)


def test_a_repeat_within_the_ttl_is_an_exact_hit_and_one_after_it_a_miss(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    records = [
        {"timestamp": 0.0, "request": request("q"), "response": answer(30)},
        {"timestamp": 50.0, "request": request("q")},
        {"timestamp": 500.0, "request": request("q")},  # the entry from t=0 expired at 100
    ]
    analysis = replay(tmp_path, run_analysis, records, ttl_s=100)
    exact = strategy(analysis.replays["layered"], "exact", analysis.cost)
    assert (exact["hits"], exact["lookups"]) == (1, 3)
    assert exact["misses"] == {"absent": 1, "expired": 1}
    assert exact["completion_tokens_saved"] == 30  # what the stored answer's usage says
    assert exact["age_s"]["max_s"] == 50.0
    assert analysis.replays["layered"].served["exact"] == 1


def test_sampled_requests_are_never_served_but_still_reach_the_prefix_cache(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    records = [{"timestamp": float(t), "request": request("q", temperature=0.9)} for t in range(3)]
    analysis = replay(tmp_path, run_analysis, records)
    result = analysis.replays["layered"]
    assert strategy(result, "exact", analysis.cost)["misses"] == {"uncacheable": 3}
    prefix = strategy(result, "prefix", analysis.cost)
    assert (prefix["lookups"], prefix["hits"]) == (3, 2)


def test_requests_answered_by_a_cache_never_reach_the_engine(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    records = [{"timestamp": float(t), "request": request(f"q{t % 2}")} for t in range(6)]
    analysis = replay(tmp_path, run_analysis, records)
    under = strategy(analysis.replays["layered"], "prefix", analysis.cost)
    alone = strategy(analysis.replays["prefix"], "prefix", analysis.cost)
    assert analysis.replays["layered"].served["exact"] == 4
    assert under["lookups"] == 2
    assert alone["lookups"] == 6
    figures = layered(analysis.replays["layered"], analysis.cost)
    assert figures["hit_rate"] == pytest.approx(4 / 6)
    assert figures["prompt_tokens_saved"] == (
        strategy(analysis.replays["layered"], "exact", analysis.cost)["prompt_tokens_saved"]
        + under["prompt_tokens_saved"]
    )


def test_a_small_exact_store_evicts_and_answers_less(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    records = [
        {"timestamp": float(t), "request": request(f"q{t % 20}"), "response": answer(2000)}
        for t in range(200)
    ]
    # 20 answers of ~8 KB: all fit in 1 GiB, only a few in 40 KB (LRU, cycled: none survive)
    big = replay(tmp_path, run_analysis, records, exact_capacity_bytes=1 << 30)
    small = replay(tmp_path, run_analysis, records, exact_capacity_bytes=40_000)
    assert strategy(big.replays["layered"], "exact", big.cost)["hits"] == 180
    assert strategy(small.replays["layered"], "exact", small.cost)["hits"] == 0


def test_measured_latency_is_what_a_hit_saves_and_estimates_are_counted(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    gateway_miss = {"timestamp": 0.0, "request": request("q"), "layer": "miss",
                    "latency_ms": 2500.0, "completion_tokens": 40}  # fmt: skip
    records = [gateway_miss, {"timestamp": 1.0, "request": request("q")}]
    analysis = replay(tmp_path, run_analysis, records)
    exact = strategy(analysis.replays["layered"], "exact", analysis.cost)
    assert exact["upstream_s_saved"] == pytest.approx(2.5)
    assert exact["completion_tokens_saved"] == 40  # from the record: the log had no response
    totals = analysis.replays["layered"].totals
    assert totals.seconds.estimated_calls == 1  # the second line carries no latency


def test_a_log_without_timestamps_replays_as_one_instant(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    analysis = replay(tmp_path, run_analysis, [request("q"), request("q"), request("r")])
    assert analysis.replays["layered"].served["exact"] == 1
    assert analysis.census.timed == 0
    assert analysis.census.total.requests == 3


def test_sweeps_replay_each_ttl_and_capacity(tmp_path: Path, run_analysis: RunAnalysis) -> None:
    records = [{"timestamp": 100.0 * t, "request": request(f"q{t % 3}")} for t in range(30)]
    analysis = replay(
        tmp_path, run_analysis, records, sweep=True, ttl_grid_s=(50.0, 1000.0, 10_000.0),
        capacity_factors=(0.5, 1.0),
    )  # fmt: skip
    hits = [
        strategy(analysis.replays[f"ttl:{t}"], "exact", analysis.cost)["hits"]
        for t in (50, 1000, 10000)
    ]
    # Each question returns every 300 s. An entry lives TTL seconds from its miss (hits do
    # not extend it): 1000 s gives 3 hits, a miss, 3 hits, a miss, 1 hit, per question.
    assert hits == [0, 21, 27]
    assert {"exact_capacity:0.5", "exact_capacity:1"} <= set(analysis.replays)


def test_a_request_the_cache_refuses_is_skipped_not_fatal(
    tmp_path: Path, run_analysis: RunAnalysis
) -> None:
    contradictory = request("q", infercache={"cache_control": ["no-cache", "only-if-cached"]})
    records = [
        {"timestamp": 0.0, "request": contradictory},
        {"timestamp": 1.0, "request": request("q")},
    ]
    analysis = replay(tmp_path, run_analysis, records)
    skipped = analysis.replays["layered"].skipped
    assert sum(skipped.values()) == 1
    assert "contradict" in next(iter(skipped))
    assert analysis.census.total.requests == 2


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(50, 400), st.floats(0.0, 30.0)), max_size=60),
    st.integers(400, 3000),
)
def test_the_replay_store_keeps_the_same_live_entries_as_the_memory_store(
    steps: list[tuple[int, int, float]], capacity: int
) -> None:
    """Same puts, same clock: the same live entries with the same bodies, so the same hits; a
    key whose entry expired still reads as expired (orjson's oversized buffers are copied)."""
    clock = ManualClock(start_s=0.0)
    plain = MemoryStore(max_bytes=capacity, clock=clock)
    compact = CompactMemoryStore(max_bytes=capacity, clock=clock)
    for key_no, size, advance in steps:
        clock.advance(advance)
        key = f"k{key_no}"
        now = clock.now_s()
        for store in (plain, compact):
            found = store.get(key)
            if found is not None and found.expires_at_s <= now:
                store.delete(key)  # what the exact layer does with an expired entry
        entry = Entry(
            response=orjson.dumps({"x": "y" * size}),
            model="m",
            model_version="v",
            tags=(),
            created_at_s=now,
            expires_at_s=now + 20.0,
            upstream_s=1.0,
            prompt_tokens=1,
            completion_tokens=1,
        )
        plain.put(key, entry)
        compact.put(key, entry)
        live = {k for k, e in plain.scan("") if e.expires_at_s > now}
        assert live == {k for k, e in compact.scan("") if e.expires_at_s > now}
        for k, e in plain.scan(""):
            if e.expires_at_s > now:
                assert compact.get(k) == e
            else:  # still held by the memory store, expired: the replay store says so too
                found = compact.get(k)
                assert found is not None
                assert found.expires_at_s <= now
