"""Where the gateway sends misses: the `Upstream` Protocol and its HTTP implementation.

`HTTPUpstream` speaks to any OpenAI-compatible server (`infercache engine serve`, vLLM, SGLang,
llama.cpp, a provider) with one pooled `httpx.AsyncClient`. It is the one place httpx exceptions
are translated: a connection failure or timeout before any answer is `UpstreamUnavailableError`
(the gateway's 502); an answer with an error status is `UpstreamError` carrying that status and
the upstream's own error body, so the client sees what the upstream said.

The tenant is forwarded as an `x-infercache-tenant` header, which the built-in engine uses to
salt its KV prefix cache; other servers ignore it. The request body is never changed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import httpx

from infercache.errors import UpstreamError, UpstreamUnavailableError

Chunk = dict[str, Any]


class Upstream(Protocol):
    name: str
    # True when the upstream records the `prefix` strategy in our Metrics itself (the
    # in-process engine); otherwise the gateway counts it from `usage.cached_tokens`.
    records_prefix_metrics: bool

    async def complete(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]: ...

    def stream(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> AsyncIterator[Chunk]:
        """`chat.completion.chunk`s; raises UpstreamError before the first one on refusal."""
        ...

    async def models(self) -> list[dict[str, Any]]: ...

    async def aclose(self) -> None: ...


def _error_body(response: httpx.Response) -> dict[str, Any] | None:
    try:
        body = response.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _raise_for_status(response: httpx.Response, content: bytes | None = None) -> None:
    if response.status_code < 400:
        return
    body = None
    if content is not None:
        try:
            parsed = json.loads(content)
            body = parsed if isinstance(parsed, dict) else None
        except ValueError:
            body = None
    else:
        body = _error_body(response)
    message = f"upstream answered {response.status_code}"
    if body and isinstance(body.get("error"), Mapping):
        message = str(body["error"].get("message", message))
    raise UpstreamError(message, status_code=response.status_code, body=body)


class HTTPUpstream:
    records_prefix_metrics = False

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 256,
    ) -> None:
        self.name = base_url.rstrip("/")
        self._api_key = api_key
        self._client = httpx.AsyncClient(
            base_url=self.name,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=max_connections),
        )

    def _headers(self, tenant: str, api_key: str | None) -> dict[str, str]:
        headers = {"x-infercache-tenant": tenant}
        key = self._api_key or api_key
        if key:
            headers["authorization"] = f"Bearer {key}"
        return headers

    def _unavailable(self, exc: httpx.HTTPError) -> UpstreamUnavailableError:
        return UpstreamUnavailableError(f"upstream {self.name} unreachable: {exc!r}")

    async def complete(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        try:
            response = await self._client.post(
                "/chat/completions", json=body, headers=self._headers(tenant, api_key)
            )
        except httpx.HTTPError as exc:
            raise self._unavailable(exc) from exc
        _raise_for_status(response)
        try:
            result = response.json()
        except ValueError as exc:
            raise UpstreamError(f"upstream {self.name} sent invalid JSON: {exc}") from exc
        if not isinstance(result, dict):
            raise UpstreamError(f"upstream {self.name} sent a non-object answer")
        return result

    async def stream(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> AsyncIterator[Chunk]:
        request = self._client.build_request(
            "POST",
            "/chat/completions",
            json={**body, "stream": True},
            headers=self._headers(tenant, api_key),
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._unavailable(exc) from exc
        try:
            if response.status_code >= 400:
                _raise_for_status(response, await response.aread())
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    return
                chunk = json.loads(data)
                if isinstance(chunk, dict) and chunk.get("error") is not None:
                    raise UpstreamError(
                        f"upstream {self.name} stream failed: {chunk['error']}", body=chunk
                    )
                yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream {self.name} stream broke: {exc!r}") from exc
        except ValueError as exc:
            raise UpstreamError(f"upstream {self.name} sent an invalid chunk: {exc}") from exc
        finally:
            await response.aclose()

    async def models(self) -> list[dict[str, Any]]:
        try:
            response = await self._client.get("/models", headers=self._headers("", None))
        except httpx.HTTPError as exc:
            raise self._unavailable(exc) from exc
        _raise_for_status(response)
        data = response.json().get("data", [])
        return [m for m in data if isinstance(m, dict)]

    async def aclose(self) -> None:
        await self._client.aclose()
