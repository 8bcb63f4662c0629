"""The admin API's model-version and rollout routes (admin token), over routes.py's `AppState`.

    POST /admin/model-version      {"model": M, "version": V}: the whole model is V now (every
                                   older entry retired; every replica taken to serve V)
                                   {"model": M, "version": V, "upstream": URL}: that upstream
                                   serves M at V (one of several live versions; what it
                                   served before is retired once no replica serves it)
    GET  /admin/rollout            the rollout in force, each replica's versions, the shadow
                                   traffic's counts
    POST /admin/rollout            declare one: {"canary": [URL...], "share": 0.1,
                                   "shadow": 0.0, "sticky": "tenant" | "conversation",
                                   "version": V?} (rollout.py)
    POST /admin/rollout/promote    the canary's version wins (rollout_control.py)
    POST /admin/rollout/rollback   the canary's version loses

Each change is shared with every gateway on the store and logged once, at INFO.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from infercache.errors import InvalidRequestError
from infercache.gateway.replica_versions import ADMIN
from infercache.gateway.rollout import Rollout
from infercache.gateway.routes import AppState
from infercache.http_errors import json_object, read_json


async def _admin_body(state: AppState, request: Request) -> dict[str, Any]:
    state.auth.require_admin(request.headers.get("authorization"))
    return json_object(await read_json(request, state.max_body_bytes))


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"'{name}' must be a non-empty string", param=name)
    return value


async def model_version(state: AppState, request: Request) -> Response:
    body = await _admin_body(state, request)
    model, version = _text(body, "model"), _text(body, "version")
    gateway = state.gateway
    tracker = gateway.tracker
    if body.get("upstream") is None:
        changed = await gateway.store_io.off_loop(tracker.observe, model, version, "admin")
        return JSONResponse({"model": model, "version": version, "changed": changed})
    upstream = _text(body, "upstream")
    names = [u.name for u in gateway.upstreams]
    if upstream not in names:
        raise InvalidRequestError(f"no upstream {upstream!r}: one of {names}", param="upstream")
    changed = await gateway.store_io.off_loop(
        tracker.listed, names.index(upstream), model, version, ADMIN, "set by the admin API"
    )
    return JSONResponse(
        {"model": model, "version": version, "upstream": upstream, "changed": changed}
    )


async def rollout(state: AppState, request: Request) -> Response:
    gateway = state.gateway
    if request.method == "GET":
        state.auth.require_admin(request.headers.get("authorization"))
        return JSONResponse(await gateway.store_io.off_loop(_shown, state))
    declared = Rollout.of(await _admin_body(state, request))
    await gateway.store_io.off_loop(gateway.rollout.declare, declared)
    return JSONResponse(await gateway.store_io.off_loop(_shown, state))


async def promote(state: AppState, request: Request) -> Response:
    state.auth.require_admin(request.headers.get("authorization"))
    retired = await state.gateway.store_io.off_loop(state.gateway.rollout.promote)
    return JSONResponse({"promoted": True, "retired": retired})


async def rollback(state: AppState, request: Request) -> Response:
    state.auth.require_admin(request.headers.get("authorization"))
    retired = await state.gateway.store_io.off_loop(state.gateway.rollout.rollback)
    return JSONResponse({"rolled_back": True, "retired": retired})


def _shown(state: AppState) -> dict[str, Any]:
    gateway = state.gateway
    snapshot = gateway.tracker.snapshot()
    return {
        "rollout": gateway.rollout.snapshot(),
        "replicas": snapshot["replicas"],
        "live": snapshot["live"],
        "shadow": gateway.versions.shadow.snapshot(),
    }
