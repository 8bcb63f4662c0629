"""What a cached answer says it used: the `hit_usage` setting, one pure function.

A hit replays an answer stored from an earlier call, whose `usage` is what that call cost. Cost
trackers (litellm's `completion_cost`, LangChain's `usage_metadata` that LangSmith prices)
read `usage` and would bill every hit at full price, while `/stats` and `/metrics` count the
same hit as saved: its prompt and completion tokens (`prompt_tokens_saved`,
`completion_tokens_saved`) and their price (`money_saved_usd`). `served_hit(response, mode)`
returns the answer as served and the headers that go with it:

    mode (`[cache] hit_usage`, INFERCACHE_HIT_USAGE)   the served `usage`
    "zero" (default)  every count 0 (nested details too): the caller paid for no token, so a
                      tracker's cost of a hit is 0 and cost(miss) - cost(hit) is exactly what
                      /stats counts as saved (tests/integrations/test_cost_trackers.py runs
                      litellm and langchain-openai against the gateway)
    "cached"          the original counts, and `prompt_tokens_details.cached_tokens` = the
                      whole prompt: trackers see a prompt-cache read (LangChain's
                      `input_token_details.cache_read` = /stats' saved prompt tokens) but still
                      bill the prompt at the cached-input price and the completion in full
    "original"        the stored usage as it came (the call that produced the answer)

The other APIs' answers alike, in their own shape: an Anthropic message's "cached" usage reads
the whole prompt from the cache (`cache_read_input_tokens`, `input_tokens` 0, no write), a
Responses answer's `input_tokens_details.cached_tokens` is its whole input.

Every mode adds `x-infercache-saved-tokens: prompt=P, completion=C`: the tokens the caller did
not pay for, as /stats counts them (the stored answer's `prompt_tokens` and
`completion_tokens`). `id`, `created` and everything else stay the original's: a hit repeats
the original `id`, which `/v1/feedback` names. With "original", the stored bytes are replayed
as they are (`raw`); the other modes serialise the changed answer.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, NamedTuple

from infercache.errors import ConfigError
from infercache.policy import usage_tokens

SAVED_TOKENS_HEADER = "x-infercache-saved-tokens"


class HitUsage(StrEnum):
    ZERO = "zero"
    CACHED = "cached"
    ORIGINAL = "original"

    @classmethod
    def of(cls, value: str) -> HitUsage:
        try:
            return cls(value)
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            raise ConfigError(f"hit_usage must be one of {choices}, got {value!r}") from None


DEFAULT_HIT_USAGE = HitUsage.ZERO


class ServedHit(NamedTuple):
    response: dict[str, Any]
    headers: dict[str, str]
    raw: bytes | None  # the stored bytes, when `response` is unchanged


def served_hit(response: dict[str, Any], mode: HitUsage, raw: bytes | None = None) -> ServedHit:
    """A stored answer as a hit serves it (see the module docstring)."""
    prompt, completion = usage_tokens(response)
    headers = {SAVED_TOKENS_HEADER: f"prompt={prompt}, completion={completion}"}
    usage = response.get("usage")
    if mode is HitUsage.ORIGINAL or not isinstance(usage, dict):
        return ServedHit(response, headers, raw)
    zero = mode is HitUsage.ZERO
    served_usage = _zeroed(usage) if zero else _all_cached(response, usage, prompt)
    return ServedHit({**response, "usage": served_usage}, headers, None)


def _all_cached(response: dict[str, Any], usage: dict[str, Any], prompt: int) -> dict[str, Any]:
    """`usage` saying the whole prompt (`prompt` tokens) was read from a cache."""
    if response.get("type") == "message":  # Anthropic
        reads = {"cache_read_input_tokens": prompt, "cache_creation_input_tokens": 0}
        return {**usage, "input_tokens": 0, **reads}
    name = "prompt_tokens_details" if "prompt_tokens" in usage else "input_tokens_details"
    details = usage.get(name)
    details = dict(details) if isinstance(details, dict) else {}
    details["cached_tokens"] = prompt
    return {**usage, name: details}


def _zeroed(usage: dict[str, Any]) -> dict[str, Any]:
    """`usage` with every count 0, nested details included (their keys kept)."""
    return {
        name: _zeroed(value) if type(value) is dict else (0 if type(value) in _COUNTS else value)
        for name, value in usage.items()
    }


_COUNTS = (int, float)  # exact types: a bool is not a count
