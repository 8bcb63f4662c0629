"""HTTP for the gateway (Starlette): routes, body limits, auth, and errors in the OpenAI shape.

    POST /v1/chat/completions        the cached path (service.py); streaming and not
    POST /v1/completions             the legacy API, cached on the same path and policy
    POST /v1/embeddings              cached per input (embedding_cache.py)
    POST /v1/feedback                {"id": ID, "wrong": true}: retire a wrong answer (feedback.py)
    GET  /v1/models, /v1/models/ID   what the upstreams serve
    *    /v1/...                     any other path and method: passed through to an upstream
                                     as is (its credentials, never a gateway key), streamed
                                     both ways, never cached, counted
    GET  /metrics                    Prometheus text: per strategy (prometheus.py), per request
                                     with model and tenant (traffic.py), the store's size
    GET  /stats                      JSON: per strategy, the store, the upstreams
    GET  /healthz, /health           liveness; `degraded` while the store does not answer
    POST /admin/invalidate           {"tags": [...]}                  (admin token)
    POST /admin/model-version        {"model": M, "version": V}       (admin token)

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

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from infercache.errors import (
    InfercacheError,
    InvalidRequestError,
    ModelNotFoundError,
    NotFoundError,
    UpstreamUnavailableError,
)
from infercache.gateway.auth import Auth, resolve_tenant
from infercache.gateway.controls import apply_header_controls
from infercache.gateway.feedback import feedback_endpoint
from infercache.gateway.forwarding import presented_secrets
from infercache.gateway.health import health
from infercache.gateway.service import Gateway, JSONReply
from infercache.gateway.stats import gateway_stats
from infercache.gateway.store_size import StoreSize
from infercache.gateway.upstream import PassThrough
from infercache.http_errors import exception_handlers, json_object, middleware, read_json
from infercache.metrics import MissReason
from infercache.request import Endpoint

log = logging.getLogger(__name__)

PASS_THROUGH_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
# The OpenAI API's resources: a passed-through call is counted under its resource, any other
# path under `other` (the label's values stay bounded whatever callers send).
RESOURCES = frozenset(
    ("assistants", "audio", "batches", "chat", "completions", "containers", "conversations",
     "embeddings", "evals", "files", "fine_tuning", "images", "models", "moderations",
     "organization", "realtime", "responses", "threads", "uploads", "vector_stores")
)  # fmt: skip
OWN_PATHS = {
    "/v1/chat/completions": ["POST"],
    "/v1/completions": ["POST"],
    "/v1/embeddings": ["POST"],
    "/v1/feedback": ["POST"],
    "/v1/models": ["GET"],
}


def create_app(
    gateway: Gateway,
    auth: Auth,
    *,
    max_body_bytes: int = 4 << 20,
    version_poll_s: float | None = 30.0,
) -> Starlette:
    gateway.cache.metrics.export(StoreSize(gateway.cache.backend, gateway.cache.clock))

    async def cached(request: Request, endpoint: Endpoint) -> Response:
        headers = header_map(request)
        caller = auth.caller(headers)
        body = json_object(await read_json(request, max_body_bytes))
        tenant = resolve_tenant(caller, headers, body)
        body = apply_header_controls(body, headers)
        reply = await gateway.chat(body, tenant=tenant, bearer=caller.bearer, endpoint=endpoint)
        if isinstance(reply, JSONReply):
            return Response(
                reply.raw if reply.raw is not None else orjson.dumps(reply.body),
                status_code=reply.status,
                headers=reply.headers,
                media_type="application/json",
            )
        return StreamingResponse(
            reply.events,
            media_type="text/event-stream",
            headers={**reply.headers, "cache-control": "no-cache"},
        )

    async def embeddings(request: Request) -> Response:
        headers = header_map(request)
        caller = auth.caller(headers)
        body = json_object(await read_json(request, max_body_bytes))
        tenant = resolve_tenant(caller, headers, body)
        body = apply_header_controls(body, headers)
        reply = await gateway.embeddings(body, tenant=tenant, bearer=caller.bearer)
        return Response(
            orjson.dumps(reply.body),
            status_code=reply.status,
            headers=reply.headers,
            media_type="application/json",
        )

    async def all_models() -> list[dict[str, Any]]:
        seen: dict[str, dict[str, Any]] = {}
        for upstream in gateway.upstreams:
            for m in await upstream.models():
                seen.setdefault(str(m.get("id")), m)
        return list(seen.values())

    async def models(request: Request) -> Response:
        auth.caller(request.headers)
        return JSONResponse({"object": "list", "data": await all_models()})

    async def model(request: Request) -> Response:
        auth.caller(request.headers)
        wanted = request.path_params["model"]
        for m in await all_models():
            if m.get("id") == wanted:
                return JSONResponse(m)
        raise ModelNotFoundError(f"the model {wanted!r} does not exist", param="model")

    async def pass_through(request: Request) -> Response:
        """Any other /v1/* path and method goes to an upstream as is: never cached, counted."""
        if request.url.path in OWN_PATHS:  # ours, with another method
            allowed = OWN_PATHS[request.url.path]
            raise HTTPException(405, headers={"allow": ", ".join(allowed)})
        caller = auth.caller(request.headers)
        targets = [u for u in gateway.upstreams if isinstance(u, PassThrough)]
        if not targets:
            raise NotFoundError(
                f"{request.method} {request.url.path} is not served by the built-in engine"
            )
        path = request.url.path.removeprefix("/v1")
        resource = path.strip("/").split("/")[0]
        passthrough = gateway.cache.metrics.strategy("passthrough")
        passthrough.miss(MissReason.UNCACHEABLE)
        passthrough.count(resource if resource in RESOURCES else "other")
        headers = header_map(request)
        forwarded = await targets[0].forward(
            request.method,
            path,
            query=request.url.query,
            headers=headers,
            body=request.stream(),
            bearer=caller.bearer,
            secrets=[*presented_secrets(headers), *auth.secrets()],
        )
        return StreamingResponse(
            forwarded.body, status_code=forwarded.status, headers=dict(forwarded.headers)
        )

    async def metrics(request: Request) -> Response:
        auth.require_metrics(request.headers.get("authorization"))
        text = await gateway.offload(gateway.cache.metrics.to_prometheus)  # reads the store
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def stats(request: Request) -> Response:
        auth.require_stats(request.headers.get("authorization"))
        return JSONResponse(await gateway.offload(gateway_stats, gateway))

    async def healthz(request: Request) -> Response:
        return JSONResponse(await health(gateway))  # health.py

    async def admin_invalidate(request: Request) -> Response:
        auth.require_admin(request.headers.get("authorization"))
        body = await read_json(request, max_body_bytes)
        tags = body.get("tags") if isinstance(body, dict) else None
        if not isinstance(tags, list) or not tags or not all(isinstance(t, str) for t in tags):
            raise InvalidRequestError("'tags' must be a non-empty list of strings", param="tags")
        n = await gateway.offload(gateway.cache.invalidate, tags)
        log.warning("admin invalidated tags %s", tags)
        return JSONResponse({"invalidated_tags": n})

    async def admin_model_version(request: Request) -> Response:
        auth.require_admin(request.headers.get("authorization"))
        body = await read_json(request, max_body_bytes)
        if not isinstance(body, dict):
            raise InvalidRequestError("the request body must be a JSON object")
        model, version = body.get("model"), body.get("version")
        if not isinstance(model, str) or not model:
            raise InvalidRequestError("'model' must be a non-empty string", param="model")
        if not isinstance(version, str) or not version:
            raise InvalidRequestError("'version' must be a non-empty string", param="version")
        changed = await gateway.offload(gateway.tracker.observe, model, version, "admin")
        return JSONResponse({"model": model, "version": version, "changed": changed})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.loop = asyncio.get_running_loop()  # for callers in other threads
        gateway.attach_loop(app.state.loop)
        poller = None
        if version_poll_s is not None:
            await poll_versions(gateway)
            poller = asyncio.create_task(poll_forever(gateway, version_poll_s))
        try:
            yield
        finally:
            if poller is not None:
                poller.cancel()
            await gateway.aclose()

    routes = [
        Route(
            "/v1/chat/completions",
            functools.partial(cached, endpoint=Endpoint.CHAT),
            methods=["POST"],
        ),
        Route(
            "/v1/completions",
            functools.partial(cached, endpoint=Endpoint.COMPLETIONS),
            methods=["POST"],
        ),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route(
            "/v1/feedback",
            feedback_endpoint(gateway, auth, max_body_bytes),
            methods=["POST"],
        ),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", model, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/health", healthz, methods=["GET"]),
        Route("/admin/invalidate", admin_invalidate, methods=["POST"]),
        Route("/admin/model-version", admin_model_version, methods=["POST"]),
        Route("/v1/{rest:path}", pass_through, methods=PASS_THROUGH_METHODS),
    ]
    app = Starlette(exception_handlers=exception_handlers(), middleware=middleware())
    app.router = StaticFirstRouter(routes, lifespan=lifespan)
    return app


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


def header_map(request: Request) -> dict[str, str]:
    """The request's headers as a dict, a repeated name's first value (as Starlette's
    `Headers.get` reads it; ASGI servers send the names lower-cased): one pass over them,
    where each `request.headers` lookup scans them all."""
    found: dict[str, str] = {}
    for name, value in request.scope["headers"]:
        key = name.decode("latin-1")
        if key not in found:
            found[key] = value.decode("latin-1")
    return found


async def poll_versions(gateway: Gateway) -> None:
    """Ask every upstream what it serves; a new version retires the old entries."""
    for upstream in gateway.upstreams:
        try:
            models = await upstream.models()
            await gateway.offload(gateway.tracker.observe_models, models)
        except UpstreamUnavailableError as exc:
            log.warning("could not poll %s for model versions: %s", upstream.name, exc)
        except InfercacheError as exc:
            log.info("%s does not list models: %s", upstream.name, exc)


async def poll_forever(gateway: Gateway, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        await poll_versions(gateway)
