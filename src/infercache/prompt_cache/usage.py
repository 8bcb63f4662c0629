"""The provider's prompt-cache figures, read from whichever usage shape an answer carries.

    chat completions   usage.prompt_tokens (all input), prompt_tokens_details.cached_tokens
                       (read), .cache_write_tokens (written; OpenAI's newer models)
    Responses          usage.input_tokens (all input), input_tokens_details.cached_tokens,
                       .cache_write_tokens
    Anthropic message  usage.input_tokens (only what follows the last breakpoint),
                       cache_read_input_tokens, cache_creation_input_tokens: all input is
                       their sum

A missing or malformed field counts as 0: a figure is never invented.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class PromptCacheUsage(NamedTuple):
    input_tokens: int  # every prompt token of the call
    read_tokens: int  # served from the provider's cache (billed at its cached-input price)
    write_tokens: int  # written to it (billed at its write price, where it has one)

    @property
    def uncached_tokens(self) -> int:
        return max(0, self.input_tokens - self.read_tokens - self.write_tokens)


def _int(mapping: Any, name: str) -> int:
    value = mapping.get(name) if isinstance(mapping, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def prompt_cache_usage(answer: Mapping[str, Any]) -> PromptCacheUsage:
    usage = answer.get("usage")
    if not isinstance(usage, Mapping):
        return PromptCacheUsage(0, 0, 0)
    if answer.get("type") == "message":  # Anthropic
        read = _int(usage, "cache_read_input_tokens")
        write = _int(usage, "cache_creation_input_tokens")
        return PromptCacheUsage(_int(usage, "input_tokens") + read + write, read, write)
    if "prompt_tokens" in usage:  # chat or legacy completions
        details = usage.get("prompt_tokens_details")
        total = _int(usage, "prompt_tokens")
    else:  # Responses
        details = usage.get("input_tokens_details")
        total = _int(usage, "input_tokens")
    return PromptCacheUsage(
        total, _int(details, "cached_tokens"), _int(details, "cache_write_tokens")
    )
