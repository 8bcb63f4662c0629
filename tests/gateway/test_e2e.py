"""End to end on loopback: the official `openai` client → a real gateway process → the real
engine (`infercache engine serve`, a second process, with the packaged model), and the
embedded default (`infercache serve` with the engine in process)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.harness.openai_streams import streamed
from tests.harness.processes import infercache_exe, start, stop, wait_for_line
from tests.harness.servers import free_port

pytestmark = pytest.mark.slow

LONG_SYSTEM = (
    "You are the support assistant of ACME Widgets. Answer in one short sentence. "
    + " ".join(f"Policy {i}: widgets ordered before noon ship the same day." for i in range(30))
)


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    port = free_port()
    process, _ = start(
        ["engine", "serve", "--port", str(port), "--log-level", "info"],
        "Uvicorn running",
        on_stderr=True,
    )
    yield f"http://127.0.0.1:{port}/v1"
    stop(process)


@pytest.fixture(scope="module")
def gateway_url(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    store = tmp_path_factory.mktemp("e2e") / "cache.db"
    process, _ = start(
        [
            "serve", "--port", str(port), "--upstream", engine_url,
            "--store", f"sqlite:///{store}",
            "--api-key", "key-a=tenant-a", "--api-key", "key-b=tenant-b",
            "--admin-token", "admin-token",
        ],
        "gateway ready",
        on_stderr=False,
    )  # fmt: skip
    yield f"http://127.0.0.1:{port}/v1"
    stop(process)


def model_id(base_url: str) -> str:
    data = httpx.get(f"{base_url}/models", headers={"authorization": "Bearer key-a"}).json()
    name: str = data["data"][0]["id"]
    return name


def ask(client: openai.OpenAI, model: str, question: str, system: str = "Be brief.") -> Any:
    return client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
        temperature=0,
        max_tokens=8,
    )


def test_sync_client_repeat_is_an_exact_hit(gateway_url: str) -> None:
    model = model_id(gateway_url)
    client = openai.OpenAI(base_url=gateway_url, api_key="key-a")
    first = ask(client, model, "What is the capital of France?")
    second = ask(client, model, "What is the capital of France?")
    assert first.headers["x-infercache"] == "miss"
    assert second.headers["x-infercache"] == "exact-hit"
    text = first.parse().choices[0].message.content
    assert text
    assert second.parse().choices[0].message.content == text
    client.close()


@pytest.mark.anyio
async def test_async_client_gets_answers_and_hits(gateway_url: str) -> None:
    model = model_id(gateway_url)
    client = openai.AsyncOpenAI(base_url=gateway_url, api_key="key-a")
    messages = [{"role": "user", "content": "Name a primary colour."}]
    first = await client.chat.completions.with_raw_response.create(
        model=model, messages=messages, temperature=0, max_tokens=6
    )
    second = await client.chat.completions.with_raw_response.create(
        model=model, messages=messages, temperature=0, max_tokens=6
    )
    assert (first.headers["x-infercache"], second.headers["x-infercache"]) == ("miss", "exact-hit")
    assert first.parse().choices[0].message.content
    await client.close()


def test_streaming_client_gets_a_stream_and_a_replayed_hit(gateway_url: str) -> None:
    model = model_id(gateway_url)
    client = openai.OpenAI(base_url=gateway_url, api_key="key-a")
    messages = [{"role": "user", "content": "Count to three."}]
    texts = []
    for _ in range(2):
        text, chunks = streamed(client, model=model, messages=messages, temperature=0, max_tokens=8)
        texts.append(text)
        assert chunks[-1].usage is not None
    assert texts[0]
    assert texts[0] == texts[1]
    # the streamed miss was stored: a plain request now hits it
    plain = client.chat.completions.with_raw_response.create(
        model=model, messages=messages, temperature=0, max_tokens=8
    )
    assert plain.headers["x-infercache"] == "exact-hit"
    assert plain.parse().choices[0].message.content == texts[0]
    client.close()


def test_a_new_question_under_a_shared_system_prompt_reuses_kv(gateway_url: str) -> None:
    model = model_id(gateway_url)
    client = openai.OpenAI(base_url=gateway_url, api_key="key-a")
    ask(client, model, "Do you ship on Sundays?", system=LONG_SYSTEM)
    second = ask(client, model, "When does my widget ship?", system=LONG_SYSTEM)
    assert second.headers["x-infercache"] == "miss"
    details = second.parse().usage.prompt_tokens_details
    assert details is not None
    assert details.cached_tokens > 100
    # Tenant B sends tenant A's exact request: no exact hit, and no KV reuse either.
    other = openai.OpenAI(base_url=gateway_url, api_key="key-b")
    b = ask(other, model, "When does my widget ship?", system=LONG_SYSTEM)
    assert b.headers["x-infercache"] == "miss"
    b_details = b.parse().usage.prompt_tokens_details
    assert b_details is None or b_details.cached_tokens == 0
    with httpx.Client(headers={"authorization": "Bearer admin-token"}) as http:
        stats = http.get(gateway_url.removesuffix("/v1") + "/stats").json()  # admin only
    assert stats["strategies"]["prefix"]["hits"] >= 1
    client.close()
    other.close()


def test_the_embedded_default_serves_and_caches(tmp_path: Path) -> None:
    """`./run serve`'s command: no upstream, the engine in process, SQLite in the data dir."""
    port = free_port()
    env_dir = tmp_path / "data"
    process = subprocess.Popen(
        [infercache_exe(), "serve", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "INFERCACHE_STORE": f"sqlite:///{env_dir / 'cache.sqlite3'}",
        },
    )
    try:
        assert process.stdout is not None
        wait_for_line(process.stdout, "gateway ready", process)
        url = f"http://127.0.0.1:{port}/v1"
        model = model_id(url)
        client = openai.OpenAI(base_url=url, api_key="local")
        first = ask(client, model, "Say hello.", system=LONG_SYSTEM)
        second = ask(client, model, "Say hello.", system=LONG_SYSTEM)
        third = ask(client, model, "Say goodbye.", system=LONG_SYSTEM)
        assert first.headers["x-infercache"] == "miss"
        assert second.headers["x-infercache"] == "exact-hit"
        assert third.headers["x-infercache"] == "miss"
        assert third.parse().usage.prompt_tokens_details.cached_tokens > 100
        with httpx.Client() as http:
            stats = http.get(f"http://127.0.0.1:{port}/stats").json()
        assert stats["strategies"]["exact"]["hits"] == 1
        assert stats["strategies"]["prefix"]["hits"] >= 1
        assert (env_dir / "cache.sqlite3").exists()
        client.close()
    finally:
        stop(process)
