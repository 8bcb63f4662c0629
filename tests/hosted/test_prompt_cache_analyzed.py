"""The provider's prompt cache in `infercache analyze` (issue 25, "What to build" item 3, the
analyzer's side): a real gateway with a request log in front of the Anthropic stand-in and the
OpenAI stand-in, then `analyze` on that log. Its figures per upstream (tokens sent, read and
written, the read share, the money each way and the net) equal what `/stats` reported for the
same traffic, priced at the same prices; a write premium never read back is a loss with the
gateway's alarm line, in the JSON, text and HTML reports."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml

from infercache.metrics import PriceTable
from tests.harness.cli import run_analyze
from tests.hosted.conftest import PRICES, Hosted, MakeHosted
from tests.hosted.providers import AnthropicStandIn, OpenAIStandIn, tokens
from tests.hosted.test_prompt_cache_hosted import (  # noqa: F401  (claude: a fixture)
    ask_all,
    billed,
    claude,
    prompt_cache,
    system_prompt,
)

QUESTIONS = 40  # enough for a 90% read share behind one shared prompt
MEMORY = "memory://"
FIGURES = ("requests", "input_tokens", "read_tokens", "write_tokens")
MONEY = ("read_rate", "saved_usd", "write_premium_usd", "net_usd")


def price_flags(prices: PriceTable) -> list[str]:
    """`--price` flags for the table the gateway priced with."""
    flags = []
    for model, p in prices.by_model.items():
        values = [p.input_usd_per_mtok, p.output_usd_per_mtok, p.cached_input_usd_per_mtok,
                  p.cache_write_usd_per_mtok]  # fmt: skip
        given = [v for v in values if v is not None]
        flags += ["--price", f"{model}={','.join(f'{v:g}' for v in given)}"]
    return flags


def analyze(log: Path, capsys: pytest.CaptureFixture[str], fmt: str = "json") -> str:
    argv = [str(log), "--format", fmt, "--tokenizer", "chars4", "--no-semantic"]
    assert run_analyze(*argv, *price_flags(PRICES)) == 0
    return capsys.readouterr().out


def section(log: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    report = json.loads(analyze(log, capsys))
    found: dict[str, Any] = report["provider_prompt_cache"]
    return found


def assert_same_as_stats(analyzed: dict[str, Any], stats: dict[str, Any]) -> None:
    for name in FIGURES:
        assert analyzed[name] == stats[name], name
    for name in MONEY:
        assert analyzed[name] == pytest.approx(stats[name], rel=1e-9, abs=1e-12), name
    assert analyzed.get("alarm") == stats.get("alarm")


def logged_gateway(make_hosted: MakeHosted, tmp_path: Path, url: str, kind: str,
                   **config: Any) -> tuple[Hosted, Path]:  # fmt: skip
    log = tmp_path / f"{kind}.jsonl"
    return make_hosted(url, kind, MEMORY, request_log=log, **config), log


def test_one_shared_system_prompt_read_back_analyzes_as_stats_showed(
    claude: Callable[[str], anthropic.Anthropic],  # noqa: F811
    make_hosted: MakeHosted,
    anthropic_standin: tuple[AnthropicStandIn, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    standin, url = anthropic_standin
    gateway, log = logged_gateway(make_hosted, tmp_path, url, "anthropic")
    shared = system_prompt("ACME")
    assert 2900 <= tokens(shared) <= 3100
    client = claude(gateway.url)
    ask_all(client, [shared] * QUESTIONS)
    with client.messages.stream(  # a streamed answer's usage is logged too, once it ends
        model="claude-sonnet-4-5",
        max_tokens=32,
        system=shared,
        messages=[{"role": "user", "content": "Question S: is shipping free?"}],
        extra_body={"temperature": 0},
    ) as stream:
        stream.until_done()
    ask_all(client, [shared])  # question 0 again: an exact hit, no upstream call
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == QUESTIONS + 2
    assert lines[-1]["layer"] == "exact-hit"
    assert "upstream" not in lines[-1]
    assert "prompt_cache" not in lines[-1]
    usage = standin.usages[1]  # Anthropic's usage, logged in the one shape
    read, written = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
    assert lines[1]["prompt_cache"] == {
        "model": "claude-sonnet-4-5",
        "input_tokens": usage["input_tokens"] + read + written,
        "read_tokens": read,
        "write_tokens": written,
    }
    bill = billed(standin)
    stats = prompt_cache(gateway)
    found = section(log, capsys)
    (upstream,) = found["upstreams"]
    assert upstream == gateway.upstream
    total = found["upstreams"][upstream]["total"]
    assert_same_as_stats(total, stats)
    assert total["requests"] == QUESTIONS + 1
    assert (total["read_tokens"], total["write_tokens"]) == (bill["read"], bill["written"])
    assert total["read_rate"] >= 0.9
    assert total["net_usd"] > 0
    assert "alarm" not in total
    assert found["upstreams"][upstream]["models"] == {}  # one model: no per-model rows
    text = analyze(log, capsys, "text")
    assert f"Provider prompt cache of {gateway.upstream}" in text
    assert "the provider's prompt cache cost" not in text
    assert "(loss)" not in text


def test_writes_never_read_back_analyze_as_a_loss_with_the_alarm(
    claude: Callable[[str], anthropic.Anthropic],  # noqa: F811
    make_hosted: MakeHosted,
    anthropic_standin: tuple[AnthropicStandIn, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The client marks every prompt, each asked once, and `pass` sends its markers."""
    standin, url = anthropic_standin
    gateway, log = logged_gateway(
        make_hosted, tmp_path, url, "anthropic", anthropic_breakpoints="pass"
    )
    ephemeral = {"type": "ephemeral"}
    marked = [
        [{"type": "text", "text": system_prompt(f"shop {i}"), "cache_control": ephemeral}]
        for i in range(QUESTIONS // 2)
    ]
    ask_all(claude(gateway.url), marked)
    stats = prompt_cache(gateway)
    total = section(log, capsys)["upstreams"][gateway.upstream]["total"]
    assert_same_as_stats(total, stats)
    assert total["read_tokens"] == 0
    assert total["write_tokens"] == billed(standin)["written"] > 0
    assert total["net_usd"] == pytest.approx(-total["write_tokens"] * 0.75e-6)
    assert total["alarm"].startswith("alert: the provider's prompt cache cost $")
    text = analyze(log, capsys, "text")
    net = f"-${-total['net_usd']:,.4f} (loss)"
    assert net in text
    assert f"alarm: {gateway.upstream}: alert: the provider's prompt cache cost" in text
    page = analyze(log, capsys, "html")
    assert f"<h2>Provider prompt cache of {gateway.upstream} (as it reported it)</h2>" in page
    assert net in page
    assert f"<p class=warn>{gateway.upstream}: alert: the provider" in page
    # --format alerts: a rule on the gateway's own per-upstream counters, true of them now
    rules = yaml.safe_load(analyze(log, capsys, "alerts"))["groups"][0]["rules"]
    (rule,) = [r for r in rules if r["alert"] == "InfercacheProviderPromptCacheLoss"]
    assert rule["labels"]["upstream"] == gateway.upstream
    with httpx.Client(base_url=gateway.url) as http:
        metrics = http.get("/metrics").text
    counters = []
    for series in re.findall(r"(infercache_[a-z_]+\{[^}]*\})\[", rule["expr"]):
        (value,) = [line.rsplit(" ", 1)[1] for line in metrics.splitlines()
                    if line.startswith(series + " ")]  # fmt: skip
        counters.append(float(value))
    saved, premium = counters
    assert saved - premium == pytest.approx(total["net_usd"])
    assert saved - premium < 0


def test_openai_cached_tokens_analyze_as_stats_showed(
    make_hosted: MakeHosted,
    openai_standin: tuple[OpenAIStandIn, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Chat completions and a Responses call, one shared prompt: both usage shapes."""
    _, url = openai_standin
    gateway, log = logged_gateway(make_hosted, tmp_path, url, "openai")
    shared = " ".join(f"Rule {i}: be kind to customers." for i in range(160))  # ~1,300 tokens
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="sk-a", max_retries=0)
    try:
        for i in range(4):
            client.chat.completions.create(
                model="gpt-4.1-mini",
                temperature=0,
                messages=[
                    {"role": "system", "content": shared},
                    {"role": "user", "content": f"question {i}"},
                ],
            )
        client.responses.create(
            model="gpt-4.1-mini", temperature=0, instructions=shared, input="question 5"
        )
    finally:
        client.close()
    stats = prompt_cache(gateway)
    total = section(log, capsys)["upstreams"][gateway.upstream]["total"]
    assert_same_as_stats(total, stats)
    assert total["requests"] == 5
    second = json.loads(log.read_text().splitlines()[1])["prompt_cache"]  # chat's usage shape
    assert second["read_tokens"] == 1024 + 128 * ((tokens(shared) - 1024) // 128)
    assert second["input_tokens"] > second["read_tokens"]
    assert second["write_tokens"] == 0
    assert total["read_tokens"] == 4 * (1024 + 128 * ((tokens(shared) - 1024) // 128))
    assert total["saved_usd"] == pytest.approx(total["read_tokens"] * 0.3e-6)
