"""The embedded default (`infercache serve` without `--upstream`: the built-in engine in process)
with the packaged SmolLM2 model and the official `openai` client:

- legacy `completions.create`, plain and streamed, is answered by the engine and cached like
  chat: a repeat is an exact hit, a stream replays it, a fresh stream is stored whole;
- the engine's full queue (`--max-batch 1 --max-queue 0`, its one place held) reaches the
  client as a 429 with Retry-After in the OpenAI shape, on chat and completions, streamed or
  not; nothing is stored, and the same request is served once there is room;
- bad batching flags are refused by `serve` before anything loads;
- Anthropic's `messages.create` (the `anthropic` SDK) and OpenAI's `responses.create`, plain and
  streamed, a follow-up by `previous_response_id` too, are answered by translation to the
  engine's chat and cached: a repeat is an exact hit, a stream replays to the same answer.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from infercache.cli import main
from infercache.engine.config import EngineConfig, default_data_dir
from infercache.engine.engine import Engine
from infercache.settings import Settings
from tests.harness.engine_gateway import serve_engine_gateway

PROMPT = "The capital of France is"


@contextmanager
def embedded(tmp_path: Path, **engine: Any) -> Iterator[tuple[str, Engine]]:
    """A gateway built as `infercache serve` builds it with no upstream, on loopback; the
    engine reads the packaged model from the user's cache (converted once)."""
    settings = Settings(
        data_dir=tmp_path, store_url=f"sqlite:///{tmp_path / 'cache.db'}", default_ttl_s=600
    )
    engine_config = EngineConfig(data_dir=default_data_dir(os.environ), **engine)
    with serve_engine_gateway(settings, engine_config) as running:
        yield running


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Engine]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        with embedded(tmp_path_factory.mktemp("embedded")) as running:
            yield running


@pytest.mark.slow
def test_legacy_completions_are_answered_by_the_engine_and_cached_like_chat(
    gateway: tuple[str, Engine],
) -> None:
    url, engine = gateway
    with openai.OpenAI(base_url=f"{url}/v1", api_key="local", max_retries=0) as app:
        ask: dict[str, Any] = {"model": engine.model_id, "temperature": 0, "max_tokens": 8}
        first = app.completions.with_raw_response.create(prompt=PROMPT, **ask)
        second = app.completions.with_raw_response.create(prompt=PROMPT, **ask)
        replayed = list(app.completions.create(prompt=PROMPT, stream=True, **ask))
        fresh = list(
            app.completions.create(
                prompt="Once upon a time",
                stream=True,
                stream_options={"include_usage": True},
                **ask,
            )
        )
        again = app.completions.with_raw_response.create(prompt="Once upon a time", **ask)
    answer = first.parse()
    assert (first.headers["x-infercache"], second.headers["x-infercache"]) == ("miss", "exact-hit")
    assert answer.object == "text_completion"
    assert answer.system_fingerprint == engine.model_version
    # No chat template: the prompt is the model's input as it is.
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == len(engine.tokenizer.encode_prompt(PROMPT))
    assert answer.choices[0].text
    assert second.parse().choices[0].text == answer.choices[0].text
    assert "".join(c.choices[0].text for c in replayed if c.choices) == answer.choices[0].text
    fresh_text = "".join(c.choices[0].text for c in fresh if c.choices)
    assert fresh[-1].usage is not None
    assert fresh[-1].usage.completion_tokens == 8
    assert again.headers["x-infercache"] == "exact-hit"  # the stream was stored whole
    assert again.parse().choices[0].text == fresh_text


def four_calls(url: str, model: str) -> list[httpx.Response]:
    """Chat and legacy completions, each plain and streamed: four distinct requests."""
    asks = [
        {"messages": [{"role": "user", "content": "Hi!"}]},
        {"messages": [{"role": "user", "content": "Hello!"}], "stream": True},
        {"prompt": "Hi!"},
        {"prompt": "Hello!", "stream": True},
    ]
    with httpx.Client(base_url=url, timeout=60) as http:
        return [
            http.post(
                "/v1/completions" if "prompt" in ask else "/v1/chat/completions",
                json={"model": model, "temperature": 0, "max_tokens": 4, **ask},
            )
            for ask in asks
        ]


# One word asked for, room for more: the engine's answer ends by itself (a max_tokens cut-off
# is never stored by either API).
ONE_WORD = "Answer with one word only."


@pytest.mark.slow
def test_anthropic_messages_are_answered_by_the_engine_and_cached(
    gateway: tuple[str, Engine],
) -> None:
    url, engine = gateway
    ask: dict[str, Any] = {
        "model": engine.model_id,
        "max_tokens": 24,
        "system": ONE_WORD,
        "messages": [{"role": "user", "content": "What colour is the sky?"}],
        "extra_body": {"temperature": 0},
    }
    with anthropic.Anthropic(base_url=url, api_key="local", max_retries=0) as claude:
        first = claude.messages.with_raw_response.create(**ask)
        second = claude.messages.with_raw_response.create(**ask)
        with claude.messages.stream(**ask) as stream:
            replay_layer = stream.response.headers["x-infercache"]
            replayed = stream.get_final_message()
        streamed = {**ask, "messages": [{"role": "user", "content": "What colour is grass?"}]}
        finals = []
        for _ in range(2):
            with claude.messages.stream(**streamed) as stream:
                finals.append((stream.response.headers["x-infercache"], stream.get_final_message()))
    message = first.parse()
    assert message.stop_reason == "end_turn", message
    assert (first.headers["x-infercache"], second.headers["x-infercache"]) == ("miss", "exact-hit")
    assert texts(second.parse()) == texts(message)
    assert message.usage.input_tokens > 0
    assert (replay_layer, texts(replayed)) == ("exact-hit", texts(message))
    assert [layer for layer, _ in finals] == ["miss", "exact-hit"]
    assert finals[0][1].stop_reason == "end_turn"
    assert texts(finals[1][1]) == texts(finals[0][1])


def texts(message: Any) -> list[str]:
    return [block.text for block in message.content]


@pytest.mark.slow
def test_openai_responses_are_answered_by_the_engine_and_cached(
    gateway: tuple[str, Engine],
) -> None:
    url, engine = gateway
    ask: dict[str, Any] = {"model": engine.model_id, "temperature": 0, "max_output_tokens": 24,
                           "instructions": ONE_WORD}  # fmt: skip
    with openai.OpenAI(base_url=f"{url}/v1", api_key="local", max_retries=0) as app:
        raw = [app.responses.with_raw_response.create(input="What colour is snow?", **ask)
               for _ in range(2)]  # fmt: skip
        first = raw[0].parse()
        with app.responses.stream(input="What colour is snow?", **ask) as stream:
            replayed = stream.get_final_response()
        follow = [
            app.responses.with_raw_response.create(
                input="And coal?", previous_response_id=first.id, **ask
            )
            for _ in range(2)
        ]
    assert first.status == "completed", first
    assert [r.headers["x-infercache"] for r in raw] == ["miss", "exact-hit"]
    assert raw[1].parse().output_text == first.output_text
    assert (replayed.id, replayed.output_text) == (first.id, first.output_text)
    assert [r.headers["x-infercache"] for r in follow] == ["miss", "exact-hit"]
    assert follow[0].parse().status == "completed"
    assert follow[1].parse().output_text == follow[0].parse().output_text


@pytest.mark.slow
def test_the_engines_full_queue_is_a_429_with_retry_after_and_nothing_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with embedded(tmp_path, max_batch=1, max_queue=0) as (url, engine):
        hold = {
            "model": engine.model_id,
            "prompt": "Count:",
            "max_tokens": 1000,
            "ignore_eos": True,
        }
        busy = engine.text_completion_stream({**hold, "stream": True})
        next(busy)  # its first text: the one place is taken
        refused = four_calls(url, engine.model_id)
        busy.close()  # the holder leaves
        assert engine.wait_idle(60)
        served = four_calls(url, engine.model_id)
    for r in refused:
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "overloaded")
    # Nothing was stored for the refusals: the same requests are misses the engine answers.
    assert [(r.status_code, r.headers["x-infercache"]) for r in served] == [(200, "miss")] * 4


def test_serve_refuses_bad_batching_flags_before_loading_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INFERCACHE_DATA_DIR", str(tmp_path))
    assert main(["serve", "--store", "memory://", "--max-batch", "0"]) == 2
    assert "max_batch must be >= 1, got 0" in capsys.readouterr().err
    assert main(["serve", "--store", "memory://", "--max-queue", "-1"]) == 2
    assert "max_queue must be >= 0, got -1" in capsys.readouterr().err
    assert main(["serve", "--store", "memory://", "--kv-disk-bytes", "-1"]) == 2
    assert "KV tier budgets must be >= 0, got -1" in capsys.readouterr().err
    assert main(["engine", "serve", "--kv-block-tokens", "0"]) == 2
    assert "kv_block_tokens must be >= 1, got 0" in capsys.readouterr().err
