"""Gateway fixtures: a fake provider and a real gateway, both on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from infercache.clock import Clock
from infercache.gateway.build import Built, build
from infercache.gateway.config import GatewayConfig
from infercache.gateway.http_server import server_config
from infercache.settings import Settings
from tests.harness.servers import serve
from tests.harness.upstreams import FakeUpstream
from tests.harness.vocabulary import chat
from tests.observed_gateway import assert_token_hit_rates_at_most_one


@dataclass
class Running:
    url: str
    built: Built
    fake: FakeUpstream

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def exact(self) -> dict[str, Any]:
        snapshot: dict[str, Any] = self.built.cache.stats()["strategies"]["exact"]
        return snapshot


@pytest.fixture
def fake() -> Iterator[tuple[FakeUpstream, str]]:
    upstream = FakeUpstream()
    with serve(upstream.app) as url:
        yield upstream, url


MakeGateway = Callable[..., Running]


@pytest.fixture
def make_gateway(tmp_path: Path, fake: tuple[FakeUpstream, str]) -> Iterator[MakeGateway]:
    upstream, upstream_url = fake
    built_gateways: list[Built] = []
    with ExitStack() as stack:

        def make(
            store_url: str | None = None,
            environ: dict[str, str] | None = None,
            clock: Clock | None = None,
            settings: dict[str, Any] | None = None,
            **config: Any,
        ) -> Running:
            """A gateway built as `infercache serve` builds it, in front of the stand-in;
            `settings` overrides cache settings, `config` the gateway's."""
            cache_settings = Settings(
                data_dir=tmp_path,
                store_url=store_url or f"sqlite:///{tmp_path / 'gateway.db'}",
                default_ttl_s=600,
                **(settings or {}),
            )
            config.setdefault("upstreams", (f"{upstream_url}/v1",))
            # A roomy store budget: this 2-core box under a full test run can take over 50 ms
            # for a SQLite write. The fault tests set the real default (0.05 s) themselves.
            config.setdefault("store_budget_s", 0.5)
            gateway_config = GatewayConfig(**config).with_env(environ or {})
            built = build(cache_settings, gateway_config, clock=clock)
            built_gateways.append(built)
            server = server_config(built.app)  # as `infercache serve` configures uvicorn
            server.pop("app")
            url = stack.enter_context(serve(built.app, **server))
            return Running(url, built, upstream)

        yield make
    for built in built_gateways:  # whatever the test did, every token hit rate is a share
        assert_token_hit_rates_at_most_one(built.cache.stats()["strategies"])


def body(content: str = "What is 2+2?", **fields: Any) -> dict[str, Any]:
    return chat(content, system="You are a calculator.", **fields)
