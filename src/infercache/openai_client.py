"""`wrap(client, cache)`: route an official `openai` client's `chat.completions.create` through
the cache. Everything else on the client is passed through untouched.

    client = wrap(openai.OpenAI(), cache)          # or openai.AsyncOpenAI()
    r = client.chat.completions.create(model=..., messages=..., temperature=0,
                                       infercache={"tenant": "acme", "tags": ["kb:v7"]})
    r.infercache  # {"layer": "exact", "age_s": 12.5}

Directives go in an `infercache=` keyword (or `extra_body={"infercache": ...}`). Streaming
requests (`stream=True`) are passed straight to the client and counted as `bypassed`: the
gateway caches streams; this wrapper does not.
"""

from __future__ import annotations

from typing import Any

import openai
from openai.types.chat import ChatCompletion

from infercache.cache import Cache, Completion
from infercache.metrics import MissReason

# Keywords of `create` that configure the HTTP call rather than the request body.
_TRANSPORT_KWARGS = ("extra_headers", "extra_query", "timeout")


def _split(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(request body, transport options) from `create`'s keyword arguments."""
    transport = {k: kwargs[k] for k in _TRANSPORT_KWARGS if k in kwargs}
    body = {k: v for k, v in kwargs.items() if k not in _TRANSPORT_KWARGS and k != "extra_body"}
    body.update(kwargs.get("extra_body") or {})
    return body, transport


def _call_kwargs(body: dict[str, Any], transport: dict[str, Any]) -> dict[str, Any]:
    # model and messages by name; every other field as raw JSON so unknown ones survive too.
    rest = {k: v for k, v in body.items() if k not in ("model", "messages")}
    return {"model": body["model"], "messages": body["messages"], "extra_body": rest, **transport}


def _result(done: Completion) -> ChatCompletion:
    result = ChatCompletion.model_validate(done.response)
    # The client's models allow extra fields; this one tells the caller which layer answered.
    result.infercache = {"layer": done.layer.value, "age_s": done.age_s}  # type: ignore[attr-defined]
    return result


class _Completions:
    def __init__(self, client: openai.OpenAI, cache: Cache) -> None:
        self._client = client
        self._cache = cache

    def create(self, **kwargs: Any) -> Any:
        if kwargs.get("stream"):
            self._cache.metrics.strategy("exact").miss(MissReason.BYPASSED)
            return self._client.chat.completions.create(**kwargs)
        body, transport = _split(kwargs)

        def upstream(request: dict[str, Any]) -> dict[str, Any]:
            response = self._client.chat.completions.create(**_call_kwargs(request, transport))
            dumped: dict[str, Any] = response.model_dump(mode="json", exclude_unset=True)
            return dumped

        return _result(self._cache.complete(body, upstream))


class _AsyncCompletions:
    def __init__(self, client: openai.AsyncOpenAI, cache: Cache) -> None:
        self._client = client
        self._cache = cache

    async def create(self, **kwargs: Any) -> Any:
        if kwargs.get("stream"):
            self._cache.metrics.strategy("exact").miss(MissReason.BYPASSED)
            return await self._client.chat.completions.create(**kwargs)
        body, transport = _split(kwargs)

        async def upstream(request: dict[str, Any]) -> dict[str, Any]:
            call = _call_kwargs(request, transport)
            response = await self._client.chat.completions.create(**call)
            dumped: dict[str, Any] = response.model_dump(mode="json", exclude_unset=True)
            return dumped

        return _result(await self._cache.acomplete(body, upstream))


class _Chat:
    def __init__(self, completions: _Completions | _AsyncCompletions) -> None:
        self.completions = completions


class CachedClient:
    """The wrapped client: `.chat.completions.create` is cached, the rest is the client's."""

    def __init__(self, client: openai.OpenAI | openai.AsyncOpenAI, cache: Cache) -> None:
        self._client = client
        completions: _Completions | _AsyncCompletions
        if isinstance(client, openai.AsyncOpenAI):
            completions = _AsyncCompletions(client, cache)
        else:
            completions = _Completions(client, cache)
        self.chat = _Chat(completions)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def wrap(client: openai.OpenAI | openai.AsyncOpenAI, cache: Cache) -> CachedClient:
    return CachedClient(client, cache)
