"""The built-in engine as the gateway's upstream, in the same process (the embedded default).

No HTTP hop: the engine's asyncio API is awaited directly, its errors are already our own
exceptions (bad input: 4xx; a full queue: `OverloadedError`, a 429 with Retry-After, raised by
the call before any chunk, so the gateway passes it through and stores nothing), and it records
the `prefix` strategy into the shared `Metrics` itself. `cache_salt` in the body splits the
engine's prefix cache as vLLM's does. It serves the legacy `/v1/completions` too
(`TextCompletions`: a raw prompt, no chat template), with the same errors.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from infercache.engine.engine import Engine


class EngineUpstream:
    records_prefix_metrics = True

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.name = f"engine:{engine.model_id}"

    async def complete(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        return await self.engine.achat(body, tenant)

    def stream(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> AsyncIterator[dict[str, Any]]:
        return self.engine.achat_stream({**body, "stream": True}, tenant)

    async def complete_text(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> dict[str, Any]:
        return await self.engine.atext_completion(body, tenant)

    def stream_text(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> AsyncIterator[dict[str, Any]]:
        return self.engine.atext_completion_stream({**body, "stream": True}, tenant)

    async def models(self) -> list[dict[str, Any]]:
        return self.engine.models()

    async def aclose(self) -> None:
        self.engine.close()
