"""`POST /v1/feedback`: a client reports that an answer it was served was wrong.

    POST /v1/feedback  {"id": "<the response's id>", "wrong": true}
    → 200 {"object": "feedback", "id": ..., "wrong": true, "retired": true}

Authenticated like chat: the caller's key (`Auth.caller`) and `resolve_tenant` decide the
tenant, an `x-infercache-tenant` header or `infercache.tenant` narrowing it as for the request
that was answered. `Cache.report_wrong(id, tenant=...)` then retires the entry that served the
answer, at once, and charges the complaint to the layer that answered (served_answers.py). A
tenant reaches only answers served to it: another tenant's id, an id never served, or one
served longer ago than `feedback_ttl_s` (or pushed out by `feedback_max_answers` newer ones) is
a 404 in the OpenAI error shape, and nothing changes. A repeated report is a 200 again and
counts once. `"wrong": false` is accepted and changes nothing (only complaints are acted on).
A body that is not an object with a non-empty string `id` and a boolean `wrong` is a 400.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from infercache.errors import InvalidRequestError, NotFoundError
from infercache.gateway.auth import resolve_tenant
from infercache.gateway.routes import AppState
from infercache.http_errors import json_object, read_json

log = logging.getLogger(__name__)

_MAX_ID_CHARS = 256


async def feedback(state: AppState, request: Request) -> Response:
    caller = state.auth.caller(request.headers)
    body = json_object(await read_json(request, state.max_body_bytes))
    tenant = resolve_tenant(caller, request.headers, body)
    response_id, wrong = body.get("id"), body.get("wrong")
    if not isinstance(response_id, str) or not 0 < len(response_id) <= _MAX_ID_CHARS:
        raise InvalidRequestError(
            f"'id' must be the response's id, a string of 1 to {_MAX_ID_CHARS} characters",
            param="id",
        )
    if not isinstance(wrong, bool):
        raise InvalidRequestError("'wrong' must be true or false", param="wrong")
    cache = state.gateway.cache
    retired = wrong and await cache.store_io.off_loop(
        cache.report_wrong, response_id, tenant=tenant
    )
    if wrong and not retired:
        raise NotFoundError(
            f"no answer with id {response_id!r} was served to you recently", param="id"
        )
    if retired:
        log.info("answer %s reported wrong by tenant %s: retired", response_id, tenant)
    reply = {"object": "feedback", "id": response_id, "wrong": wrong, "retired": retired}
    return JSONResponse(reply)
