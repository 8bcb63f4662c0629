"""`POST /v1/responses`: OpenAI's Responses API on the gateway, cached on the one request path
(service.py) through its adapter (responses_endpoint.py).

    a request carrying its whole input        cached on it, as chat is
    `previous_response_id` of an answer this   resolved into the conversation it continues
      gateway served this tenant               (response_conversations.py, request.resolved):
                                               keyed and sent on its content, so a follow-up
                                               asked twice is one upstream call
    `previous_response_id` of any other        passed through to the upstream as it came,
      (another gateway's, expired, unknown)    uncached, `x-infercache: passthrough`; with no
                                               upstream to pass it to (the built-in engine), a
                                               404 naming the parameter

A store that cannot be read for the conversation is counted as not found (the request is passed
through): a failing store never fails a request. Errors are in the OpenAI shape, as on chat.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from infercache.errors import NotFoundError, StoreError
from infercache.gateway.routes import AppState, caller_body, http_reply, passed_through
from infercache.gateway.upstream_protocols import PassThrough
from infercache.request import DIRECTIVES_FIELD, Endpoint
from infercache.responses.request import resolved, validate

log = logging.getLogger(__name__)


async def responses(state: AppState, request: Request) -> Response:
    called = await caller_body(state, request)
    body = called.body
    previous = body.get("previous_response_id")
    if previous is not None:
        validate(body)  # a malformed id is a 400, before any lookup
        earlier = await _earlier(state, called.tenant, previous)
        if earlier is None:
            return await _pass(state, request, called.bearer, body, previous)
        body = resolved(body, earlier)
    reply = await state.gateway.chat(
        body, tenant=called.tenant, bearer=called.bearer, endpoint=Endpoint.RESPONSES
    )
    return http_reply(reply)


async def _earlier(state: AppState, tenant: str, previous: str) -> list[dict[str, Any]] | None:
    conversations = state.conversations
    if conversations is None:
        return None
    try:
        return await state.gateway.store_io.read(conversations.earlier, tenant, previous)
    except StoreError as exc:
        log.warning("a Responses conversation could not be read: %s", exc)
        return None


async def _pass(
    state: AppState, request: Request, bearer: str | None, body: dict[str, Any], previous: str
) -> Response:
    if not any(isinstance(u, PassThrough) for u in state.gateway.upstreams):
        raise NotFoundError(
            f"previous_response_id {previous!r} is not a response this gateway served you (or "
            "it expired), and the built-in engine keeps no responses",
            param="previous_response_id",
        )
    sent = orjson.dumps({k: v for k, v in body.items() if k != DIRECTIVES_FIELD})

    async def content() -> AsyncIterator[bytes]:
        yield sent

    return await passed_through(state, request, bearer, content())
