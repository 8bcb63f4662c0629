"""What the gateway asks of an upstream, as Protocols (implemented by upstream.py's
`HTTPUpstream` and engine_upstream.py's in-process engine, and by test doubles):

    Upstream            chat completions, whole or streamed, and its `/v1/models`
    TextCompletions     the legacy `/v1/completions` too (prompt → text)
    EmbeddingsUpstream  `/v1/embeddings` (an HTTP upstream, or the packaged embedder)
    PassThrough         any request as is (a `PassedRequest`), for paths the gateway does not
                        cache (`Forwarded`: the answer, its body still streaming)
    ProviderAPI         any API's call in its own shape (the Messages and Responses adapters'
                        way to a provider that speaks them natively), for an `UpstreamCall`:
                        who the call is for

`CompletionRoutes` is what both implementations share: `Upstream`'s and `TextCompletions`' four
calls as one call at the API's OpenAI path (`CHAT_PATH`, `TEXT_PATH`), whole or streamed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

from infercache.chat import StreamChunk


class UpstreamCall(NamedTuple):
    """Who a call is for: the tenant (the KV salt, the derived prompt-cache key), the caller's
    bearer (sent only when configured) and an Anthropic client's beta header."""

    tenant: str
    api_key: str | None  # the caller's bearer: sent upstream only when configured to
    beta: str | None = None  # an Anthropic client's `anthropic-beta`, sent on


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


CHAT_PATH = "/chat/completions"
TEXT_PATH = "/completions"


class CompletionRoutes(ABC):
    """`Upstream.complete`/`stream` and `TextCompletions.complete_text`/`stream_text` for an
    upstream that serves chat and legacy completions alike: each is one call at the API's path,
    whole (`_answer`) or streamed (`_events`), as the subclass makes it (HTTPUpstream posts it,
    EngineUpstream awaits the engine's entry point for it)."""

    async def complete(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        return await self._answer(CHAT_PATH, body, UpstreamCall(tenant, api_key))

    def stream(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> AsyncIterator[StreamChunk]:
        return self._events(CHAT_PATH, body, UpstreamCall(tenant, api_key))

    async def complete_text(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        return await self._answer(TEXT_PATH, body, UpstreamCall(tenant, api_key))

    def stream_text(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> AsyncIterator[StreamChunk]:
        return self._events(TEXT_PATH, body, UpstreamCall(tenant, api_key))

    @abstractmethod
    async def _answer(
        self, path: str, body: dict[str, Any], call: UpstreamCall
    ) -> dict[str, Any]: ...

    @abstractmethod
    def _events(
        self, path: str, body: dict[str, Any], call: UpstreamCall
    ) -> AsyncIterator[StreamChunk]:
        """The chunks; raises before the first one when the call is refused (the engine's
        full queue: at the call)."""


class EmbeddingsUpstream(Protocol):
    """Where the gateway's `/v1/embeddings` misses go: an HTTP upstream, or the packaged
    embedder in process (local_embeddings.py)."""

    name: str

    async def embeddings(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        """An OpenAI `/v1/embeddings` answer for `body`."""
        ...


@dataclass(frozen=True, slots=True)
class PassedRequest:
    """A request to pass through: `headers` and `query` as the client sent them (the upstream
    keeps only what forwarding.py allows and no value holding one of `secrets`), its body still
    streaming in, and the caller's bearer."""

    method: str
    path: str
    query: str
    headers: Mapping[str, str]
    body: AsyncIterator[bytes]
    bearer: str | None
    secrets: Sequence[str]


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

    async def forward(self, request: PassedRequest) -> Forwarded: ...


@runtime_checkable
class ProviderAPI(Protocol):
    """An HTTP upstream that can carry any API's call (HTTPUpstream): how the Messages and
    Responses adapters reach a provider natively (`kind`: anthropic, openai, ...)."""

    kind: str

    async def post_json(
        self, path: str, body: dict[str, Any], call: UpstreamCall
    ) -> dict[str, Any]:
        """One call of any API at `path` (`/messages`, `/responses`), its JSON answer."""

    def post_events(
        self, path: str, body: dict[str, Any], call: UpstreamCall
    ) -> AsyncIterator[StreamChunk]:
        """One streamed call of any API at `path`: each server-sent event's JSON data."""


def native_api(upstream: Upstream, kind: str) -> ProviderAPI | None:
    """`upstream` when it carries `kind`'s own API (a `ProviderAPI` of that kind): the Messages
    adapter's way to an anthropic upstream, the Responses adapter's to an openai one."""
    return upstream if isinstance(upstream, ProviderAPI) and upstream.kind == kind else None
