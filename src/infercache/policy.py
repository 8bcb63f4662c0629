"""What may be cached, for how long. Pure functions of a request, a response and settings.

- Cacheable request: a sampled request (temperature > 0, or no temperature, which the OpenAI API
  treats as 1) without a `seed` is not cached unless `cache_sampled` is set: replaying one sample
  to every caller silently removes the variety they asked for. Anthropic Messages and OpenAI
  Responses take no seed: only `temperature: 0` is deterministic enough (and a Responses
  `reasoning` request is sampled): `is_sampled` of anthropic/request.py, responses/request.py.
  Nor is a request offering a tool marked `"x-side-effects": true` (on the tool or its
  `function`): the model's answer to it may be an action to take, and replaying "send the
  email" twice is not a saving.
- TTL: every entry has one. `default_ttl_s` is required in settings; a per-request `ttl_s` (or
  `Cache-Control: max-age`) overrides it but is capped by `max_ttl_s`. There is no "forever".
- Not cacheable, as the request logs and the analyzer name it (`not_cacheable_reason`): one of
  three fixed phrases, `SIDE_EFFECTS`, `SAMPLED` (with the configured `cache_sampled` and
  `default_temperature`), `NO_STORE` (`no-store`/`no-cache` in its directives), or None. The
  redacted request log (redaction.py) writes it and the analyzer (analyze/) reads it back.
- Storable response: a complete answer only. Never an error body, empty `choices`, a choice whose
  `finish_reason` is missing (partial / cut-off stream) or `content_filter`, or a refusal; for
  the other APIs, their module's `unstorable_reason` (a `max_tokens` cut-off, an `incomplete`
  response, a refusal, ...).
- Usage (`usage_tokens`, `cached_tokens`): read in whichever shape an answer carries (chat's
  `prompt_tokens`, Responses' and Anthropic's `input_tokens`: prompt_cache/usage.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infercache.anthropic import request as anthropic_request
from infercache.chat import COMPLETE_FINISH_REASONS
from infercache.prompt_cache.usage import prompt_cache_usage
from infercache.request import ChatRequest, Endpoint
from infercache.responses import request as responses_request


@dataclass(frozen=True, slots=True)
class CachePolicy:
    default_ttl_s: float
    max_ttl_s: float
    cache_sampled: bool = False
    # What a request without `temperature` samples at (the OpenAI API's default is 1).
    default_temperature: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.default_ttl_s <= self.max_ttl_s:
            raise ValueError(
                f"need 0 < default_ttl_s ({self.default_ttl_s}) <= max_ttl_s ({self.max_ttl_s})"
            )

    def uncacheable_reason(self, request: ChatRequest) -> str | None:
        """None if the request may be cached, else why not."""
        if has_side_effect_tools(request.body):
            return "offers a tool marked x-side-effects"
        if self.cache_sampled:
            return None
        sampled = _SAMPLED_APIS.get(request.endpoint)
        if sampled is not None:
            if not sampled(request.body):
                return None
            if request.body.get("reasoning") is not None:
                return "sampled (a reasoning request; the API takes no seed)"
            temperature = request.body.get("temperature", 1)
            return f"sampled (temperature={temperature}; the API takes no seed)"
        temperature = request.body.get("temperature")
        if temperature is None:
            temperature = self.default_temperature
        if temperature > 0 and request.body.get("seed") is None:
            return f"sampled (temperature={temperature}) without a seed"
        return None

    def ttl_s(self, request: ChatRequest) -> float:
        asked = request.directives.ttl_s
        return min(asked if asked is not None else self.default_ttl_s, self.max_ttl_s)


# The APIs that take no seed: whether a body samples (temperature 1 when absent).
_SAMPLED_APIS = {
    Endpoint.MESSAGES: anthropic_request.is_sampled,
    Endpoint.RESPONSES: responses_request.is_sampled,
}
_UNSTORABLE_APIS = {
    Endpoint.MESSAGES: anthropic_request.unstorable_reason,
    Endpoint.RESPONSES: responses_request.unstorable_reason,
}

SIDE_EFFECTS_MARKER = "x-side-effects"
SAMPLED = "sampled without a seed"
NO_STORE = "no-store or no-cache asked"
SIDE_EFFECTS = "tools with side effects"


def not_cacheable_reason(request: ChatRequest, policy: CachePolicy) -> str | None:
    """Why the exact cache would not serve `request` (one of three fixed phrases), or None."""
    if has_side_effect_tools(request.body):
        return SIDE_EFFECTS
    if policy.uncacheable_reason(request) is not None:
        return SAMPLED
    cc = request.directives.cache_control
    if cc.no_store or cc.no_cache:
        return NO_STORE
    return None


def has_side_effect_tools(body: Mapping[str, Any]) -> bool:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return False
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        if tool.get(SIDE_EFFECTS_MARKER) is True or (
            isinstance(function, Mapping) and function.get(SIDE_EFFECTS_MARKER) is True
        ):
            return True
    return False


def unstorable_reason(
    response: Mapping[str, Any], endpoint: Endpoint = Endpoint.CHAT
) -> str | None:
    """None if `response` is a complete answer of `endpoint`'s API that may be stored, else
    why not."""
    other = _UNSTORABLE_APIS.get(endpoint)
    if other is not None:
        return "error response" if response.get("error") is not None else other(response)
    if response.get("error") is not None:
        return "error response"
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no choices"
    for choice in choices:
        if not isinstance(choice, Mapping):
            return "malformed choice"
        finish = choice.get("finish_reason")
        if finish not in COMPLETE_FINISH_REASONS:
            return f"finish_reason {finish!r}"
        message = choice.get("message")
        if isinstance(message, Mapping) and message.get("refusal"):
            return "refusal"
    return None


def usage_tokens(response: Mapping[str, Any]) -> tuple[int, int]:
    """(prompt_tokens, completion_tokens) from a response's usage, in any API's shape (every
    input token, cache reads and writes included); zeros when absent."""
    usage = response.get("usage")
    if not isinstance(usage, Mapping):
        return 0, 0
    if "prompt_tokens" not in usage and "completion_tokens" not in usage:  # Responses, Messages
        output = usage.get("output_tokens")
        prompt_in = prompt_cache_usage(response).input_tokens
        return prompt_in, output if isinstance(output, int) and not isinstance(output, bool) else 0
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) else 0,
        completion if isinstance(completion, int) else 0,
    )


def cached_tokens(response: Mapping[str, Any]) -> int:
    """Prompt tokens the upstream served from its prefix cache (`usage.prompt_tokens_details
    .cached_tokens`, or the other APIs' own names: prompt_cache/usage.py); zero when absent."""
    return prompt_cache_usage(response).read_tokens
