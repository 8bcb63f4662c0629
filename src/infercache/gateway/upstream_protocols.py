"""What the gateway asks of an upstream, as Protocols (implemented by upstream.py's
`HTTPUpstream` and engine_upstream.py's in-process engine, and by test doubles):

    Upstream            chat completions, whole or streamed, and its `/v1/models`
    TextCompletions     the legacy `/v1/completions` too (prompt → text)
    EmbeddingsUpstream  `/v1/embeddings` (an HTTP upstream, or the packaged embedder)
    PassThrough         any request as is, for paths the gateway does not cache (`Forwarded`:
                        the answer, its body still streaming)
    ProviderAPI         any API's call in its own shape (the Messages and Responses adapters'
                        way to a provider that speaks them natively)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from infercache.chat import StreamChunk


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


@runtime_checkable
class ProviderAPI(Protocol):
    """An HTTP upstream that can carry any API's call (HTTPUpstream): how the Messages and
    Responses adapters reach a provider natively (`kind`: anthropic, openai, ...)."""

    kind: str

    async def post_json(
        self,
        path: str,
        body: dict[str, Any],
        *,
        tenant: str,
        api_key: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]: ...

    def post_events(
        self,
        path: str,
        body: dict[str, Any],
        *,
        tenant: str,
        api_key: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[StreamChunk]: ...
