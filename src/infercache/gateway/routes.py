"""The gateway's route handlers, one function per route over one small app state (`AppState`:
the gateway, its auth, the body limit); app.py binds them to their paths. A handler only does
HTTP: authenticate, read the body, resolve the tenant, fold header controls in, call the
gateway (service.py), turn its reply into a response. Errors leave through the boundary every
server shares (http_errors.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from infercache.errors import InvalidRequestError, ModelNotFoundError, NotFoundError
from infercache.gateway.auth import Auth, resolve_tenant
from infercache.gateway.forwarding import presented_secrets
from infercache.gateway.health import health
from infercache.gateway.replies import JSONReply, StreamReply
from infercache.gateway.response_conversations import ResponseConversations
from infercache.gateway.service import Gateway
from infercache.gateway.stats import gateway_stats
from infercache.gateway.upstream_protocols import PassedRequest, PassThrough
from infercache.header_controls import apply_header_controls
from infercache.http_errors import json_object, read_json
from infercache.metrics import MissReason
from infercache.request import Endpoint

log = logging.getLogger(__name__)

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
    "/v1/messages": ["POST"],
    "/v1/models": ["GET"],
    "/v1/responses": ["POST"],
}
PASSTHROUGH = {"x-infercache": "passthrough"}  # on every answer passed through as it came


@dataclass(frozen=True, slots=True)
class AppState:
    gateway: Gateway
    auth: Auth
    max_body_bytes: int
    conversations: ResponseConversations | None = None  # Responses follow-ups (responses_route)


# -- the cached endpoints --


async def cached(state: AppState, endpoint: Endpoint, request: Request) -> Response:
    """`/v1/chat/completions`, `/v1/completions`: JSON, or a stream of server-sent events."""
    tenant, bearer, body, _ = await caller_body(state, request)
    reply = await state.gateway.chat(body, tenant=tenant, bearer=bearer, endpoint=endpoint)
    return http_reply(reply)


def http_reply(reply: JSONReply | StreamReply) -> Response:
    """A gateway reply as the HTTP response: JSON, or a stream of server-sent events."""
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


async def embeddings(state: AppState, request: Request) -> Response:
    tenant, bearer, body, _ = await caller_body(state, request)
    reply = await state.gateway.embeddings(body, tenant=tenant, bearer=bearer)
    return Response(
        orjson.dumps(reply.body),
        status_code=reply.status,
        headers=reply.headers,
        media_type="application/json",
    )


class Called(NamedTuple):
    tenant: str
    bearer: str | None
    body: dict[str, Any]  # header controls folded in
    headers: dict[str, str]


async def caller_body(state: AppState, request: Request) -> Called:
    """Who called, and what they sent, of an API call."""
    headers = header_map(request)
    caller = state.auth.caller(headers)
    body = json_object(await read_json(request, state.max_body_bytes))
    tenant = resolve_tenant(caller, headers, body)
    return Called(tenant, caller.bearer, apply_header_controls(body, headers), headers)


# -- models, and everything else passed through --


async def models(state: AppState, request: Request) -> Response:
    state.auth.caller(request.headers)
    return JSONResponse({"object": "list", "data": await _all_models(state.gateway)})


async def model(state: AppState, request: Request) -> Response:
    state.auth.caller(request.headers)
    wanted = request.path_params["model"]
    for m in await _all_models(state.gateway):
        if m.get("id") == wanted:
            return JSONResponse(m)
    raise ModelNotFoundError(f"the model {wanted!r} does not exist", param="model")


async def _all_models(gateway: Gateway) -> list[dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for upstream in gateway.upstreams:
        for m in await upstream.models():
            seen.setdefault(str(m.get("id")), m)
    return list(seen.values())


async def pass_through(state: AppState, request: Request) -> Response:
    """Any other /v1/* path and method goes to an upstream as is: never cached, counted."""
    if request.url.path in OWN_PATHS:  # ours, with another method
        allowed = OWN_PATHS[request.url.path]
        raise HTTPException(405, headers={"allow": ", ".join(allowed)})
    caller = state.auth.caller(request.headers)
    return await passed_through(state, request, caller.bearer, request.stream())


async def passed_through(
    state: AppState, request: Request, bearer: str | None, body: AsyncIterator[bytes]
) -> Response:
    """`request` sent to an upstream as it came (`body`: its bytes), counted under its API
    resource; the answer streamed back with `x-infercache: passthrough`."""
    targets = [u for u in state.gateway.upstreams if isinstance(u, PassThrough)]
    if not targets:
        raise NotFoundError(
            f"{request.method} {request.url.path} is not served by the built-in engine"
        )
    path = request.url.path.removeprefix("/v1")
    resource = path.strip("/").split("/")[0]
    passthrough = state.gateway.cache.metrics.strategy("passthrough")
    passthrough.miss(MissReason.UNCACHEABLE)
    passthrough.count(resource if resource in RESOURCES else "other")
    headers = header_map(request)
    secrets = [*presented_secrets(headers), *state.auth.secrets()]
    sent = PassedRequest(request.method, path, request.url.query, headers, body, bearer, secrets)
    forwarded = await targets[0].forward(sent)
    return StreamingResponse(
        forwarded.body,
        status_code=forwarded.status,
        headers={**dict(forwarded.headers), **PASSTHROUGH},
    )


# -- operating the gateway --


async def metrics(state: AppState, request: Request) -> Response:
    state.auth.require_metrics(request.headers.get("authorization"))
    cache = state.gateway.cache
    text = await cache.store_io.off_loop(cache.metrics.to_prometheus)  # it reads the store
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def stats(state: AppState, request: Request) -> Response:
    state.auth.require_stats(request.headers.get("authorization"))
    return JSONResponse(await state.gateway.store_io.off_loop(gateway_stats, state.gateway))


async def healthz(state: AppState, request: Request) -> Response:
    return JSONResponse(await health(state.gateway))  # health.py


async def admin_invalidate(state: AppState, request: Request) -> Response:
    state.auth.require_admin(request.headers.get("authorization"))
    body = await read_json(request, state.max_body_bytes)
    tags = body.get("tags") if isinstance(body, dict) else None
    if not isinstance(tags, list) or not tags or not all(isinstance(t, str) for t in tags):
        raise InvalidRequestError("'tags' must be a non-empty list of strings", param="tags")
    n = await state.gateway.store_io.off_loop(state.gateway.cache.invalidate, tags)
    log.warning("admin invalidated tags %s", tags)
    return JSONResponse({"invalidated_tags": n})


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
