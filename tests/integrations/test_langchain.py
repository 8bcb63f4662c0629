"""`LangChainCache` passes LangChain's own standard cache suites (sync and async) on a memory,
a SQLite and a real Redis store, and serves a chat model's second call through
`set_llm_cache`. The chat model is LangChain's `FakeListChatModel`: it stands in for a paid
provider, and answers differently on every call, so a repeat it did not answer is a hit."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.globals import get_llm_cache, set_llm_cache
from langchain_core.language_models import FakeListChatModel
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, Generation
from langchain_tests.integration_tests import AsyncCacheTestSuite, SyncCacheTestSuite

from infercache import Cache, Settings
from infercache.clock import ManualClock
from infercache.integrations.langchain import LangChainCache, model_from_llm_string
from tests.conftest import RedisServer


def store_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'lc.db'}"
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        prefix: str = request.getfixturevalue("redis_prefix")
        return f"{server.url()}?prefix={prefix}"
    return "memory://"


@pytest.fixture(params=["memory", "sqlite", "redis"])
def infercache_cache(
    request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> Iterator[Cache]:
    url = store_url(request.param, tmp_path, request)
    cache = Cache(Settings(data_dir=tmp_path, store_url=url), clock=clock)
    yield cache
    cache.close()


class TestLangChainCacheSync(SyncCacheTestSuite):
    @pytest.fixture
    def cache(self, infercache_cache: Cache) -> LangChainCache:
        return LangChainCache(infercache_cache)


class TestLangChainCacheAsync(AsyncCacheTestSuite):
    pytestmark = pytest.mark.anyio

    @pytest.fixture
    def cache(self, infercache_cache: Cache) -> LangChainCache:
        return LangChainCache(infercache_cache)


@pytest.fixture
def memory_cache(tmp_path: Path, clock: ManualClock) -> Cache:
    return Cache(Settings(data_dir=tmp_path, store_url="memory://"), clock=clock)


@pytest.fixture
def llm_cache(memory_cache: Cache) -> Iterator[LangChainCache]:
    """Installed as LangChain's global cache for one test, then the previous one restored."""
    previous = get_llm_cache()
    cache = LangChainCache(memory_cache, tenant="acme")
    set_llm_cache(cache)
    yield cache
    set_llm_cache(previous)


def test_the_second_call_of_a_chat_model_is_served_from_the_cache(
    llm_cache: LangChainCache, memory_cache: Cache
) -> None:
    model = FakeListChatModel(responses=["first answer", "second answer"])
    assert model.invoke("What is 2+2?").content == "first answer"
    assert model.invoke("What is 2+2?").content == "first answer"
    assert model.invoke("What is 3+3?").content == "second answer"
    exact = memory_cache.stats()["strategies"]["exact"]
    assert (exact["hits"], exact["misses"]) == (1, {"absent": 2})


@pytest.mark.anyio
async def test_the_async_path_is_served_from_the_cache_too(llm_cache: LangChainCache) -> None:
    model = FakeListChatModel(responses=["one", "two"])
    assert (await model.ainvoke("hi")).content == "one"
    assert (await model.ainvoke("hi")).content == "one"


def test_a_model_version_swap_retires_the_models_answers(
    llm_cache: LangChainCache, memory_cache: Cache
) -> None:
    model = FakeListChatModel(responses=["old", "new"])
    model.invoke("hi")
    memory_cache.set_model_version("fake-list-chat-model", "v2")  # the model its llm_string names
    assert model.invoke("hi").content == "new"


def test_tenants_and_namespaces_never_see_each_others_answers(memory_cache: Cache) -> None:
    answer = [Generation(text="for a")]
    LangChainCache(memory_cache, tenant="a").update("p", "llm", answer)
    assert LangChainCache(memory_cache, tenant="a").lookup("p", "llm") == answer
    assert LangChainCache(memory_cache, tenant="b").lookup("p", "llm") is None
    assert LangChainCache(memory_cache, tenant="a", namespace="x").lookup("p", "llm") is None


def test_clear_retires_only_its_own_namespace(memory_cache: Cache) -> None:
    answer = [Generation(text="kept")]
    mine, other = LangChainCache(memory_cache), LangChainCache(memory_cache, namespace="other")
    mine.update("p", "llm", answer)
    other.update("p", "llm", answer)
    mine.clear()
    assert mine.lookup("p", "llm") is None
    assert other.lookup("p", "llm") == answer


def test_an_answer_generated_across_a_swap_is_never_served(memory_cache: Cache) -> None:
    cache = LangChainCache(memory_cache)
    llm = "[('_type', 'm'), ('temperature', 0)]"
    assert cache.lookup("p", llm) is None
    memory_cache.set_model_version("m", "v2")  # lands while the model generates
    cache.update("p", llm, [Generation(text="made by v1")])
    assert cache.lookup("p", llm) is None


def test_chat_generations_keep_their_message_and_usage(
    memory_cache: Cache, clock: ManualClock
) -> None:
    cache = LangChainCache(memory_cache)
    message = AIMessage(
        content="hi",
        tool_calls=[{"name": "f", "args": {"a": 1}, "id": "call-1"}],
        usage_metadata={"input_tokens": 7, "output_tokens": 3, "total_tokens": 10},
    )
    generations = [ChatGeneration(message=message, generation_info={"finish_reason": "stop"})]
    cache.lookup("p", "llm")
    clock.advance(2.5)
    cache.update("p", "llm", generations)
    assert cache.lookup("p", "llm") == generations
    exact = memory_cache.stats()["strategies"]["exact"]
    assert (exact["prompt_tokens_saved"], exact["completion_tokens_saved"]) == (7, 3)
    assert exact["upstream_s_saved"] == pytest.approx(2.5)


@pytest.mark.parametrize(
    ("llm_string", "model"),
    [
        ('{"id": ["x", "ChatOpenAI"], "kwargs": {"model_name": "gpt-4o"}}---[("stop", None)]',
         "gpt-4o"),
        ('{"kwargs": {"model": "claude"}}---[]', "claude"),
        ("[('_type', 'fake-list-chat-model'), ('stop', None)]", "fake-list-chat-model"),
        ("[('model', 'llama3'), ('_type', 'ollama')]", "llama3"),
        ("Sample LLM string configuration.", "langchain"),
        ("[('x', object())]", "langchain"),
    ],
)  # fmt: skip
def test_the_model_is_read_from_the_llm_string(llm_string: str, model: str) -> None:
    assert model_from_llm_string(llm_string) == model


def test_without_langchain_core_the_import_error_names_the_extra(tmp_path: Path) -> None:
    probe = (
        "import sys; sys.modules['langchain_core'] = None\n"
        "try:\n    import infercache.integrations.langchain\n"
        "except ImportError as e:\n    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'infercache[langchain]'" in done.stdout
