"""Where the gateway sends misses over HTTP: `HTTPUpstream`, the Protocols of upstream_protocols.py
spoken to a server.

`HTTPUpstream` speaks to any OpenAI-compatible server (`infercache engine serve`, vLLM, SGLang,
llama.cpp, a provider) with one pooled `aiohttp.ClientSession` (chosen over httpx by measuring
what a miss adds: bench/README.md, "Gateway"). `map_aiohttp_errors` (upstream_errors.py) is
the one place aiohttp exceptions are translated: a connection failure or timeout before any
answer is `UpstreamUnavailableError` (the gateway's 502), a connection that breaks mid-answer is
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
`cache_salt` is dropped. For `openai` upstreams a body without a `prompt_cache_key` gets one
derived from the tenant and its system prompt (and the version, when known) with the same
secret (prompt_cache/cache_key.py), so the provider routes a
tenant's requests that share a prompt to where it is cached. Nothing else in the body changes.

An `anthropic` upstream (api.anthropic.com) takes its key as `x-api-key` and an
`anthropic-version`, and a client's `anthropic-beta` on; it serves `/v1/messages` only
(`post_json`, `post_events` carry any API's call, the Messages and Responses adapters' way in:
gateway/messages_endpoint.py, responses_endpoint.py).
"""

from __future__ import annotations

import base64
import hmac
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson

from infercache.chat import StreamChunk
from infercache.errors import UpstreamError
from infercache.gateway.forwarding import forwarded_headers, forwarded_query
from infercache.gateway.upstream_errors import map_aiohttp_errors, raise_for_status
from infercache.gateway.upstream_protocols import (
    CompletionRoutes,
    Forwarded,
    PassedRequest,
    UpstreamCall,
)
from infercache.prompt_cache.cache_key import with_prompt_cache_key
from infercache.urls import mask_credentials, split_credentials

log = logging.getLogger(__name__)

SALTED_KINDS = ("vllm", "sglang")  # servers that take a per-request `cache_salt`
KEYED_KINDS = ("openai",)  # providers routing by a `prompt_cache_key`
ANTHROPIC_VERSION = "2023-06-01"


# Hop-by-hop headers (RFC 9110 §7.6.1) and what the gateway sets itself.
_HOP_BY_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
    "transfer-encoding", "upgrade",
}  # fmt: skip
_NOT_FORWARDED_BACK = _HOP_BY_HOP | {"content-length", "server", "date"}
_CREDENTIALS = ("authorization", "x-api-key")  # where an upstream's own key goes


def cache_salt(secret: bytes, tenant: str, version: str | None = None) -> str:
    """The KV-cache salt of `tenant`: stable for one tenant, unguessable across tenants, and
    another for each model version the replica serves (no KV reused across versions)."""
    message = b"cache_salt\x00" + tenant.encode()
    if version is not None:
        message += b"\x00version\x00" + version.encode()
    return hmac.digest(secret, message, "sha256").hex()[:32]


class HTTPUpstream(CompletionRoutes):
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
            out["cache_salt"] = cache_salt(self._salt_secret, tenant, self._version_of(body))
        elif self._salt_secret is not None and self.kind in KEYED_KINDS:
            out = with_prompt_cache_key(self._salt_secret, tenant, out, self._version_of(body))
        return out

    def _version_of(self, body: dict[str, Any]) -> str | None:
        """The version this replica serves the body's model at (None: unknown)."""
        model = body.get("model")
        if self.salt_version is None or not isinstance(model, str):
            return None
        return self.salt_version(model)

    def _headers(self, tenant: str, api_key: str | None) -> dict[str, str]:
        """`api_key`: the caller's bearer, sent only when forwarding was configured."""
        headers = {"x-infercache-tenant": tenant, "content-type": "application/json"}
        key = self._api_key or (api_key if self._forward_client_key else None)
        if self.kind == "anthropic":
            headers["anthropic-version"] = ANTHROPIC_VERSION
            if key:
                headers["x-api-key"] = key
                return headers
        if key:
            headers["authorization"] = f"Bearer {key}"
        elif self._auth is not None:
            headers["authorization"] = self._auth
        return headers

    def _call_headers(self, call: UpstreamCall) -> dict[str, str]:
        """`_headers`, and an Anthropic client's `anthropic-beta` on to an anthropic upstream."""
        headers = self._headers(call.tenant, call.api_key)
        if call.beta and self.kind == "anthropic":
            headers["anthropic-beta"] = call.beta
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
        raise_for_status(status, content, retry_after)
        with map_aiohttp_errors(self.name, answering=True):
            result = orjson.loads(content)
        if not isinstance(result, dict):
            raise UpstreamError("the upstream sent a non-object answer")
        return result

    async def post_json(
        self, path: str, body: dict[str, Any], call: UpstreamCall
    ) -> dict[str, Any]:
        """One call of any API at `path` (`/chat/completions`, `/messages`, `/responses`), its
        JSON answer."""
        data = orjson.dumps(self._body(body, call.tenant))
        return await self._json("POST", path, self._call_headers(call), data)

    async def post_events(
        self, path: str, body: dict[str, Any], call: UpstreamCall
    ) -> AsyncIterator[StreamChunk]:
        """One streamed call of any API at `path`: each server-sent event's JSON data."""
        url = f"{self._url}{path}"
        with map_aiohttp_errors(self.name):
            response = await self._client().post(
                url,
                data=orjson.dumps({**self._body(body, call.tenant), "stream": True}),
                headers=self._call_headers(call),
            )
        try:
            with map_aiohttp_errors(self.name, answering=True):
                if response.status >= 400:
                    retry_after = response.headers.get("retry-after")
                    raise_for_status(response.status, await response.read(), retry_after)
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

    # Chat and legacy completions are POSTs at their paths, as any API's call.
    _answer = post_json
    _events = post_events

    async def embeddings(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        headers = self._headers(tenant, api_key)
        data = orjson.dumps({k: v for k, v in body.items() if k != "cache_salt"})
        return await self._json("POST", "/embeddings", headers, data)

    async def forward(self, request: PassedRequest) -> Forwarded:
        """Pass a request through with the client headers forwarding.py allows and our own
        credentials (never a gateway key); the answer streams back as it comes, still
        encoded."""
        secrets = request.secrets
        out = forwarded_headers(request.headers, secrets, also_allowed=self._forward_headers)
        ours = self._headers("", request.bearer)
        out.update({k: v for k, v in ours.items() if k in _CREDENTIALS})
        if "anthropic-version" in ours:
            out.setdefault("anthropic-version", ours["anthropic-version"])
        query = forwarded_query(request.query, secrets)
        url = f"{self._url}{request.path}" + (f"?{query}" if query else "")
        with map_aiohttp_errors(self.name):
            response = await self._client().request(
                request.method, url, headers=out, data=request.body, auto_decompress=False
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
        headers = {k: v for k, v in self._headers("", None).items() if k in _CREDENTIALS}
        url = f"{self._url.removesuffix('/v1')}/metrics"
        with map_aiohttp_errors(self.name):
            async with self._client().get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                content = await response.read()
                status = response.status
        raise_for_status(status, content)
        return content.decode()

    async def models(self) -> list[dict[str, Any]]:
        data = (await self._json("GET", "/models", self._headers("", None))).get("data", [])
        return [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
