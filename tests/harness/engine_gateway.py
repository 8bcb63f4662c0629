"""`serve_engine_gateway`: the gateway `infercache serve` builds without `--upstream` (the
built-in engine in process), on loopback. Its own module: it imports the engine (torch), which
tests that only need `servers.serve` do not load."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from infercache.engine.config import EngineConfig
from infercache.engine.engine import Engine
from infercache.gateway.build import build
from infercache.gateway.config import GatewayConfig
from infercache.gateway.engine_upstream import EngineUpstream
from infercache.gateway.http_server import server_config
from infercache.settings import Settings
from tests.harness.servers import serve


@contextlib.contextmanager
def serve_engine_gateway(settings: Settings, engine: EngineConfig) -> Iterator[tuple[str, Engine]]:
    """A gateway built as `infercache serve` builds it with no upstream (the built-in engine
    `engine` configures), served on loopback as the CLI serves it; its URL and the engine,
    closed afterwards."""
    built = build(settings, GatewayConfig(store_budget_s=0.5), engine_config=engine)
    upstream = built.gateway.upstreams[0]
    assert isinstance(upstream, EngineUpstream)
    server = server_config(built.app)
    server.pop("app")
    try:
        with serve(built.app, **server) as url:
            yield url, upstream.engine
    finally:
        upstream.engine.close()
