"""The upstream HTTP client's one error boundary: aiohttp's failures (unreachable, broken
mid-answer, an invalid body) and an upstream's error status become infercache's errors
(`UpstreamUnavailableError`, `UpstreamError` with the upstream's own body, in whichever API's
shape it came: OpenAI's `{"error": {...}}` or Anthropic's `{"type": "error", "error": {...}}`).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Mapping
from contextlib import AbstractContextManager

import aiohttp
import orjson

from infercache.errors import UpstreamError, UpstreamUnavailableError

log = logging.getLogger("infercache.gateway.upstream")


def map_aiohttp_errors(name: str, *, answering: bool = False) -> AbstractContextManager[None]:
    """Translate aiohttp's exceptions into ours. `answering`: the upstream had begun to answer
    (a stream), so a failure is a broken answer rather than an unreachable upstream."""
    return _AiohttpErrors(name, answering)


class _AiohttpErrors:
    """`map_aiohttp_errors`' context (a class: it runs twice on every upstream call)."""

    __slots__ = ("_answering", "_name")

    def __init__(self, name: str, answering: bool) -> None:
        self._name = name
        self._answering = answering

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if isinstance(exc, (aiohttp.ClientError, TimeoutError)):
            log.warning("upstream %s failed: %r", self._name, exc)
            if self._answering:
                raise UpstreamError("the upstream connection broke mid-answer") from exc
            raise UpstreamUnavailableError("the upstream is unreachable") from exc
        if isinstance(exc, (orjson.JSONDecodeError, UnicodeDecodeError)):
            log.warning("upstream %s sent an invalid answer: %s", self._name, exc)
            raise UpstreamError("the upstream sent an invalid answer") from exc


_CLOSED_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE})


def closed_before_answering(exc: UpstreamError) -> bool:
    """The upstream closed the connection before any byte of an answer: what a server's
    closing of an idle kept-alive connection looks like to the request that picked it from the
    pool at that moment (it never reached the server's application, or was dropped unanswered).
    Asked once more on a new connection, as HTTP clients do (the OpenAI SDK retries it too)."""
    if not isinstance(exc, UpstreamUnavailableError):
        return False
    cause = exc.__cause__
    if isinstance(cause, (aiohttp.ServerDisconnectedError, aiohttp.ClientConnectionResetError)):
        return True
    return isinstance(cause, aiohttp.ClientOSError) and cause.errno in _CLOSED_ERRNOS


def raise_for_status(status: int, content: bytes, retry_after: str | None = None) -> None:
    if status < 400:
        return
    try:
        parsed = orjson.loads(content)
        body = parsed if isinstance(parsed, dict) else None
    except orjson.JSONDecodeError:
        body = None
    message = f"upstream answered {status}"
    if body and isinstance(body.get("error"), Mapping):
        message = str(body["error"].get("message", message))
    raise UpstreamError(message, status_code=status, body=body, retry_after=retry_after)
