"""`POST /v1/messages`: Anthropic's Messages API on the gateway, cached on the one request path
(service.py) through its adapter (messages_endpoint.py). The handler only does HTTP, as the
other routes do (routes.py): authenticate (a gateway key as `x-api-key`, the Anthropic SDKs'
header, as well as a bearer), read the body, resolve the tenant, fold header controls in, pass
the client's `anthropic-beta` along (it is keyed and sent upstream), and turn the reply into a
response.

Every error on this route is in Anthropic's shape, `{"type": "error", "error": {"type",
"message"}}`, with the status it has anywhere else (errors.py `to_anthropic`): a bad body is a
400 `invalid_request_error`, a missing key a 401 `authentication_error`, an Anthropic
upstream's own error passed as it came; anything unforeseen a logged 500 `api_error`, never a
traceback.
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from infercache.errors import InfercacheError
from infercache.gateway.routes import AppState, caller_body, http_reply
from infercache.http_errors import INTERNAL_ERROR
from infercache.request import Endpoint

log = logging.getLogger(__name__)


async def messages(state: AppState, request: Request) -> Response:
    try:
        called = await caller_body(state, request)
        reply = await state.gateway.chat(
            called.body,
            tenant=called.tenant,
            bearer=called.bearer,
            endpoint=Endpoint.MESSAGES,
            beta=called.headers.get("anthropic-beta"),
        )
    except InfercacheError as exc:
        return anthropic_error(exc)
    except Exception:  # logged; the client gets Anthropic's 500, never a traceback
        log.exception("unexpected error on POST /v1/messages")
        return anthropic_error(InfercacheError(INTERNAL_ERROR))
    return http_reply(reply)


def anthropic_error(exc: InfercacheError) -> Response:
    """The error's response in Anthropic's shape (logged as every server logs errors)."""
    if exc.status_code >= 500:
        log.warning("request failed: %s: %s", type(exc).__name__, exc)
    return JSONResponse(exc.to_anthropic(), status_code=exc.status_code, headers=exc.headers())
