"""The model runner and the prefix cache on a tiny random model: exact reuse, what gets
cached, the KV budget, finish reasons, streaming, cancellation, failures, and batches whose
sequences give the tokens they give alone."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from infercache.clock import SystemClock
from infercache.engine.config import BatchLimits
from infercache.engine.model import LlamaModel
from infercache.engine.prefix_cache import PrefixCache
from infercache.engine.runner import Runner
from infercache.engine.sampling import SamplingParams
from infercache.engine.sequence import GenerationRequest, NullSink, Sequence
from infercache.engine.tokenizer import ChatTokenizer
from infercache.errors import InfercacheError

CONTEXT = 512
Parts = tuple[LlamaModel, ChatTokenizer]


@pytest.fixture(scope="module")
def parts(tiny_dir: Path) -> Parts:
    from infercache.engine.weights import load_checkpoint

    ck = load_checkpoint(tiny_dir)
    return LlamaModel(ck.spec, ck.tensors), ChatTokenizer(ck.tokenizer, ck.eos_token_ids)


def runner(
    parts: Parts,
    *,
    cache: bool = True,
    max_kv_tokens: int = 10_000,
    tokenizer: ChatTokenizer | None = None,
    **limits: Any,
) -> Runner:
    model, tok = parts
    prefix = None
    if cache:
        prefix = PrefixCache(
            model.kv_shape, max_kv_bytes=max_kv_tokens * model.kv_shape.bytes_per_token
        )
    return Runner(
        model,
        tokenizer or tok,
        prefix_cache=prefix,
        clock=SystemClock(),
        max_context_tokens=CONTEXT,
        limits=BatchLimits(**limits),
    )


def prompt(n: int, seed: int = 0) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(int(t) for t in torch.randint(3, 420, (n,), generator=g))


def greedy(max_tokens: int = 8, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, **kw)


def request(p: tuple[int, ...], max_tokens: int = 8, **kw: Any) -> GenerationRequest:
    return GenerationRequest(p, greedy(max_tokens), **kw)


def run_all(r: Runner) -> None:
    while r.has_work():
        r.step()


def outcome(seq: Sequence) -> Any:
    assert isinstance(seq.sink, NullSink)
    assert seq.sink.error is None
    assert seq.sink.result is not None
    return seq.sink.result


def test_reused_prefix_gives_the_same_logits_and_tokens_as_a_full_prefill(parts: Parts) -> None:
    warm, cold = runner(parts), runner(parts, cache=False)
    shared = prompt(100)
    warm.generate(request(shared + prompt(5, 1)))
    for seed in range(2, 6):
        p = shared + prompt(12, seed)
        a, b = warm.submit(request(p, 6)), cold.submit(request(p, 6))
        while warm.has_work() or cold.has_work():
            ra, rb = warm.step(), cold.step()
            assert ra.logits is not None
            assert rb.logits is not None
            assert (ra.logits - rb.logits).abs().max().item() < 1e-4
        assert (a.reused_tokens, b.reused_tokens) == (100, 0)
        assert outcome(a).token_ids == outcome(b).token_ids


def test_prompt_and_generated_tokens_are_cached_for_the_next_turn(parts: Parts) -> None:
    r = runner(parts)
    first = prompt(40)
    result = r.generate(request(first, 6))
    assert result.finish_reason == "length"
    assert len(result.token_ids) == 6
    # The last sampled token never went through the model, so its KV does not exist.
    next_turn = first + result.token_ids + prompt(10, 3)
    assert r.generate(request(next_turn, 1)).stats.cached_tokens == 40 + 5


def test_an_identical_prompt_recomputes_only_its_last_token(parts: Parts) -> None:
    r = runner(parts)
    p = prompt(30)
    r.generate(request(p, 1))
    assert r.generate(request(p, 1)).stats.cached_tokens == 29


def test_namespaces_do_not_reuse_each_others_kv(parts: Parts) -> None:
    r = runner(parts)
    p = prompt(30)
    r.generate(request(p, 1, namespace="tenant:a"))
    assert r.generate(request(p, 1, namespace="tenant:b")).stats.cached_tokens == 0


def test_kv_memory_stays_within_budget_and_old_prefixes_are_evicted(parts: Parts) -> None:
    r = runner(parts, max_kv_tokens=100)
    cache = r.prefix_cache
    assert cache is not None
    evicted = 0
    for seed in range(6):
        result = r.generate(request(prompt(40, seed), 3))
        evicted += result.stats.evicted_tokens
        stats = cache.stats()
        assert stats.total_bytes <= 100 * cache.bytes_per_token
        used_tokens = cache.pool.capacity_tokens - cache.pool.free_tokens
        assert stats.total_bytes == used_tokens * cache.bytes_per_token
        assert stats.locked_bytes == 0
    assert evicted > 0
    assert r.generate(request(prompt(40, 5), 1)).stats.cached_tokens == 39
    assert r.generate(request(prompt(40, 0), 1)).stats.cached_tokens == 0


def test_a_prompt_larger_than_the_budget_caches_only_what_fits(parts: Parts) -> None:
    r = runner(parts, max_kv_tokens=16)
    p = prompt(40)
    r.generate(request(p, 1))
    assert r.generate(request(p, 1)).stats.cached_tokens == 16


def test_a_failed_step_fails_its_sequences_unlocks_and_caches_nothing(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = runner(parts)
    cache = r.prefix_cache
    assert cache is not None
    r.generate(request(prompt(20), 1))
    before = cache.stats()

    def broken(*_args: Any, **_kwargs: Any) -> torch.Tensor:
        raise RuntimeError("out of memory, say")

    with monkeypatch.context() as m:
        m.setattr(r.model, "forward_batch", broken)
        with pytest.raises(InfercacheError, match="out of memory"):
            r.generate(request(prompt(20) + prompt(30, 9)))
    assert cache.stats() == before
    assert all(node.lock_count == 0 for node in cache.tree.nodes())
    assert r.running == []
    assert r.generate(request(prompt(20) + prompt(30, 9), 2)).stats.cached_tokens == 20


def test_streamed_deltas_add_up_to_the_text(parts: Parts) -> None:
    deltas: list[str] = []
    result = runner(parts).generate(request(prompt(10), 20), on_text=deltas.append)
    assert "".join(deltas) == result.text
    assert result.text == parts[1].decode(result.token_ids)


def test_a_stop_string_ends_generation_and_is_trimmed(parts: Parts) -> None:
    r = runner(parts, cache=False)
    p = prompt(10)
    full = r.generate(request(p, 20)).text
    stop = full[5:8]
    cut = r.generate(GenerationRequest(p, greedy(20, stop=(stop,))))
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.index(stop)]


def test_end_of_sequence_token_finishes_with_stop(parts: Parts) -> None:
    _model, tok = parts
    p = prompt(10)
    first = runner(parts).generate(request(p, 1)).token_ids[0]
    eos_is_first = ChatTokenizer(tok._hf, frozenset({first}))
    result = runner(parts, tokenizer=eos_is_first).generate(request(p))
    assert result.finish_reason == "stop"
    assert result.text == ""
    assert result.token_ids == (first,)
    ignoring = runner(parts, tokenizer=eos_is_first).generate(
        GenerationRequest(p, greedy(6, ignore_eos=True))
    )
    assert (ignoring.finish_reason, len(ignoring.token_ids)) == ("length", 6)


def test_cancellation_stops_between_steps(parts: Parts) -> None:
    calls = iter(range(100))
    result = runner(parts).generate(request(prompt(10), 50), cancelled=lambda: next(calls) >= 3)
    assert result.finish_reason == "cancelled"
    assert len(result.token_ids) == 3


def test_stats_account_for_every_prompt_token(parts: Parts) -> None:
    r = runner(parts)
    r.generate(request(prompt(50), 2))
    stats = r.generate(request(prompt(50) + prompt(7, 4), 2)).stats
    assert (stats.prompt_tokens, stats.cached_tokens, stats.completion_tokens) == (57, 50, 2)
    assert 0 < stats.prefill_s <= stats.ttft_s
    assert stats.decode_s > 0
    assert stats.lookup_s > 0
    assert stats.store_s > 0  # the 7 new prompt tokens and 1 generated token were cached


def test_a_prompt_without_room_in_the_context_is_refused(parts: Parts) -> None:
    with pytest.raises(ValueError, match="no room"):
        runner(parts).submit(request(prompt(CONTEXT)))


# -- batches ---------------------------------------------------------------------------------


def test_a_batch_gives_each_sequence_the_tokens_it_gets_alone(parts: Parts) -> None:
    """Mixed lengths, arrivals spread over the steps, prompts chunked, each sequence with its
    own sampling (greedy, or seeded with a temperature and top_p), max_tokens and stop string:
    each gets its solo tokens and text (the tiny model's logits have no near-ties)."""
    prompts = [prompt(n, seed) for seed, n in enumerate([5, 90, 17, 200, 33, 64, 1, 120])]
    samplings = [
        SamplingParams(12 - i % 3, temperature=0.9 * (i % 2), top_p=1 - 0.1 * (i % 4), seed=i)
        for i in range(len(prompts))
    ]
    solo = [
        runner(parts, cache=False).generate(GenerationRequest(p, s))
        for p, s in zip(prompts, samplings, strict=True)
    ]
    stops = [(r.text[3:5],) if i % 4 == 3 and len(r.text) > 5 else () for i, r in enumerate(solo)]
    samplings = [replace(s, stop=stop) for s, stop in zip(samplings, stops, strict=True)]
    solo = [
        runner(parts, cache=False).generate(GenerationRequest(p, s))
        for p, s in zip(prompts, samplings, strict=True)
    ]
    assert any(r.finish_reason == "stop" for r in solo)
    for cache in (False, True):
        r = runner(parts, cache=cache, max_batch=4, max_step_tokens=48)
        seqs: list[Sequence] = []
        for i, (p, s) in enumerate(zip(prompts, samplings, strict=True)):
            seqs.append(r.submit(GenerationRequest(p, s)))
            if i % 3 == 2:
                r.step()
        sizes = []
        while r.has_work():
            sizes.append(r.step().sequences)
            assert len(r.running) <= 4
        assert max(sizes) == 4
        assert [outcome(s).token_ids for s in seqs] == [r.token_ids for r in solo]
        assert [outcome(s).text for s in seqs] == [r.text for r in solo]
        assert [outcome(s).finish_reason for s in seqs] == [r.finish_reason for r in solo]


def test_decodes_run_every_step_while_a_long_prompt_is_prefilled_in_chunks(
    parts: Parts,
) -> None:
    r = runner(parts, cache=False, max_step_tokens=40)
    short = r.submit(request(prompt(8), 30))
    r.step()  # the short prompt is prefilled and samples its first token
    long = r.submit(request(prompt(300, 1), 2))
    plans = []
    while long.prefilling or long.computed == 0:
        before = len(short.generated)
        report = r.step()
        plans.append((report.decode_tokens, report.prefill_tokens))
        assert len(short.generated) == before + 1  # never stalled by the long prompt
    assert plans == [(1, 39)] * 7 + [(1, 27)]
    assert sum(p for _, p in plans) == 300


def test_the_running_budget_queues_a_sequence_until_there_is_room(parts: Parts) -> None:
    r = runner(parts, cache=False, max_running_tokens=100)
    a = r.submit(request(prompt(60), 20))
    b = r.submit(request(prompt(60, 1), 20))
    r.step()
    assert r.running == [a]
    assert b.admitted_s is None
    run_all(r)
    assert outcome(b).finish_reason == "length"
    big = r.submit(request(prompt(300, 2), 2))  # more than the budget: it runs alone
    run_all(r)
    assert outcome(big).finish_reason == "length"


def test_a_cancelled_sequence_leaves_the_batch_and_gives_its_memory_back_at_once(
    parts: Parts,
) -> None:
    r = runner(parts)
    cache = r.prefix_cache
    assert cache is not None
    keep, drop = r.submit(request(prompt(30), 20)), r.submit(request(prompt(30, 1), 20))
    r.step()
    r.step()
    assert cache.stats().locked_bytes == 0  # nothing cached yet, so no lock holds bytes
    drop.cancel.set()
    r.step()
    assert r.running == [keep]
    assert drop.workspace is None
    assert r.scheduler.reserved_tokens == keep.reserved_tokens
    assert outcome(drop).finish_reason == "cancelled"
    run_all(r)
    assert len(outcome(keep).token_ids) == 20
