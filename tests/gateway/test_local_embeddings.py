"""`./run serve`'s embeddings (the packaged MiniLM, in process) answer only the model they are:
another model id is a 404 as chat's is, never MiniLM vectors under another name (issue 26
item 6)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infercache.gateway.build import build
from infercache.gateway.config import GatewayConfig
from infercache.gateway.http_server import server_config
from infercache.settings import Settings
from tests.harness.servers import serve


class NoChat:
    """An in-process upstream that is not HTTP (as the built-in engine is), answering no chat:
    with it, the gateway's embeddings are the packaged MiniLM (build.py `_embedder`)."""

    name = "no-chat"
    records_prefix_metrics = False

    async def complete(self, body: dict[str, Any], *, tenant: str, api_key: str | None) -> Any:
        raise AssertionError("not asked in these tests")

    async def stream(
        self, body: dict[str, Any], *, tenant: str, api_key: str | None
    ) -> AsyncIterator[Any]:
        raise AssertionError("not asked in these tests")
        yield

    async def models(self) -> list[dict[str, Any]]:
        return []

    async def aclose(self) -> None:
        return None


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[httpx.Client]:
    """A gateway whose embeddings are the in-process MiniLM, as `./run serve`'s are."""
    settings = Settings(data_dir=tmp_path, store_url=f"sqlite:///{tmp_path / 'g.db'}")
    built = build(settings, GatewayConfig(version_poll_s=None), upstreams=[NoChat()])
    config = server_config(built.app)
    config.pop("app")
    with serve(built.app, **config) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client


def test_an_unknown_embedding_model_is_a_404_like_chat(embedded: httpx.Client) -> None:
    r = embedded.post("/v1/embeddings", json={"model": "text-embedding-3-small", "input": "hi"})
    assert r.status_code == 404
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "`text-embedding-3-small` does not exist" in error["message"]
    assert "all-MiniLM-L6-v2" in error["message"]  # what it does serve


@pytest.mark.slow  # loads the packaged MiniLM
def test_the_packaged_model_answers_under_its_own_names(embedded: httpx.Client) -> None:
    for name in ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"):
        r = embedded.post("/v1/embeddings", json={"model": name, "input": ["a", "b"]})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["model"] == "all-MiniLM-L6-v2"
        assert [len(d["embedding"]) for d in answer["data"]] == [384, 384]
