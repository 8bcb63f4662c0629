"""`Cache.acomplete` does what `complete` does: live verification of semantic hits runs, and
neither the embedder nor the store ever runs on the event loop."""

from __future__ import annotations

import asyncio
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from infercache.cache import Cache
from infercache.clock import ManualClock
from infercache.completion import Layer
from infercache.semantic.embedder import HashingEmbedder, Matrix
from infercache.semantic.guards import build_guards
from infercache.semantic.judges import ExactAnswerJudge
from infercache.semantic.layer import SemanticConfig
from infercache.semantic.verify import FalseHitMonitor, Verifier
from infercache.settings import Settings
from tests.harness.upstreams import CountingUpstream
from tests.harness.vocabulary import chat


class ThreadRecordingEmbedder(HashingEmbedder):
    """The n-gram twin embedder, noting which threads it ran on."""

    def __init__(self) -> None:
        super().__init__(dim=512)
        self.threads: set[int] = set()

    def embed(self, texts: list[str]) -> Matrix:  # type: ignore[override]
        self.threads.add(threading.get_ident())
        return super().embed(texts)


def ask(question: str) -> dict[str, Any]:
    return chat(question, system="You are a support bot.")


@pytest.mark.anyio
async def test_acomplete_verifies_hits_and_keeps_the_embedder_off_the_loop(
    tmp_path: Path, clock: ManualClock, upstream: CountingUpstream
) -> None:
    cache = Cache(
        Settings(data_dir=tmp_path, store_url=f"sqlite:///{tmp_path}/c.db", default_ttl_s=100),
        clock=clock,
    )
    embedder = ThreadRecordingEmbedder()
    judged: list[tuple[str, str]] = []

    class RecordingJudge(ExactAnswerJudge):
        def same(self, request: Any, cached: Any, fresh: Any) -> bool:
            judged.append((cached["id"], fresh["id"]))
            return bool(super().same(request, cached, fresh))

    background = ThreadPoolExecutor(1)
    verifier = Verifier(
        RecordingJudge(),
        FalseHitMonitor(target_false_hit=0.01),
        sample_rate=1.0,
        rng=random.Random(0),
        executor=background,
    )
    cache.enable_semantic(
        embedder,
        config=SemanticConfig(threshold=0.7),
        guards=build_guards(["numbers", "negation"]),
        verifier=verifier,
    )
    loop_thread = threading.get_ident()

    async def aupstream(body: dict[str, Any]) -> dict[str, Any]:
        assert threading.get_ident() == loop_thread  # the upstream itself runs on the loop
        return await upstream.acall(body)

    first = await cache.acomplete(ask("How do I reset my password?"), aupstream)
    near = await cache.acomplete(ask("How can I reset my password?"), aupstream)
    assert (first.layer, near.layer) == (Layer.MISS, Layer.SEMANTIC)
    await asyncio.to_thread(background.shutdown, wait=True)  # the verification has run
    assert len(judged) == 1  # the hit was re-asked upstream and judged
    assert upstream.calls == 2
    assert embedder.threads
    assert loop_thread not in embedder.threads
    cache.close()
