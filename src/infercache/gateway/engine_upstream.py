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
from infercache.gateway.upstream_protocols import CHAT_PATH, CompletionRoutes, UpstreamCall


class EngineUpstream(CompletionRoutes):
    records_prefix_metrics = True

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.name = f"engine:{engine.model_id}"

    async def _answer(self, path: str, body: dict[str, Any], call: UpstreamCall) -> dict[str, Any]:
        answer = self.engine.achat if path == CHAT_PATH else self.engine.atext_completion
        return await answer(body, call.tenant)

    def _events(
        self, path: str, body: dict[str, Any], call: UpstreamCall
    ) -> AsyncIterator[dict[str, Any]]:
        chunks = (
            self.engine.achat_stream if path == CHAT_PATH else self.engine.atext_completion_stream
        )
        return chunks({**body, "stream": True}, call.tenant)

    async def models(self) -> list[dict[str, Any]]:
        return self.engine.models()

    async def aclose(self) -> None:
        self.engine.close()
