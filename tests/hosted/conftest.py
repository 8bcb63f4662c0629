"""Hosted-provider fixtures: the two stand-ins (providers.py) on loopback, and real gateways in
front of them, built as `infercache serve` builds them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infercache.clock import ManualClock
from infercache.gateway.build import Built, build
from infercache.gateway.config import GatewayConfig, UpstreamSpec
from infercache.gateway.http_server import server_config
from infercache.metrics import Price, PriceTable
from infercache.settings import Settings
from tests.gateway.conftest import fake, make_gateway  # noqa: F401  (fixtures, reused)
from tests.harness.servers import serve
from tests.hosted.providers import AnthropicStandIn, OpenAIStandIn

PROVIDER_KEY = "sk-provider-standin"
# Anthropic's list prices for Sonnet 4.5 (5-minute cache: writes 1.25x input, reads 0.1x);
# OpenAI's for gpt-4.1-mini (cached input a quarter of input, no write price)
PRICES = PriceTable(
    {
        "claude-sonnet-4-5": Price(3.0, 15.0, 0.3, 3.75),
        "gpt-4.1-mini": Price(0.4, 1.6, 0.1),
    }
)


@dataclass
class Hosted:
    url: str  # the gateway's root
    built: Built
    upstream: str  # the stand-in's base URL as the gateway names it

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = self.built.cache.stats()
        return stats


MakeHosted = Callable[..., Hosted]


@pytest.fixture
def closing() -> Iterator[ExitStack]:
    """What a test enters here (an SDK client, say) is closed after it."""
    with ExitStack() as stack:
        yield stack


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def anthropic_standin(clock: ManualClock) -> Iterator[tuple[AnthropicStandIn, str]]:
    standin = AnthropicStandIn(clock)
    with serve(standin.app) as url:
        yield standin, f"{url}/v1"


@pytest.fixture
def openai_standin(clock: ManualClock) -> Iterator[tuple[OpenAIStandIn, str]]:
    standin = OpenAIStandIn(clock)
    with serve(standin.app) as url:
        yield standin, f"{url}/v1"


@pytest.fixture
def make_hosted(tmp_path: Path, clock: ManualClock) -> Iterator[MakeHosted]:
    with ExitStack() as stack:
        count = 0

        def make(upstream: str, kind: str, store_url: str | None = None, **config: Any) -> Hosted:
            """A gateway in front of one stand-in (`kind`: anthropic or openai), its own store
            (SQLite unless `store_url`)."""
            nonlocal count
            count += 1
            settings = Settings(
                data_dir=tmp_path,
                store_url=store_url or f"sqlite:///{tmp_path / f'gateway{count}.db'}",
                default_ttl_s=600,
                prices=PRICES,
            )
            spec = UpstreamSpec(upstream, kind=kind, key_env="PROVIDER_KEY")
            config.setdefault("store_budget_s", 0.5)
            gateway_config = GatewayConfig(upstreams=(spec,), **config).with_env(
                {"PROVIDER_KEY": PROVIDER_KEY}
            )
            built = build(settings, gateway_config, clock=clock)
            server = server_config(built.app)
            server.pop("app")
            url = stack.enter_context(serve(built.app, **server))
            return Hosted(url, built, built.gateway.upstreams[0].name)

        yield make
