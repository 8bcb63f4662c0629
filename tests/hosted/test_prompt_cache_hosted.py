"""The provider's own prompt cache through the gateway (issue 25 acceptance 3, 4): against the
Anthropic stand-in, the default `inject` breakpoints make 200 questions behind one 3,000-token
system prompt read it back, never write a prompt asked once, and `/stats` prices each case (a
write premium never read back shown as a loss, with an alarm); against the OpenAI stand-in,
each tenant's requests carry their own derived `prompt_cache_key`, a client's own is kept, and
the `cached_tokens` it reports are counted."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from infercache.gateway.upstream import cache_salt
from tests.hosted.conftest import Hosted, MakeHosted
from tests.hosted.providers import AnthropicStandIn, OpenAIStandIn, tokens

MODEL = "claude-sonnet-4-5"
QUESTIONS = 200
EPHEMERAL = {"type": "ephemeral"}
MEMORY = "memory://"  # the store is not what these measure


def system_prompt(name: str) -> str:
    """About 3,000 of the stand-in's tokens (14 a sentence)."""
    return " ".join(
        f"Policy {i} of {name}: orders placed before noon ship the same day." for i in range(214)
    )


@pytest.fixture
def claude() -> Iterator[Callable[[str], anthropic.Anthropic]]:
    clients: list[anthropic.Anthropic] = []

    def make(url: str) -> anthropic.Anthropic:
        clients.append(anthropic.Anthropic(base_url=url, api_key="sk-open", max_retries=0))
        return clients[-1]

    yield make
    for client in clients:
        client.close()


def ask_all(client: anthropic.Anthropic, systems: list[Any]) -> None:
    for i, system in enumerate(systems):
        client.messages.create(
            model=MODEL,
            max_tokens=32,
            system=system,
            messages=[{"role": "user", "content": f"Question {i}: how do I return order {i}?"}],
            extra_body={"temperature": 0},
        )


def prompt_cache(gateway: Hosted) -> dict[str, Any]:
    with httpx.Client(base_url=gateway.url, headers={"authorization": "Bearer admin"}) as http:
        upstreams = http.get("/stats").json()["upstreams"]
    (figures,) = [u["prompt_cache"] for u in upstreams if u["name"] == gateway.upstream]
    assert isinstance(figures, dict)
    return figures


def billed(standin: AnthropicStandIn) -> dict[str, int]:
    """What the stand-in billed, summed: all prompt tokens, those read, those written."""
    read = sum(u["cache_read_input_tokens"] for u in standin.usages)
    written = sum(u["cache_creation_input_tokens"] for u in standin.usages)
    return {"all": read + written + sum(u["input_tokens"] for u in standin.usages),
            "read": read, "written": written}  # fmt: skip


def test_one_shared_system_prompt_is_read_back_by_default(
    claude: Callable[[str], anthropic.Anthropic],
    make_hosted: MakeHosted,
    anthropic_standin: tuple[AnthropicStandIn, str],
) -> None:
    standin, url = anthropic_standin
    gateway = make_hosted(url, "anthropic", MEMORY)  # default settings: inject
    shared = system_prompt("ACME")
    assert 2900 <= tokens(shared) <= 3100
    ask_all(claude(gateway.url), [shared] * QUESTIONS)
    bill = billed(standin)
    assert len(standin.usages) == QUESTIONS
    assert bill["read"] >= 0.9 * bill["all"], bill
    # the first request was not marked (a prefix asked once), the second wrote it, once
    assert [u["cache_creation_input_tokens"] > 0 for u in standin.usages[:3]] == [0, 1, 0]
    figures = prompt_cache(gateway)
    assert figures["read_tokens"] == bill["read"]
    assert figures["write_tokens"] == bill["written"]
    assert figures["input_tokens"] == bill["all"]
    assert figures["read_rate"] >= 0.9
    # reads at $0.30 instead of $3 per Mtok, one write at $3.75: well ahead
    assert figures["net_usd"] == pytest.approx(bill["read"] * 2.7e-6 - bill["written"] * 0.75e-6)
    assert figures["net_usd"] > 0
    assert "alarm" not in figures


def test_prompts_asked_once_are_never_written(
    claude: Callable[[str], anthropic.Anthropic],
    make_hosted: MakeHosted,
    anthropic_standin: tuple[AnthropicStandIn, str],
) -> None:
    standin, url = anthropic_standin
    gateway = make_hosted(url, "anthropic", MEMORY)
    ask_all(claude(gateway.url), [system_prompt(f"shop {i}") for i in range(QUESTIONS)])
    assert billed(standin)["written"] == billed(standin)["read"] == 0
    assert not any("cache_control" in str(body) for body in standin.requests)
    figures = prompt_cache(gateway)
    assert (figures["write_tokens"], figures["read_tokens"], figures["net_usd"]) == (0, 0, 0.0)


def test_pass_without_client_markers_neither_reads_nor_writes(
    claude: Callable[[str], anthropic.Anthropic],
    make_hosted: MakeHosted,
    anthropic_standin: tuple[AnthropicStandIn, str],
) -> None:
    standin, url = anthropic_standin
    gateway = make_hosted(url, "anthropic", MEMORY, anthropic_breakpoints="pass")
    ask_all(claude(gateway.url), [system_prompt("ACME")] * QUESTIONS)
    assert billed(standin)["written"] == billed(standin)["read"] == 0
    figures = prompt_cache(gateway)
    assert figures["input_tokens"] == billed(standin)["all"]
    assert figures["net_usd"] == 0.0


def test_a_write_premium_never_read_back_is_shown_as_a_loss(
    claude: Callable[[str], anthropic.Anthropic],
    make_hosted: MakeHosted,
    anthropic_standin: tuple[AnthropicStandIn, str],
) -> None:
    """The client marks every prompt, each asked once; `pass` sends its markers: every request
    pays the write premium and nothing is read back."""
    standin, url = anthropic_standin
    gateway = make_hosted(url, "anthropic", MEMORY, anthropic_breakpoints="pass")
    marked = [
        [
            {
                "type": "text",
                "text": system_prompt(f"shop {i}"),
                "cache_control": {"type": "ephemeral"},
            }
        ]
        for i in range(QUESTIONS)
    ]
    ask_all(claude(gateway.url), marked)
    bill = billed(standin)
    assert bill["read"] == 0
    assert bill["written"] >= 0.9 * bill["all"]
    figures = prompt_cache(gateway)
    assert figures["net_usd"] == pytest.approx(-bill["written"] * 0.75e-6)
    assert figures["net_usd"] < 0
    assert figures["alarm"].startswith("alert: the provider's prompt cache cost $")
    # the same figures on /metrics, per upstream
    with httpx.Client(base_url=gateway.url) as http:
        metrics = http.get("/metrics").text
    line = f'infercache_prompt_cache_write_tokens_total{{upstream="{gateway.upstream}"}}'
    assert f"{line} {float(bill['written'])}" in metrics


# -- OpenAI: a derived prompt_cache_key --


def test_each_tenant_gets_its_own_derived_prompt_cache_key(
    make_hosted: MakeHosted, openai_standin: tuple[OpenAIStandIn, str]
) -> None:
    standin, url = openai_standin
    gateway = make_hosted(
        url, "openai", api_keys={"sk-a": "tenant-a", "sk-b": "tenant-b"}, admin_token="admin"
    )
    shared = " ".join(f"Rule {i}: be kind to customers." for i in range(160))  # ~1,300 tokens
    clients = {key: openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
               for key in ("sk-a", "sk-b")}  # fmt: skip
    try:
        for key, i in (("sk-a", 1), ("sk-a", 2), ("sk-b", 3), ("sk-b", 4)):
            clients[key].chat.completions.create(
                model="gpt-4.1-mini",
                temperature=0,
                messages=[
                    {"role": "system", "content": shared},
                    {"role": "user", "content": f"question {i}"},
                ],
            )
        clients["sk-a"].responses.create(
            model="gpt-4.1-mini", temperature=0, instructions=shared, input="question 5"
        )
        clients["sk-a"].chat.completions.create(
            model="gpt-4.1-mini",
            temperature=0,
            messages=[
                {"role": "system", "content": shared},
                {"role": "user", "content": "question 6"},
            ],
            extra_body={"prompt_cache_key": "my-own-key"},
        )
    finally:
        for client in clients.values():
            client.close()
    keys = [body["prompt_cache_key"] for _, body in standin.requests]
    a1, a2, b1, b2, a_responses, own = keys
    assert a1 == a2 == a_responses  # one tenant, one system prompt: one key, on both APIs
    assert b1 == b2
    assert a1 != b1
    assert own == "my-own-key"  # the client's own is kept
    assert all(len(k) == 32 for k in (a1, b1))
    assert "tenant-a" not in a1  # salted, never the raw id
    assert a1 != cache_salt(b"", "tenant-a")
    # the provider's cache, partitioned by the key: each tenant's second request reads it
    figures = prompt_cache(gateway)
    # a2, b2 and the Responses call each read the shared prompt, in whole 128-token steps
    assert figures["read_tokens"] == 3 * (1024 + 128 * ((tokens(shared) - 1024) // 128))
    assert figures["write_tokens"] == 0


def test_a_prefix_breaker_in_live_traffic_is_reported_in_stats(
    claude: Callable[[str], anthropic.Anthropic],
    make_hosted: MakeHosted,
    anthropic_standin: tuple[AnthropicStandIn, str],
) -> None:
    """A timestamp ahead of the shared prompt: the provider's cache never reads it back, and
    /stats says so in the analyzer's words."""
    standin, url = anthropic_standin
    gateway = make_hosted(url, "anthropic", MEMORY)
    shared = system_prompt("ACME")
    ask_all(claude(gateway.url), [f"Now: 2026-12-06 10:{i:02d}:00. {shared}" for i in range(6)])
    assert billed(standin)["read"] == 0  # every prompt differs from its first characters
    with httpx.Client(base_url=gateway.url) as http:
        lines = http.get("/stats").json()["prefix_breakers"]
    assert len(lines) == 1
    assert lines[0].startswith("prefix breaker (tenant 'key:")  # open mode: a key's digest
    assert (
        f", model '{MODEL}'): the system message varies at character 20 with a timestamp "
        "('10:01:00.', '10:02:00.'); moving it to the end would let 5 requests reuse "
    ) in lines[0]
