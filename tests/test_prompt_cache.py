"""The provider prompt cache seen from the gateway: usage in three shapes, derived cache keys,
breakpoints only on prefixes already seen, and the write premium priced."""

from __future__ import annotations

from typing import Any

from infercache.metrics import Price, PriceTable
from infercache.prompt_cache.breakpoints import (
    BreakpointPolicy,
    SeenPrefixes,
    apply_policy,
    has_markers,
    minimum_tokens,
)
from infercache.prompt_cache.cache_key import derived_key, system_prompt, with_prompt_cache_key
from infercache.prompt_cache.usage import PromptCacheUsage, prompt_cache_usage

LONG_SYSTEM = "You answer questions about our bank. " * 120  # ~4,400 characters, ~1,100 tokens


def test_usage_is_read_in_each_shape() -> None:
    chat = {"usage": {"prompt_tokens": 2000, "prompt_tokens_details": {"cached_tokens": 1536}}}
    assert prompt_cache_usage(chat) == PromptCacheUsage(2000, 1536, 0)
    details = {"cached_tokens": 0, "cache_write_tokens": 5}
    responses = {"usage": {"input_tokens": 900, "input_tokens_details": details}}
    assert prompt_cache_usage(responses) == PromptCacheUsage(900, 0, 5)
    message = {"type": "message", "usage": {"input_tokens": 20, "cache_read_input_tokens": 3000,
                                            "cache_creation_input_tokens": 100}}  # fmt: skip
    usage = prompt_cache_usage(message)
    assert usage == PromptCacheUsage(3120, 3000, 100)
    assert usage.uncached_tokens == 20
    assert prompt_cache_usage({"usage": {"prompt_tokens": "x"}}) == PromptCacheUsage(0, 0, 0)


def test_a_derived_key_is_per_tenant_and_system_prompt_and_never_replaces_the_clients() -> None:
    secret = b"s" * 32
    a = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"}]}
    b = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q2"}]}
    assert derived_key(secret, "t1", a) == derived_key(secret, "t1", b)
    assert derived_key(secret, "t1", a) != derived_key(secret, "t2", a)
    assert derived_key(secret, "t1", a) != derived_key(b"other", "t1", a)
    assert "t1" not in derived_key(secret, "t1", a)
    assert (
        with_prompt_cache_key(secret, "t1", {**a, "prompt_cache_key": "mine"})["prompt_cache_key"]
        == "mine"
    )
    assert system_prompt({"instructions": "I", "input": "x"}) == "I"
    assert system_prompt({"input": [{"role": "developer", "content": "D"}]}) == "D"


def ask(question: str, system: str = LONG_SYSTEM) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 50, "system": system,
            "messages": [{"role": "user", "content": question}]}  # fmt: skip


def test_inject_marks_a_long_system_prompt_only_once_it_came_back() -> None:
    seen = SeenPrefixes(ttl_s=300)
    first = apply_policy(BreakpointPolicy.INJECT, "t", ask("q1"), seen, now_s=0.0)
    assert not has_markers(first)  # asked once: never pays the write premium
    second = apply_policy(BreakpointPolicy.INJECT, "t", ask("q2"), seen, now_s=10.0)
    assert second["system"][-1]["cache_control"] == {"type": "ephemeral"}
    other_tenant = apply_policy(BreakpointPolicy.INJECT, "u", ask("q3"), seen, now_s=11.0)
    assert not has_markers(other_tenant)
    late = apply_policy(BreakpointPolicy.INJECT, "t", ask("q4"), seen, now_s=400.0)
    assert not has_markers(late)  # past the provider's cache lifetime: a write, not a read


def test_inject_skips_short_prefixes_keeps_client_markers_and_marks_a_conversation() -> None:
    seen = SeenPrefixes()
    for t in (0.0, 1.0):
        short = apply_policy(BreakpointPolicy.INJECT, "t", ask("q", system="Be brief."), seen, t)
    assert not has_markers(short)
    client = ask("q")
    client["system"] = [
        {"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}
    ]
    assert apply_policy(BreakpointPolicy.INJECT, "t", client, seen, 2.0) == client
    turn = ask("q1")
    apply_policy(BreakpointPolicy.INJECT, "t", turn, seen, 3.0)
    follow = {**turn, "messages": [*turn["messages"], {"role": "assistant", "content": "a1"},
                                    {"role": "user", "content": "q2"}]}  # fmt: skip
    marked = apply_policy(BreakpointPolicy.INJECT, "t", follow, seen, 4.0)
    assert marked["messages"][0]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    assert isinstance(marked["messages"][2]["content"], str)
    assert str(marked).count("cache_control") == 2  # system, and the seen turn


def test_pass_and_strip() -> None:
    client = ask("q")
    client["system"] = [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}]
    seen = SeenPrefixes()
    assert apply_policy(BreakpointPolicy.PASS, "t", client, seen, 0.0) == client
    assert not has_markers(apply_policy(BreakpointPolicy.STRIP, "t", client, seen, 0.0))


def test_minimums_and_the_write_premium() -> None:
    assert minimum_tokens("claude-sonnet-4-5") == 1024
    assert minimum_tokens("claude-haiku-4-5-20251001") == 4096
    assert minimum_tokens("claude-3-5-haiku-latest") == 2048
    prices = PriceTable({"c": Price(3.0, 15.0, 0.3, 3.75)})
    assert abs(prices.write_premium_usd("c", 1_000_000) - 0.75) < 1e-9
    assert abs(prices.prefix_savings_usd("c", 1_000_000) - 2.7) < 1e-9
    assert prices.write_premium_usd("unknown", 1000) == 0.0


def test_a_derived_prompt_cache_key_is_another_for_each_model_version() -> None:
    from infercache.prompt_cache.cache_key import derived_key

    body = {"messages": [{"role": "system", "content": "You are terse."}]}
    unversioned = derived_key(b"secret", "t", body)
    v1, v2 = (derived_key(b"secret", "t", body, v) for v in ("v1", "v2"))
    assert len({unversioned, v1, v2}) == 3
    assert derived_key(b"secret", "t", body, "v1") == v1
