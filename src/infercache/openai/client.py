"""`wrap(client, cache)`: an official `openai` client (`OpenAI` or `AsyncOpenAI`) whose chat
completions and embeddings go through the cache; every other call is the client's own.

    client = wrap(openai.OpenAI(), cache)
    r = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[...], temperature=0,
        extra_body={"infercache": {"tenant": "acme", "tags": ["kb:pricing"]}})
    r.headers["x-infercache"], r.headers.get("age"), r.parse()   # "exact-hit", "12", the answer

How: `wrap` returns `client.with_options(http_client=<a caching http client>)`, the SDK's own
copy of the client (same key, base URL, retries, timeouts and connection pool), so every
attribute — `with_raw_response`, `with_streaming_response`, `.parse`, `embeddings`, `models`,
`responses`, streams and their chunk types — is the SDK's own. The caching client sits where
the SDK builds and sends its HTTP requests: it builds them with the wrapped client (its
headers, cookies, params) and sends them through `http_path.sync_send` / `async_send`, which
caches `POST .../chat/completions` (streams included) and `POST .../embeddings` (per input) and
hands every other request to the wrapped client's own `send`, untouched. http_path.py draws
that path.

Directives travel as in the gateway: an `infercache` object in the body (`extra_body=`), or
`Cache-Control` / `x-infercache-tags` / `x-infercache-context` headers (`extra_headers=`).
An upstream error status comes back as it came (the SDK raises and retries as usual) and
nothing is stored. A request the cache refuses (malformed directives, `only-if-cached` with no
entry) is an OpenAI-shaped error response with `x-should-retry: false`, so the SDK raises
`openai.BadRequestError` (400) or `openai.APIStatusError` (504) without retrying.

Both HTTP libraries the SDK accepts are supported: httpx2 (its default) and httpx (a legacy
`http_client=httpx.Client(...)`); the caching client is of the same library as the wrapped one.
The copy shares the wrapped client's connection pool: closing either closes both, as with
`with_options`.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import httpx
import httpx2
import openai

from infercache.cache import Cache
from infercache.openai.http_path import CachingRouter, async_send, sync_send

ClientT = TypeVar("ClientT", openai.OpenAI, openai.AsyncOpenAI)


def wrap(client: ClientT, cache: Cache) -> ClientT:
    """`client` with its chat completions and embeddings cached (see the module docstring)."""
    inner = client._client  # the SDK's http client: it has no public accessor
    caching: Any
    if isinstance(client, openai.AsyncOpenAI):
        caching = _caching_client(inner, cache, _ASYNC)
    elif isinstance(client, openai.OpenAI):
        caching = _caching_client(inner, cache, _SYNC)
    else:
        raise TypeError(f"wrap() takes an openai.OpenAI or openai.AsyncOpenAI, got {client!r}")
    wrapped: ClientT = client.with_options(http_client=caching)
    return wrapped


class _NoTransport(
    httpx.BaseTransport, httpx2.BaseTransport, httpx.AsyncBaseTransport, httpx2.AsyncBaseTransport
):
    """The caching clients' own pool is never used: every request goes through the wrapped
    client's `send`."""

    def handle_request(self, request: Any) -> Any:
        raise RuntimeError("the caching client sends through the wrapped client only")

    async def handle_async_request(self, request: Any) -> Any:
        raise RuntimeError("the caching client sends through the wrapped client only")


# -- the caching http clients: where the SDK builds and sends its requests --


class _Wrapping:
    """A caching http client around the SDK's own (`inner`): it builds requests with the
    wrapped client (its headers, cookies, params) and reports its state; its own pool goes
    unused (`_NoTransport`). Mixed in before an httpx/httpx2 client class."""

    def __init__(self, inner: Any, router: CachingRouter) -> None:
        cast(Any, super()).__init__(transport=_NoTransport(), trust_env=False)  # the http client
        self._inner, self._router = inner, router

    def build_request(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.build_request(*args, **kwargs)

    @property
    def is_closed(self) -> bool:
        closed: bool = self._inner.is_closed
        return closed


class _SyncCaching(_Wrapping):
    """Sends through `http_path.sync_send`, which calls the wrapped client's own `send`."""

    def send(self, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
        def forward(sent: Any, streamed: bool) -> Any:
            return self._inner.send(sent, stream=streamed, **kwargs)

        return sync_send(self._router, request, stream, forward)

    def close(self) -> None:
        self._inner.close()


class _AsyncCaching(_Wrapping):
    async def send(self, request: Any, *, stream: bool = False, **kwargs: Any) -> Any:
        async def forward(sent: Any, streamed: bool) -> Any:
            return await self._inner.send(sent, stream=streamed, **kwargs)

        return await async_send(self._router, request, stream, forward)

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Httpx2Caching(_SyncCaching, httpx2.Client):
    pass


class _HttpxCaching(_SyncCaching, httpx.Client):
    pass


class _AsyncHttpx2Caching(_AsyncCaching, httpx2.AsyncClient):
    pass


class _AsyncHttpxCaching(_AsyncCaching, httpx.AsyncClient):
    pass


# (the SDK's http client class, the caching client for it, their library), per SDK client kind
_Kinds = tuple[tuple[type, type[_Wrapping], Any], ...]
_SYNC: _Kinds = ((httpx2.Client, _Httpx2Caching, httpx2), (httpx.Client, _HttpxCaching, httpx))
_ASYNC: _Kinds = (
    (httpx2.AsyncClient, _AsyncHttpx2Caching, httpx2),
    (httpx.AsyncClient, _AsyncHttpxCaching, httpx),
)


def _caching_client(inner: object, cache: Cache, kinds: _Kinds) -> _Wrapping:
    """The caching client of `inner`'s library, around it."""
    for wrapped, caching, http in kinds:
        if isinstance(inner, wrapped):
            return caching(inner, CachingRouter(cache, http))
    raise TypeError(f"the client's http client is neither httpx2 nor httpx: {inner!r}")
