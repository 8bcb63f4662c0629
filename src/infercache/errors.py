"""The exception tree: every exception infercache raises on purpose is defined here. Foreign
exceptions (sqlite3, redis, aiohttp, torch) are translated into these at exactly one boundary each
(the store, the upstream client's `map_aiohttp_errors`, the engine's worker). Internal invariant
and shape checks raise `ValueError`/`TypeError`, never a client-facing class.

    InfercacheError                    root; never escapes a server as a traceback
    ├── ConfigError                    bad settings, store URL or CLI option (also ValueError)
    ├── MissingExtraError              an optional part is not installed; names the extra to
    │                                  install, `infercache[engine]` say (also ImportError)
    ├── InvalidRequestError            a request we refuse to process: HTTP 400
    │   ├── ContextTooLongError        prompt + max_tokens over the model's window: HTTP 400
    │   └── PayloadTooLargeError       body over the configured limit: HTTP 413
    ├── AuthenticationError            missing or unknown API key: HTTP 401
    ├── PermissionDeniedError          a tenant key on an admin endpoint: HTTP 403
    ├── NotFoundError                  unknown route or resource: HTTP 404
    │   └── ModelNotFoundError         unknown model id: HTTP 404
    ├── OverloadedError                a server's queue is full: HTTP 429 with Retry-After
    ├── NotCachedError                 `only-if-cached` and nothing cached: HTTP 504
    ├── ClientDisconnectedError        the client left before its request was read (499)
    ├── StoreError                     any cache-store failure; becomes a counted miss, never
    │   │                              a failed request
    │   ├── StoreUnavailableError      over its latency budget, or skipped while it fails
    │   │   └── NodeUnavailableError   one node of a Redis Cluster failed or is skipped; the
    │   │                              other nodes serve (stores/cluster_breaker.py)
    │   └── KVTierError                a KV tier below RAM (disk, Redis) failed: a counted
    │       │                          recompute (engine/kv_tiers.py), never a failed request
    │       └── BlockRejectedError          a stored KV block failed verification (kv_blocks.py)
    ├── StoreWouldBlockError           a non-blocking store read would wait: retried off the
    │                                  event loop (internal, never reaches a client)
    ├── EmbedderError                  the semantic layer's embedder failed; a counted miss
    └── UpstreamError                  the upstream answered with an error (its status kept)
        ├── UpstreamUnavailableError   could not reach the upstream at all: HTTP 502
        └── UpstreamAbortedError       a shared upstream call ended without a complete answer

Every error renders in the OpenAI error shape, built by `openai_error_body` and nowhere else:
`{"error": {"message", "type", "param", "code"}}`; on the gateway's `/v1/messages` route, in
Anthropic's, built by `anthropic_error_body`: `{"type": "error", "error": {"type", "message"}}`,
its type named from the HTTP status as Anthropic names them (`to_anthropic`).
"""

from __future__ import annotations

from typing import Any


def openai_error_body(
    message: str, *, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The body OpenAI's API returns for an error: the one place that shape is built."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


# HTTP status → Anthropic's error type (its API documents these; any other 5xx is `api_error`).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    529: "overloaded_error",
}  # fmt: skip


def anthropic_error_body(message: str, *, status: int) -> dict[str, Any]:
    """The body Anthropic's API returns for an error of this HTTP status."""
    kind = _ANTHROPIC_TYPES.get(status)
    if kind is None:
        kind = "invalid_request_error" if 400 <= status < 500 else "api_error"
    return {"type": "error", "error": {"type": kind, "message": message}}


class InfercacheError(Exception):
    """Root of every error infercache raises on purpose."""

    status_code: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def to_openai(self) -> dict[str, Any]:
        """The body OpenAI's API returns for this kind of error."""
        return openai_error_body(
            self.message, error_type=self.error_type, param=self.param, code=self.code
        )

    def to_anthropic(self) -> dict[str, Any]:
        """The body Anthropic's API returns for this kind of error."""
        return anthropic_error_body(self.message, status=self.status_code)

    def headers(self) -> dict[str, str]:
        """HTTP headers that belong with this error (Retry-After, say)."""
        return {}


class ConfigError(InfercacheError, ValueError):
    error_type = "invalid_configuration"


class MissingExtraError(InfercacheError, ImportError):
    """An optional part (the engine, the semantic layer, plots...) is not installed. `extra`
    names what to install: `pip install 'infercache[<extra>]'` (extras.py)."""

    error_type = "missing_extra"

    def __init__(self, message: str, *, extra: str) -> None:
        super().__init__(message)
        self.extra = extra


class InvalidRequestError(InfercacheError, ValueError):
    status_code = 400
    error_type = "invalid_request_error"


class ContextTooLongError(InvalidRequestError):
    code = "context_length_exceeded"


class PayloadTooLargeError(InvalidRequestError):
    status_code = 413
    code = "payload_too_large"


class AuthenticationError(InfercacheError):
    status_code = 401
    error_type = "authentication_error"
    code = "invalid_api_key"


class PermissionDeniedError(InfercacheError):
    status_code = 403
    error_type = "permission_error"
    code = "forbidden"


class NotFoundError(InfercacheError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "not_found"


class ModelNotFoundError(NotFoundError):
    code = "model_not_found"


class OverloadedError(InfercacheError):
    """A server's queue is full: come back later (HTTP 429 with `Retry-After`)."""

    status_code = 429
    error_type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after_s)}


class NotCachedError(InfercacheError):
    """`cache_control: only-if-cached` was asked and no fresh entry exists (HTTP's 504)."""

    status_code = 504
    error_type = "cache_miss"
    code = "not_cached"


class ClientDisconnectedError(InfercacheError):
    """The client hung up before its request was read: nobody to answer (nginx's 499)."""

    status_code = 499
    error_type = "client_disconnected"


class StoreError(InfercacheError):
    """A cache store failed. Callers turn it into a counted, logged miss."""

    error_type = "store_error"


class StoreUnavailableError(StoreError):
    """The store took longer than its budget, or its circuit breaker is open: skipped."""


class NodeUnavailableError(StoreUnavailableError):
    """One node of a Redis Cluster failed, or is skipped while it fails (its own breaker,
    stores/cluster_breaker.py); keys on the other nodes are served as usual, so the breaker of
    the whole store does not count it."""


class KVTierError(StoreError):
    """A KV tier below RAM (the engine's disk or shared tier) could not read or write a block:
    the prompt is recomputed and the failure counted."""


class BlockRejectedError(KVTierError):
    """A stored KV block that must not be used; `reason`: truncated, header, tokens, checksum."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"KV block rejected ({reason}){': ' + detail if detail else ''}")
        self.reason = reason


class StoreWouldBlockError(InfercacheError):
    """A store call made in non-blocking mode (`stores.base.inline_reads`) would have waited
    (a lock, a write, a breaker not closed): the caller retries it off the event loop. Never
    reaches a client; not a `StoreError`, so no layer mistakes it for a failing store."""


class EmbedderError(InfercacheError):
    """The semantic layer's embedder failed (a remote embedder down, say). A counted miss."""

    error_type = "embedder_error"


class UpstreamError(InfercacheError):
    """The upstream model server answered with an error. Its status and body pass through."""

    error_type = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 502,
        body: dict[str, Any] | None = None,
        param: str | None = None,
        retry_after: str | None = None,
    ) -> None:
        super().__init__(message, param=param)
        self.status_code = status_code
        self.body = body
        self.retry_after = retry_after  # the upstream's Retry-After, passed on with its 429/503

    def to_openai(self) -> dict[str, Any]:
        if self.body is not None and isinstance(self.body.get("error"), dict):
            return self.body
        return super().to_openai()

    def to_anthropic(self) -> dict[str, Any]:
        """An Anthropic upstream's own error body as it came; any other's message in
        Anthropic's shape."""
        if self.body is not None and self.body.get("type") == "error":
            return self.body
        return super().to_anthropic()

    def headers(self) -> dict[str, str]:
        return {"retry-after": self.retry_after} if self.retry_after else {}


class UpstreamUnavailableError(UpstreamError):
    """Connection refused, DNS failure or timeout before any answer."""

    error_type = "upstream_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, status_code=502)


class UpstreamAbortedError(UpstreamError):
    """A shared upstream call ended without a complete answer: every client left, or the
    upstream's stream stopped before a finish_reason. A 502 for those still waiting."""

    error_type = "upstream_aborted"

    def __init__(self, message: str) -> None:
        super().__init__(message, status_code=502)
