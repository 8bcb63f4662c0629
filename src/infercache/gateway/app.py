"""HTTP for the gateway (Starlette): routes, body limits, auth, and errors in the OpenAI shape.

    POST /v1/chat/completions        the cached path (service.py); streaming and not
    POST /v1/completions             the legacy API, cached on the same path and policy
    POST /v1/embeddings              cached per input (embeddings/)
    POST /v1/messages                Anthropic's Messages API, cached on the same path; errors
                                     in Anthropic's shape (messages_route.py)
    POST /v1/responses               OpenAI's Responses API, cached on the same path; a
                                     follow-up this gateway can resolve is keyed on its
                                     content, any other passed through (responses_route.py)
    POST /v1/feedback                {"id": ID, "wrong": true}: retire a wrong answer (feedback.py)
    GET  /v1/models, /v1/models/ID   what the upstreams serve
    *    /v1/...                     any other path and method: passed through to an upstream
                                     as is (its credentials, never a gateway key), streamed
                                     both ways, never cached, counted, `x-infercache:
                                     passthrough`
    GET  /metrics                    Prometheus text: per strategy (prometheus.py), per request
                                     with model and tenant (traffic.py), the store's size
    GET  /stats                      JSON: per strategy, the store, the upstreams
    GET  /healthz, /health           liveness; `degraded` while the store does not answer
    POST /admin/invalidate           {"tags": [...]}                  (admin token)
    POST /admin/model-version        {"model": M, "version": V[, "upstream": URL]}  (admin)
    GET, POST /admin/rollout         a canary and shadow traffic; /promote, /rollback
                                     (admin_versions.py)

Each route's handler is a function over one small app state (routes.py `AppState`; the
feedback route's in feedback.py, the versions' in admin_versions.py); `create_app` binds them
to their paths and runs the lifespan: the upstreams' model versions read before serving and in
the background (version_probe.py), the gateway closed after the server drained.

Every error leaves through the boundary all infercache servers share (http_errors.py): an
OpenAI-shaped body with the right status, a hard body limit (413) before parsing, and a logged
500 with no traceback for anything unexpected.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from infercache.gateway import admin_versions, messages_route, responses_route, routes
from infercache.gateway.auth import Auth
from infercache.gateway.feedback import feedback
from infercache.gateway.prefix_usage import PromptCacheCollector
from infercache.gateway.response_conversations import ResponseConversations
from infercache.gateway.routes import AppState
from infercache.gateway.service import Gateway
from infercache.gateway.store_size import StoreSize
from infercache.gateway.version_probe import ProbedParts, VersionProber
from infercache.http_errors import exception_handlers, middleware
from infercache.request import Endpoint

log = logging.getLogger(__name__)

PASS_THROUGH_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


def create_app(
    gateway: Gateway,
    auth: Auth,
    *,
    max_body_bytes: int = 4 << 20,
    version_poll_s: float | None = 5.0,
    version_probe_s: float | None = 5.0,
    conversations: ResponseConversations | None = None,
) -> Starlette:
    gateway.cache.metrics.export(StoreSize(gateway.cache.backend, gateway.cache.clock))
    gateway.cache.metrics.export(PromptCacheCollector(gateway.prefix_usage))
    gateway.cache.metrics.export(gateway.tracker.traffic)  # each live version's (issue 29)
    state = AppState(gateway, auth, max_body_bytes, conversations)

    def bound(handler: Any, *args: Any) -> Any:
        return functools.partial(handler, state, *args)

    table = [
        Route("/v1/chat/completions", bound(routes.cached, Endpoint.CHAT), methods=["POST"]),
        Route("/v1/completions", bound(routes.cached, Endpoint.COMPLETIONS), methods=["POST"]),
        Route("/v1/messages", bound(messages_route.messages), methods=["POST"]),
        Route("/v1/responses", bound(responses_route.responses), methods=["POST"]),
        Route("/v1/embeddings", bound(routes.embeddings), methods=["POST"]),
        Route("/v1/feedback", bound(feedback), methods=["POST"]),
        Route("/v1/models", bound(routes.models), methods=["GET"]),
        Route("/v1/models/{model:path}", bound(routes.model), methods=["GET"]),
        Route("/metrics", bound(routes.metrics), methods=["GET"]),
        Route("/stats", bound(routes.stats), methods=["GET"]),
        Route("/healthz", bound(routes.healthz), methods=["GET"]),
        Route("/health", bound(routes.healthz), methods=["GET"]),
        Route("/admin/invalidate", bound(routes.admin_invalidate), methods=["POST"]),
        Route("/admin/model-version", bound(admin_versions.model_version), methods=["POST"]),
        Route("/admin/rollout", bound(admin_versions.rollout), methods=["GET", "POST"]),
        Route("/admin/rollout/promote", bound(admin_versions.promote), methods=["POST"]),
        Route("/admin/rollout/rollback", bound(admin_versions.rollback), methods=["POST"]),
        Route("/v1/{rest:path}", bound(routes.pass_through), methods=PASS_THROUGH_METHODS),
    ]
    app = Starlette(exception_handlers=exception_handlers(), middleware=middleware())
    parts = ProbedParts(
        gateway.upstreams,
        gateway.tracker,
        gateway.rollout.sync,
        gateway.store_io,
        gateway.cache.backend,
    )
    gateway.prober = VersionProber(parts, version_poll_s, version_probe_s)
    lifespan = functools.partial(_lifespan, gateway)
    app.router = StaticFirstRouter(table, lifespan=lifespan)
    return app


@contextlib.asynccontextmanager
async def _lifespan(gateway: Gateway, app: Starlette) -> AsyncIterator[None]:
    app.state.loop = asyncio.get_running_loop()  # for callers in other threads
    gateway.attach_loop(app.state.loop)
    poller = None
    prober = gateway.prober
    if prober is not None and prober.every_s is not None:
        await prober.round(first=True)  # the versions known before the first request
        poller = asyncio.create_task(prober.run())
    try:
        yield
    finally:
        if poller is not None:
            poller.cancel()
        await gateway.aclose()


class StaticFirstRouter(Router):
    """Starlette's router, with one dict lookup of a request's static path and method before
    its scan of every route's pattern (bench/README.md, "Gateway"). Only the static routes
    before the first route with a parameter are in the dict, so the first route that
    matches still wins, as in the scan; anything else (a wrong method, a trailing slash, a
    path with parameters, a `root_path`) goes through Starlette's scan as before."""

    def __init__(self, routes: list[Route], **kwargs: Any) -> None:
        super().__init__(routes, **kwargs)
        self._static: dict[tuple[str, str], Route] = {}
        for route in routes:
            if route.param_convertors:
                break
            for method in route.methods or ():
                self._static.setdefault((route.path, method), route)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            route = self._static.get((scope["path"], scope["method"]))
            if route is not None:
                scope.setdefault("router", self)
                scope["route"] = route
                scope["endpoint"] = route.endpoint
                scope["path_params"] = dict(scope.get("path_params", {}))
                await route.app(scope, receive, send)
                return
        await super().app(scope, receive, send)
