"""The engine's in-process API (what the gateway calls) on tiny random checkpoints."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from infercache.engine.engine import Engine
from infercache.errors import (
    ConfigError,
    ContextTooLongError,
    InfercacheError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
)
from infercache.metrics import Metrics
from tests.harness.engine_requests import SYSTEM, engine_chat

from .conftest import TinyFactory

MakeEngine = Callable[..., Engine]


def body(engine: Engine, question: str = "hello world", **fields: Any) -> dict[str, Any]:
    return engine_chat(engine.model_id, question, **{"max_tokens": 6, **fields})


def cached(response: dict[str, Any]) -> int:
    tokens: int = response["usage"]["prompt_tokens_details"]["cached_tokens"]
    return tokens


def test_chat_answers_with_model_id_and_version_fingerprint(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir)
    out = engine.chat(body(engine))
    assert out["object"] == "chat.completion"
    assert out["model"] == engine.model_id == tiny_dir.name
    assert out["system_fingerprint"] == engine.model_version
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 6
    assert engine.models() == [
        {
            "id": engine.model_id,
            "object": "model",
            "created": engine.models()[0]["created"],
            "owned_by": "infercache",
            "version": engine.model_version,
            "weights": "fp16",
        }
    ]
    assert engine.model_version.endswith("-fp16")  # the default format is part of the identity


def test_second_request_sharing_the_system_prompt_reports_cached_tokens(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir)
    first = engine.chat(body(engine, "question one"))
    second = engine.chat(body(engine, "question two"))
    assert cached(first) == 0
    assert cached(second) > len(SYSTEM) // 8
    prefix = engine.metrics.snapshot()["strategies"]["prefix"]
    assert (prefix["lookups"], prefix["hits"], prefix["misses"]) == (2, 1, {"absent": 1})
    assert prefix["prompt_tokens_seen"] == (
        first["usage"]["prompt_tokens"] + second["usage"]["prompt_tokens"]
    )
    assert prefix["prompt_tokens_saved"] == cached(second)
    assert prefix["gauges"]["kv_tokens"] > 0
    assert prefix["gauges"]["kv_bytes"] > 0


def test_tenants_never_reuse_each_others_prefix(make_engine: MakeEngine, tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir)
    engine.chat(body(engine), tenant="a")
    assert cached(engine.chat(body(engine), tenant="b")) == 0
    assert cached(engine.chat(body(engine, user="c"))) == 0  # `user` names the tenant too
    assert cached(engine.chat(body(engine), tenant="a")) > 0


def test_sharing_across_tenants_is_opt_in(make_engine: MakeEngine, tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir, share_prefix_across_tenants=True)
    engine.chat(body(engine), tenant="a")
    assert cached(engine.chat(body(engine), tenant="b")) > 0


def test_disabled_prefix_cache_reuses_nothing_and_counts_bypasses(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir, prefix_cache=False)
    engine.chat(body(engine))
    assert cached(engine.chat(body(engine))) == 0
    prefix = engine.metrics.snapshot()["strategies"]["prefix"]
    assert prefix["misses"] == {"bypassed": 2}


def test_outputs_are_the_same_with_and_without_reuse(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    warm, cold = make_engine(tiny_dir), make_engine(tiny_dir, prefix_cache=False)
    for q in ["alpha", "beta", "gamma"]:
        a, b = warm.chat(body(warm, q, max_tokens=10)), cold.chat(body(cold, q, max_tokens=10))
        assert a["choices"][0]["message"] == b["choices"][0]["message"]


def test_stream_yields_role_content_finish_and_usage_chunks(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir)
    plain = engine.chat(body(engine, max_tokens=12))
    chunks = list(
        engine.chat_stream(
            body(engine, max_tokens=12, stream=True, stream_options={"include_usage": True})
        )
    )
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == plain["choices"][0]["message"]["content"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    assert cached(chunks[-1]) > 0
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert {c["system_fingerprint"] for c in chunks} == {engine.model_version}


def test_async_api_matches_the_sync_one(make_engine: MakeEngine, tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir)
    sync = engine.chat(body(engine))

    async def run() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        out = await engine.achat(body(engine))
        chunks = [c async for c in engine.achat_stream(body(engine, stream=True))]
        return out, chunks

    out, chunks = asyncio.run(run())
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert out["choices"] == sync["choices"]
    assert text == sync["choices"][0]["message"]["content"]


def test_bad_input_raises_before_anything_is_queued(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir, max_context_tokens=64)
    with pytest.raises(ModelNotFoundError) as info:
        engine.chat_stream({**body(engine), "model": "gpt-9"})
    assert info.value.status_code == 404
    with pytest.raises(ContextTooLongError) as too_long:
        engine.chat(body(engine, max_tokens=60))
    assert too_long.value.to_openai()["error"]["code"] == "context_length_exceeded"
    with pytest.raises(InvalidRequestError):
        engine.achat_stream({**body(engine), "n": 3})
    assert engine.stats()["requests_in_flight"] == 0


def test_default_max_tokens_is_capped_by_the_context(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir, max_context_tokens=120, default_max_tokens=500)
    req = body(engine)
    del req["max_tokens"]
    out = engine.chat(req)
    usage = out["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= 120


def test_seeded_sampling_is_reproducible(make_engine: MakeEngine, tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir)

    def text(seed: int) -> str:
        out = engine.chat(body(engine, temperature=1.0, seed=seed, max_tokens=16))
        content: str = out["choices"][0]["message"]["content"]
        return content

    assert text(1) == text(1)
    assert len({text(s) for s in range(2, 6)}) > 1


def test_concurrent_callers_are_batched_and_get_the_answers_they_get_alone(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir, max_batch=8)
    questions = [f"question {i}" for i in range(8)]
    expected = {q: engine.chat(body(engine, q))["choices"][0]["message"] for q in questions}

    def ask(q: str) -> tuple[str, Any]:
        return q, engine.chat(body(engine, q))["choices"][0]["message"]

    with ThreadPoolExecutor(max_workers=16) as callers:  # exceptions re-raise from map()
        answers = list(callers.map(ask, questions * 2))
    assert all(message == expected[q] for q, message in answers)
    assert engine.stats()["requests_in_flight"] == 0
    sizes = engine.metrics.snapshot()["strategies"]["prefix"]["histograms"]["batch_size"]
    assert sum(sizes["counts"][1:]) > 0  # some steps ran more than one sequence


def test_closing_a_stream_early_cancels_the_generation(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir)
    stream = engine.chat_stream(body(engine, max_tokens=400, stream=True))
    next(stream)
    stream.close()
    after = engine.chat(body(engine, "next"))  # runs once the cancelled one has stopped
    assert after["choices"][0]["finish_reason"] == "length"
    assert engine.stats()["requests_in_flight"] == 0
    assert engine.metrics.snapshot()["strategies"]["prefix"]["prompt_tokens_seen"] > 0


def test_model_swap_flushes_kv_and_changes_the_version(
    make_engine: MakeEngine, tiny_dir: Path, make_tiny_llama: TinyFactory
) -> None:
    engine = make_engine(tiny_dir, served_model_id="tiny")
    engine.chat(body(engine))
    assert cached(engine.chat(body(engine))) > 0
    old_version = engine.model_version
    engine.swap_model(make_tiny_llama(seed=7), served_model_id="tiny")
    assert engine.model_version != old_version
    after = engine.chat(body(engine))
    assert cached(after) == 0
    assert after["system_fingerprint"] == engine.model_version
    assert engine.metrics.snapshot()["strategies"]["prefix"]["gauges"]["kv_tokens"] > 0


def test_a_request_for_the_old_model_id_is_refused_after_a_swap(
    make_engine: MakeEngine, tiny_dir: Path, make_tiny_llama: TinyFactory
) -> None:
    engine = make_engine(tiny_dir)
    old = body(engine)
    engine.swap_model(make_tiny_llama(seed=7))
    with pytest.raises(ModelNotFoundError):
        engine.chat(old)


def test_shared_metrics_receive_the_prefix_strategy(tiny_dir: Path, data_dir: Path) -> None:
    from infercache.engine.config import EngineConfig

    metrics = Metrics()
    with Engine(EngineConfig(data_dir=data_dir, model_path=tiny_dir), metrics=metrics) as engine:
        engine.chat(body(engine))
    assert metrics.snapshot()["strategies"]["prefix"]["lookups"] == 1
    assert b'infercache_lookups_total{strategy="prefix"} 1.0' in metrics.to_prometheus()


def test_a_closed_engine_refuses_requests(make_engine: MakeEngine, tiny_dir: Path) -> None:
    engine = make_engine(tiny_dir)
    engine.close()
    with pytest.raises(InfercacheError, match="shut down"):
        engine.chat(body(engine))


def test_bfloat16_engine_answers_with_half_the_kv_bytes_per_token(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    def kv_bytes_per_token(engine: Engine) -> float:
        engine.chat(body(engine))
        gauges = engine.metrics.snapshot()["strategies"]["prefix"]["gauges"]
        return float(gauges["kv_bytes"] / gauges["kv_tokens"])

    fp32, bf16 = make_engine(tiny_dir), make_engine(tiny_dir, dtype="bfloat16")
    assert kv_bytes_per_token(bf16) == kv_bytes_per_token(fp32) / 2
    assert bf16.chat(body(bf16))["usage"]["completion_tokens"] == 6


def test_a_request_queued_before_a_swap_is_prepared_again_for_the_new_model(
    make_engine: MakeEngine, tiny_dir: Path, make_tiny_llama: TinyFactory
) -> None:
    engine = make_engine(tiny_dir, served_model_id="tiny")
    queued = engine._prepare(body(engine), None)  # prepared, not yet run: the race window
    engine.swap_model(make_tiny_llama(seed=7), served_model_id="tiny")
    outcome = engine._worker.submit(queued, None, threading.Event()).result()
    assert outcome.meta.system_fingerprint == engine.model_version
    assert outcome.result.stats.cached_tokens == 0


def test_a_full_queue_refuses_at_the_call_with_a_429_and_retry_after(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir, max_batch=1, max_queue=1, max_step_tokens=64)
    running = engine.chat_stream(body(engine, "one", max_tokens=400, stream=True))
    next(running)  # admitted: the one place in the batch is taken
    waiting = engine.chat_stream(body(engine, "two", max_tokens=4, stream=True))
    with pytest.raises(OverloadedError) as refused:
        engine.chat_stream(body(engine, "three", stream=True))
    assert refused.value.status_code == 429
    assert refused.value.headers() == {"retry-after": "1"}
    assert refused.value.to_openai()["error"]["type"] == "rate_limit_error"
    with pytest.raises(OverloadedError):
        engine.chat(body(engine, "four"))
    running.close()  # cancelled: the waiting one gets the place
    assert [c for c in waiting if c["choices"]][-1]["choices"][0]["finish_reason"] == "length"
    assert engine.chat(body(engine, "after"))["choices"][0]["finish_reason"] == "length"
    assert engine.stats()["requests_in_flight"] == 0


def test_cache_salt_splits_the_prefix_cache_like_vllm(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir)
    assert cached(engine.chat(body(engine, cache_salt="salt-a"))) == 0
    assert cached(engine.chat(body(engine, cache_salt="salt-b"))) == 0
    assert cached(engine.chat(body(engine))) == 0  # no salt is a namespace of its own
    assert cached(engine.chat(body(engine, cache_salt="salt-a"))) > 0
    assert cached(engine.chat(body(engine, cache_salt="salt-a"), tenant="t")) == 0
    with pytest.raises(InvalidRequestError) as bad:
        engine.chat(body(engine, cache_salt=""))
    assert bad.value.param == "cache_salt"


def test_cache_salt_separates_even_when_tenants_share(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir, share_prefix_across_tenants=True)
    engine.chat(body(engine, cache_salt="s"), tenant="a")
    assert cached(engine.chat(body(engine, cache_salt="s"), tenant="b")) > 0
    assert cached(engine.chat(body(engine, cache_salt="other"), tenant="b")) == 0


def test_batching_metrics_count_tokens_steps_and_latencies(
    make_engine: MakeEngine, tiny_dir: Path
) -> None:
    engine = make_engine(tiny_dir)
    outs = [engine.chat(body(engine, q, max_tokens=5)) for q in ("a", "b", "c")]
    prefix = engine.metrics.snapshot()["strategies"]["prefix"]
    counters, gauges, histograms = prefix["counters"], prefix["gauges"], prefix["histograms"]
    assert counters["prefix_cache_queries"] == sum(o["usage"]["prompt_tokens"] for o in outs)
    assert counters["prefix_cache_hits"] == sum(cached(o) for o in outs) > 0
    assert counters["prompt_tokens"] == counters["prefix_cache_queries"]
    assert counters["generation_tokens"] == 15
    assert (gauges["queue_length"], gauges["running_sequences"]) == (0, 0)
    assert gauges["running_kv_tokens"] == 0
    assert histograms["ttft_s"]["count"] == 3
    assert histograms["time_per_output_token_s"]["count"] == 3
    assert histograms["batch_size"]["count"] == 15  # 5 steps a request, one at a time
    assert histograms["batch_size"]["sum"] == 15
    text = engine.metrics.to_prometheus().decode()
    assert 'infercache_prefix_cache_hits_total{strategy="prefix"}' in text
    assert 'infercache_engine_requests_running{strategy="prefix"} 0.0' in text
    assert 'infercache_engine_batch_size_bucket{le="1.0",strategy="prefix"} 15.0' in text
    stats = engine.stats()
    assert stats["prefix_cache"]["locked_bytes"] == 0
    assert stats["prefix_cache"]["total_tokens"] > 0


def test_a_swap_waits_for_the_running_batch_to_finish(
    make_engine: MakeEngine, tiny_dir: Path, make_tiny_llama: TinyFactory
) -> None:
    engine = make_engine(tiny_dir, served_model_id="tiny")
    old_version = engine.model_version
    stream = engine.chat_stream(body(engine, max_tokens=300, stream=True))
    first = next(stream)
    with ThreadPoolExecutor(max_workers=1) as pool:
        swapped = pool.submit(engine.swap_model, make_tiny_llama(seed=7), served_model_id="tiny")
        rest = list(stream)  # the running request finishes on the old model
        swapped.result()
    assert first["system_fingerprint"] == old_version
    assert rest[-1]["choices"][0]["finish_reason"] == "length"
    assert {c["system_fingerprint"] for c in rest} == {old_version}
    assert engine.model_version != old_version
    assert engine.chat(body(engine))["system_fingerprint"] == engine.model_version


def test_a_swap_can_abort_the_running_batch_with_a_clear_error(
    make_engine: MakeEngine, tiny_dir: Path, make_tiny_llama: TinyFactory
) -> None:
    engine = make_engine(tiny_dir, served_model_id="tiny")
    stream = engine.chat_stream(body(engine, max_tokens=400, stream=True))
    next(stream)
    engine.swap_model(make_tiny_llama(seed=7), served_model_id="tiny", abort_running=True)
    with pytest.raises(InfercacheError, match="model was swapped"):
        list(stream)
    assert engine.stats()["running_sequences"] == 0
    assert engine.chat(body(engine))["system_fingerprint"] == engine.model_version


def test_a_failed_swap_raises_to_the_caller_and_the_old_model_keeps_serving(
    make_engine: MakeEngine, tiny_dir: Path, tmp_path: Path
) -> None:
    engine = make_engine(tiny_dir)
    version = engine.model_version
    with pytest.raises(ConfigError):
        engine.swap_model(tmp_path / "no-such-model")
    assert engine.model_version == version
    assert engine.chat(body(engine))["system_fingerprint"] == version


def test_the_model_is_loaded_and_run_on_the_engine_thread_alone(
    make_engine: MakeEngine, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller's thread that ran torch's parallel kernels (the load, say) keeps an OpenMP team
    that throttles the engine thread's: every torch op of the engine runs on its own thread."""
    from infercache.engine import loader
    from infercache.engine.model import LlamaModel

    threads: list[str] = []

    class Recording(LlamaModel):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            threads.append(threading.current_thread().name)
            super().__init__(*args, **kwargs)

        def forward_batch(self, *args: Any, **kwargs: Any) -> Any:
            threads.append(threading.current_thread().name)
            return super().forward_batch(*args, **kwargs)

    monkeypatch.setattr(loader, "LlamaModel", Recording)
    engine = make_engine(tiny_dir)
    engine.chat(body(engine))
    engine.swap_model(tiny_dir)
    engine.chat(body(engine))
    assert threading.current_thread().name not in threads
    assert set(threads) == {"infercache-engine"}
    assert len(threads) >= 4  # two loads, at least one step each


def test_a_model_that_fails_to_load_raises_from_the_constructor(
    make_engine: MakeEngine, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError):
        make_engine(tmp_path / "no-such-model")
