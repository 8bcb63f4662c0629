"""Where the gateway sends misses: the `Upstream` Protocol and its HTTP implementation.

`HTTPUpstream` speaks to any OpenAI-compatible server (`infercache engine serve`, vLLM, SGLang,
llama.cpp, a provider) with one pooled `aiohttp.ClientSession` (chosen over httpx by measuring
what a miss adds: bench/README.md, "Gateway"). `map_aiohttp_errors` is the one place
aiohttp exceptions are translated: a connection failure or timeout before any answer is
`UpstreamUnavailableError` (the gateway's 502), a connection that breaks mid-answer is
`UpstreamError`; the details (URL, library text) are logged, never sent to the client. An answer
with an error status is `UpstreamError` carrying that status and the upstream's own error body,
so the client sees what the upstream said.

Credentials: the upstream's own `api_key` (configured per upstream) as a bearer, or HTTP Basic
auth from `user:password@` in its URL; a caller's bearer only when the gateway was started with
`forward_client_key` (open mode). A passed-through request keeps only the client headers
forwarding.py allows. `name` is the URL with its credentials masked: it is what logs
and `/stats` show.

The tenant is forwarded as an `x-infercache-tenant` header, which the built-in engine uses to
salt its KV prefix cache. For vLLM and SGLang upstreams (`kind`), the body's `cache_salt` is set
from the tenant and the model version the replica serves (`salt_version`, gateway/versions.py),
`HMAC(deployment secret, tenant, version)`, replacing whatever the client sent, so one tenant's
time to first token can never reveal what another sent (vLLM CVE-2025-46570), no client can
choose another's salt, and no KV is reused across versions; for other kinds a client's
`cache_salt` is dropped. Nothing else in the body is changed.
"""

from __future__ import annotations

import base64
import hmac
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import aiohttp
import orjson

from infercache.chat import StreamChunk
from infercache.errors import UpstreamError, UpstreamUnavailableError
from infercache.gateway.forwarding import forwarded_headers, forwarded_query
from infercache.urls import mask_credentials, split_credentials

log = logging.getLogger(__name__)

SALTED_KINDS = ("vllm", "sglang")  # servers that take a per-request `cache_salt`


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
    ) -> AsyncIterator[StreamChunk]:
        """`chat.completion.chunk`s; raises UpstreamError before the first one on refusal."""
        ...

    async def models(self) -> list[dict[str, Any]]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class TextCompletions(Protocol):
    """An upstream that also serves the legacy `/v1/completions` (prompt → text)."""

    async def complete_text(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]: ...

    def stream_text(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> AsyncIterator[StreamChunk]: ...


class EmbeddingsUpstream(Protocol):
    """Where the gateway's `/v1/embeddings` misses go: an HTTP upstream, or the packaged
    embedder in process (local_embeddings.py)."""

    name: str

    async def embeddings(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        """An OpenAI `/v1/embeddings` answer for `body`."""
        ...


def map_aiohttp_errors(name: str, *, answering: bool = False) -> AbstractContextManager[None]:
    """Translate aiohttp's exceptions into ours. `answering`: the upstream had begun to answer
    (a stream), so a failure is a broken answer rather than an unreachable upstream."""
    return _AiohttpErrors(name, answering)


class _AiohttpErrors:
    """`map_aiohttp_errors`' context (a class: it runs twice on every upstream call)."""

    __slots__ = ("_answering", "_name")

    def __init__(self, name: str, answering: bool) -> None:
        self._name = name
        self._answering = answering

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, (aiohttp.ClientError, TimeoutError)):
            log.warning("upstream %s failed: %r", self._name, exc)
            if self._answering:
                raise UpstreamError("the upstream connection broke mid-answer") from exc
            raise UpstreamUnavailableError("the upstream is unreachable") from exc
        if isinstance(exc, (orjson.JSONDecodeError, UnicodeDecodeError)):
            log.warning("upstream %s sent an invalid answer: %s", self._name, exc)
            raise UpstreamError("the upstream sent an invalid answer") from exc


def _raise_for_status(status: int, content: bytes, retry_after: str | None = None) -> None:
    if status < 400:
        return
    try:
        parsed = orjson.loads(content)
        body = parsed if isinstance(parsed, dict) else None
    except orjson.JSONDecodeError:
        body = None
    message = f"upstream answered {status}"
    if body and isinstance(body.get("error"), Mapping):
        message = str(body["error"].get("message", message))
    raise UpstreamError(message, status_code=status, body=body, retry_after=retry_after)


# Hop-by-hop headers (RFC 9110 §7.6.1) and what the gateway sets itself.
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade",
}  # fmt: skip
_NOT_FORWARDED_BACK = _HOP_BY_HOP | {"content-length", "server", "date"}


@dataclass(frozen=True, slots=True)
class Forwarded:
    """An upstream's answer to a passed-through request, its body still streaming."""

    status: int
    headers: list[tuple[str, str]]
    body: AsyncIterator[bytes]


@runtime_checkable
class PassThrough(Protocol):
    """An upstream that can take any request as is (an HTTP server; not the in-process engine)."""

    name: str

    async def forward(
        self,
        method: str,
        path: str,
        *,
        query: str,
        headers: Mapping[str, str],
        body: AsyncIterator[bytes],
        bearer: str | None,
        secrets: Sequence[str],
    ) -> Forwarded:
        """`headers` and `query` as the client sent them: the upstream keeps only what
        forwarding.py allows and no value holding one of `secrets`."""


def cache_salt(secret: bytes, tenant: str, version: str | None = None) -> str:
    """The KV-cache salt of `tenant`: stable for one tenant, unguessable across tenants, and
    another for each model version the replica serves (no KV reused across versions)."""
    message = b"cache_salt\x00" + tenant.encode()
    if version is not None:
        message += b"\x00version\x00" + version.encode()
    return hmac.digest(secret, message, "sha256").hex()[:32]


class HTTPUpstream:
    records_prefix_metrics = False

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        forward_client_key: bool = False,
        forward_headers: frozenset[str] = frozenset(),
        kind: str = "openai",
        salt_secret: bytes | None = None,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 256,
    ) -> None:
        url, user, password = split_credentials(base_url.rstrip("/"))
        self.name = mask_credentials(base_url.rstrip("/"))
        self._url = url
        self._auth = (
            "Basic " + base64.b64encode(f"{user or ''}:{password or ''}".encode()).decode()
            if user is not None or password is not None
            else None
        )
        self._api_key = api_key
        self._forward_client_key = forward_client_key
        self._forward_headers = frozenset(h.lower() for h in forward_headers)
        self.kind = kind
        if kind in SALTED_KINDS and salt_secret is None:
            raise ValueError(f"a {kind} upstream needs a salt secret")
        self._salt_secret = salt_secret
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_connect=connect_timeout_s,
            sock_read=timeout_s,
        )  # fmt: skip
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        # The version this replica serves a model at (gateway/versions.py), for its KV salt.
        self.salt_version: Callable[[str], str | None] | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Built on first use: a session belongs to the event loop that serves requests.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=self._max_connections),
            )
        return self._session

    def _body(self, body: dict[str, Any], tenant: str) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if k != "cache_salt"}
        if self._salt_secret is not None and self.kind in SALTED_KINDS:
            model = body.get("model")
            version = (
                self.salt_version(model)
                if self.salt_version is not None and isinstance(model, str)
                else None
            )
            out["cache_salt"] = cache_salt(self._salt_secret, tenant, version)
        return out

    def _headers(self, tenant: str, api_key: str | None) -> dict[str, str]:
        """`api_key`: the caller's bearer, sent only when forwarding was configured."""
        headers = {"x-infercache-tenant": tenant, "content-type": "application/json"}
        key = self._api_key or (api_key if self._forward_client_key else None)
        if key:
            headers["authorization"] = f"Bearer {key}"
        elif self._auth is not None:
            headers["authorization"] = self._auth
        return headers

    async def _json(
        self, method: str, path: str, headers: dict[str, str], data: bytes | None = None
    ) -> dict[str, Any]:
        """One request, its JSON object answer; our errors for every way it can fail."""
        with map_aiohttp_errors(self.name):
            async with self._client().request(
                method, f"{self._url}{path}", data=data, headers=headers
            ) as response:
                content = await response.read()
                status = response.status
                retry_after = response.headers.get("retry-after")
        _raise_for_status(status, content, retry_after)
        with map_aiohttp_errors(self.name, answering=True):
            result = orjson.loads(content)
        if not isinstance(result, dict):
            raise UpstreamError("the upstream sent a non-object answer")
        return result

    async def complete(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        return await self._complete("/chat/completions", body, tenant, api_key)

    def stream(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> AsyncIterator[StreamChunk]:
        return self._stream("/chat/completions", body, tenant, api_key)

    async def complete_text(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        return await self._complete("/completions", body, tenant, api_key)

    def stream_text(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> AsyncIterator[StreamChunk]:
        return self._stream("/completions", body, tenant, api_key)

    async def _complete(
        self, path: str, body: dict[str, Any], tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        headers = self._headers(tenant, api_key)
        data = orjson.dumps(self._body(body, tenant))
        return await self._json("POST", path, headers, data)

    async def _stream(
        self, path: str, body: dict[str, Any], tenant: str, api_key: str | None
    ) -> AsyncIterator[StreamChunk]:
        url = f"{self._url}{path}"
        with map_aiohttp_errors(self.name):
            response = await self._client().post(
                url,
                data=orjson.dumps({**self._body(body, tenant), "stream": True}),
                headers=self._headers(tenant, api_key),
            )
        try:
            with map_aiohttp_errors(self.name, answering=True):
                if response.status >= 400:
                    retry_after = response.headers.get("retry-after")
                    _raise_for_status(response.status, await response.read(), retry_after)
                async for raw in response.content:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    chunk = orjson.loads(data)
                    if isinstance(chunk, dict) and chunk.get("error") is not None:
                        raise UpstreamError("the upstream's stream failed", body=chunk)
                    yield chunk
        finally:
            response.release()

    async def embeddings(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        headers = self._headers(tenant, api_key)
        data = orjson.dumps({k: v for k, v in body.items() if k != "cache_salt"})
        return await self._json("POST", "/embeddings", headers, data)

    async def forward(
        self,
        method: str,
        path: str,
        *,
        query: str,
        headers: Mapping[str, str],
        body: AsyncIterator[bytes],
        bearer: str | None,
        secrets: Sequence[str],
    ) -> Forwarded:
        """Pass a request through with the client headers forwarding.py allows and our own
        credentials (never a gateway key); the answer streams back as it comes, still
        encoded."""
        out = forwarded_headers(headers, secrets, also_allowed=self._forward_headers)
        out.update({k: v for k, v in self._headers("", bearer).items() if k == "authorization"})
        query = forwarded_query(query, secrets)
        url = f"{self._url}{path}" + (f"?{query}" if query else "")
        with map_aiohttp_errors(self.name):
            response = await self._client().request(
                method, url, headers=out, data=body, auto_decompress=False
            )
        kept = [(k, v) for k, v in response.headers.items() if k.lower() not in _NOT_FORWARDED_BACK]

        async def content() -> AsyncIterator[bytes]:
            try:
                with map_aiohttp_errors(self.name, answering=True):
                    async for piece in response.content.iter_any():
                        yield piece
            finally:
                response.release()

        return Forwarded(response.status, kept, content())

    async def metrics_text(self, timeout_s: float = 2.0) -> str:
        """The server's Prometheus `/metrics` (at its root, beside `/v1`): its load signals."""
        headers = {k: v for k, v in self._headers("", None).items() if k == "authorization"}
        url = f"{self._url.removesuffix('/v1')}/metrics"
        with map_aiohttp_errors(self.name):
            async with self._client().get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                content = await response.read()
                status = response.status
        _raise_for_status(status, content)
        return content.decode()

    async def models(self) -> list[dict[str, Any]]:
        data = (await self._json("GET", "/models", self._headers("", None))).get("data", [])
        return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
