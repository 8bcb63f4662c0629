"""The generation loop and the prefix cache on a tiny random model: exact reuse, what gets
cached, the KV budget, finish reasons, streaming and cancellation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infercache.clock import SystemClock
from infercache.engine.model import LlamaModel
from infercache.engine.prefix_cache import PrefixCache
from infercache.engine.runner import GenerationRequest, Runner
from infercache.engine.sampling import SamplingParams
from infercache.engine.tokenizer import ChatTokenizer
from infercache.engine.weights import load_checkpoint

CONTEXT = 512


@pytest.fixture(scope="module")
def parts(tiny_dir: Path) -> tuple[LlamaModel, ChatTokenizer]:
    ck = load_checkpoint(tiny_dir)
    return LlamaModel(ck.spec, ck.tensors), ChatTokenizer(ck.tokenizer, ck.eos_token_ids)


def runner(
    parts: tuple[LlamaModel, ChatTokenizer],
    *,
    cache: bool = True,
    max_kv_tokens: int = 10_000,
    tokenizer: ChatTokenizer | None = None,
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
    )


def prompt(n: int, seed: int = 0) -> tuple[int, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(int(t) for t in torch.randint(3, 420, (n,), generator=g))


def greedy(max_tokens: int = 8, **kw: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, **kw)  # type: ignore[arg-type]


def test_reused_prefix_gives_the_same_logits_and_tokens_as_a_full_prefill(
    parts: tuple[LlamaModel, ChatTokenizer],
) -> None:
    warm, cold = runner(parts), runner(parts, cache=False)
    shared = prompt(100)
    warm.generate(GenerationRequest(shared + prompt(5, 1), greedy()))
    for seed in range(2, 6):
        p = shared + prompt(12, seed)
        with warm.start(p) as a, cold.start(p) as b:
            assert a.reused_tokens == 100
            assert b.reused_tokens == 0
            for _ in range(6):
                assert (a.logits - b.logits).abs().max().item() < 1e-4
                token = int(a.logits.argmax())
                assert token == int(b.logits.argmax())
                a.advance(token)
                b.advance(token)


def test_prompt_and_generated_tokens_are_cached_for_the_next_turn(
    parts: tuple[LlamaModel, ChatTokenizer],
) -> None:
    r = runner(parts)
    first = prompt(40)
    result = r.generate(GenerationRequest(first, greedy(max_tokens=6)))
    assert result.finish_reason == "length"
    assert len(result.token_ids) == 6
    # The last sampled token never went through the model, so its KV does not exist.
    next_turn = first + result.token_ids + prompt(10, 3)
    with r.start(next_turn) as gen:
        assert gen.reused_tokens == 40 + 5


def test_an_identical_prompt_recomputes_only_its_last_token(
    parts: tuple[LlamaModel, ChatTokenizer],
) -> None:
    r = runner(parts)
    p = prompt(30)
    r.generate(GenerationRequest(p, greedy(max_tokens=1)))
    second = r.generate(GenerationRequest(p, greedy(max_tokens=1)))
    assert second.stats.cached_tokens == 29


def test_namespaces_do_not_reuse_each_others_kv(parts: tuple[LlamaModel, ChatTokenizer]) -> None:
    r = runner(parts)
    p = prompt(30)
    r.generate(GenerationRequest(p, greedy(max_tokens=1), namespace="tenant:a"))
    other = r.generate(GenerationRequest(p, greedy(max_tokens=1), namespace="tenant:b"))
    assert other.stats.cached_tokens == 0


def test_kv_memory_stays_within_budget_and_old_prefixes_are_evicted(
    parts: tuple[LlamaModel, ChatTokenizer],
) -> None:
    r = runner(parts, max_kv_tokens=100)
    cache = r.prefix_cache
    assert cache is not None
    evicted = 0
    for seed in range(6):
        result = r.generate(GenerationRequest(prompt(40, seed), greedy(max_tokens=3)))
        evicted += result.stats.evicted_tokens
        stats = cache.stats()
        assert stats.total_bytes <= 100 * cache.bytes_per_token
        assert stats.total_bytes == cache.pool.used_tokens * cache.bytes_per_token
        assert stats.locked_bytes == 0
    assert evicted > 0
    newest = r.generate(GenerationRequest(prompt(40, 5), greedy(max_tokens=1)))
    assert newest.stats.cached_tokens == 39
    oldest = r.generate(GenerationRequest(prompt(40, 0), greedy(max_tokens=1)))
    assert oldest.stats.cached_tokens == 0


def test_a_prompt_larger_than_the_budget_caches_only_what_fits(
    parts: tuple[LlamaModel, ChatTokenizer],
) -> None:
    r = runner(parts, max_kv_tokens=16)
    p = prompt(40)
    r.generate(GenerationRequest(p, greedy(max_tokens=1)))
    again = r.generate(GenerationRequest(p, greedy(max_tokens=1)))
    assert again.stats.cached_tokens == 16


def test_a_failed_prefill_unlocks_and_caches_nothing(
    parts: tuple[LlamaModel, ChatTokenizer],
) -> None:
    r = runner(parts)
    cache = r.prefix_cache
    assert cache is not None
    r.generate(GenerationRequest(prompt(20), greedy(max_tokens=1)))
    before = cache.stats()
    with pytest.raises(ValueError, match="beyond"):
        r.start(prompt(20) + prompt(CONTEXT, 9))
    assert cache.stats() == before
    assert all(node.lock_count == 0 for node in cache.tree.nodes())


def test_streamed_deltas_add_up_to_the_text(parts: tuple[LlamaModel, ChatTokenizer]) -> None:
    deltas: list[str] = []
    result = runner(parts).generate(
        GenerationRequest(prompt(10), greedy(max_tokens=20)), on_text=deltas.append
    )
    assert "".join(deltas) == result.text
    assert result.text == parts[1].decode(result.token_ids)


def test_a_stop_string_ends_generation_and_is_trimmed(
    parts: tuple[LlamaModel, ChatTokenizer],
) -> None:
    r = runner(parts, cache=False)
    p = prompt(10)
    full = r.generate(GenerationRequest(p, greedy(max_tokens=20))).text
    stop = full[5:8]
    cut = r.generate(GenerationRequest(p, greedy(max_tokens=20, stop=(stop,))))
    assert cut.finish_reason == "stop"
    assert cut.text == full[: full.index(stop)]


def test_end_of_sequence_token_finishes_with_stop(
    parts: tuple[LlamaModel, ChatTokenizer],
) -> None:
    _model, tok = parts
    p = prompt(10)
    first = runner(parts).generate(GenerationRequest(p, greedy(max_tokens=1))).token_ids[0]
    eos_is_first = ChatTokenizer(tok._hf, frozenset({first}))
    result = runner(parts, tokenizer=eos_is_first).generate(GenerationRequest(p, greedy()))
    assert result.finish_reason == "stop"
    assert result.text == ""
    assert result.token_ids == (first,)


def test_cancellation_stops_between_tokens(parts: tuple[LlamaModel, ChatTokenizer]) -> None:
    calls = iter(range(100))
    result = runner(parts).generate(
        GenerationRequest(prompt(10), greedy(max_tokens=50)), cancelled=lambda: next(calls) >= 3
    )
    assert result.finish_reason == "cancelled"
    assert len(result.token_ids) == 3


def test_stats_account_for_every_prompt_token(parts: tuple[LlamaModel, ChatTokenizer]) -> None:
    r = runner(parts)
    r.generate(GenerationRequest(prompt(50), greedy(max_tokens=2)))
    stats = r.generate(GenerationRequest(prompt(50) + prompt(7, 4), greedy(max_tokens=2))).stats
    assert (stats.prompt_tokens, stats.cached_tokens, stats.completion_tokens) == (57, 50, 2)
    assert 0 < stats.prefill_s <= stats.ttft_s
    assert stats.decode_s > 0
    assert stats.lookup_s > 0
    assert stats.store_s > 0  # the 7 new prompt tokens and 1 generated token were cached


def test_one_generation_at_a_time_per_workspace(parts: tuple[LlamaModel, ChatTokenizer]) -> None:
    r = runner(parts)
    with r.start(prompt(5)), pytest.raises(RuntimeError, match="in use"):
        r.start(prompt(5, 1))
    with r.start(prompt(5)) as gen:
        assert gen.reused_tokens == 4
