"""Cost trackers agree with `/stats` on a hit (hit_usage.py; issue 26 item 5).

litellm (the `response_cost` it logs for every call, priced from `usage` with its own table)
and langchain-openai (`usage_metadata`, which LangSmith prices: input less `cache_read` at the
input price, `cache_read` at the cached price, output at the output price) call the real
gateway in front of a stand-in provider, as an app would. The gateway is given litellm's own
prices for the model, so both sides price tokens alike. For a miss then a hit of one question:

    tracker cost(miss) - tracker cost(hit) == /stats money_saved_usd (that one hit)

With `hit_usage = "zero"` (the default) both agree; with "original" (what a hit reported
before) a hit costs as much as the miss; with "cached", LangChain's `cache_read` is /stats'
saved prompt tokens but the hit is still billed. Each test's first upstream call is the
stand-in's first (no prefix-cache discount on it), so the miss is billed at full price.
"""

from __future__ import annotations

import asyncio
import os
import warnings
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from infercache.metrics import Price, PriceTable
from tests.gateway.conftest import MakeGateway, Running

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of its price table

MODEL = "gpt-4o-mini"
QUESTION = "What is the capital of France?"


@pytest.fixture(autouse=True)
def _close_litellm_loop() -> Iterator[None]:
    """litellm's blocking `completion` asks `asyncio.get_event_loop()` for a loop to log on,
    which creates one, sets it as this thread's and never closes it: collected unclosed later,
    during another test, it is a ResourceWarning there (an error under filterwarnings=error).
    Close the loop this thread was left with, if any."""
    yield
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: it may warn
            loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:  # no loop set (an asyncio.Runner unset it): nothing to close
        return
    loop.close()
    asyncio.set_event_loop(None)  # as asyncio.Runner leaves it


def _gateway(make_gateway: MakeGateway, hit_usage: str) -> tuple[Running, dict[str, Any]]:
    """A gateway pricing MODEL as litellm does; litellm's price entry."""
    import litellm

    table = litellm.model_cost[MODEL]
    price = Price(
        input_usd_per_mtok=table["input_cost_per_token"] * 1e6,
        output_usd_per_mtok=table["output_cost_per_token"] * 1e6,
        cached_input_usd_per_mtok=table["cache_read_input_token_cost"] * 1e6,
    )
    prices = PriceTable(by_model={MODEL: price})
    return make_gateway(settings={"prices": prices, "hit_usage": hit_usage}), table


def _saved_usd(running: Running) -> float:
    saved: float = running.exact()["money_saved_usd"]
    return saved


def _litellm_calls(running: Running) -> list[tuple[float, dict[str, str]]]:
    """A miss then a hit through litellm: each call's logged cost and the gateway's headers."""
    import litellm

    calls = []
    # Our own client, closed when done: litellm's cached one is left to the garbage collector.
    with httpx.Client() as http:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="anything", http_client=http)
        responses = [
            litellm.completion(
                model=f"openai/{MODEL}",
                api_base=f"{running.url}/v1",
                api_key="anything",
                messages=[{"role": "user", "content": QUESTION}],
                temperature=0,
                client=client,
            )
            for _ in range(2)
        ]
    for response in responses:
        hidden = response._hidden_params
        headers = {
            k.removeprefix("llm_provider-"): v for k, v in hidden["additional_headers"].items()
        }
        calls.append((float(hidden["response_cost"]), headers))
    return calls


def _langchain_calls(running: Running, table: dict[str, Any]) -> list[tuple[float, int]]:
    """A miss then a hit through langchain-openai: each call's cost as LangSmith prices its
    `usage_metadata`, and its `cache_read` tokens."""
    from langchain_openai import ChatOpenAI

    calls = []
    with httpx.Client() as http:  # closed when done, not left to the garbage collector
        chat = ChatOpenAI(
            model=MODEL,
            base_url=f"{running.url}/v1",
            api_key="anything",  # type: ignore[arg-type]
            http_client=http,
        )
        chat.temperature = 0
        usages = [chat.invoke(QUESTION).usage_metadata for _ in range(2)]
    for usage in usages:
        assert usage is not None
        cache_read = usage.get("input_token_details", {}).get("cache_read", 0) or 0
        cost = (
            (usage["input_tokens"] - cache_read) * table["input_cost_per_token"]
            + cache_read * table["cache_read_input_token_cost"]
            + usage["output_tokens"] * table["output_cost_per_token"]
        )
        calls.append((cost, cache_read))
    return calls


@pytest.mark.slow  # litellm takes seconds to import
def test_litellm_bills_a_hit_as_stats_counts_it(make_gateway: MakeGateway) -> None:
    running, _ = _gateway(make_gateway, "zero")
    (miss, miss_headers), (hit, hit_headers) = _litellm_calls(running)
    assert (miss_headers["x-infercache"], hit_headers["x-infercache"]) == ("miss", "exact-hit")
    assert miss > 0
    assert miss - hit == pytest.approx(_saved_usd(running), rel=1e-9)
    exact = running.exact()
    assert hit_headers["x-infercache-saved-tokens"] == (
        f"prompt={exact['prompt_tokens_saved']}, completion={exact['completion_tokens_saved']}"
    )


@pytest.mark.slow
def test_langchain_bills_a_hit_as_stats_counts_it(make_gateway: MakeGateway) -> None:
    running, table = _gateway(make_gateway, "zero")
    (miss, _), (hit, _) = _langchain_calls(running, table)
    assert miss > 0
    assert running.exact()["hits"] == 1
    assert miss - hit == pytest.approx(_saved_usd(running), rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("hit_usage", ["original", "cached"])
def test_the_other_modes_bill_the_hit(make_gateway: MakeGateway, hit_usage: str) -> None:
    """Why "zero" is the default: with the stored usage (the behaviour before `hit_usage`) a
    hit costs what the miss did; "cached" bills the prompt at the cached price and the
    completion in full, though LangChain's cache_read then equals /stats' saved prompt."""
    running, table = _gateway(make_gateway, hit_usage)
    (miss, _), (hit, cache_read) = _langchain_calls(running, table)
    saved = _saved_usd(running)
    assert saved > 0
    assert hit > 0
    assert miss - hit != pytest.approx(saved, rel=1e-6)
    if hit_usage == "original":
        assert hit == pytest.approx(miss)
    else:
        assert cache_read == running.exact()["prompt_tokens_saved"]
    (_, (litellm_hit, _)) = _litellm_calls(running)  # two more hits
    assert litellm_hit > 0
