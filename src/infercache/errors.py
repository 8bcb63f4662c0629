"""The exception tree. Foreign exceptions (sqlite3, redis, httpx, torch) are translated into
these at exactly one boundary each (the store, the upstream client, the engine).

    InfercacheError                    root; never escapes the gateway as a traceback
    ├── ConfigError                    bad settings, store URL or CLI option (also ValueError)
    ├── InvalidRequestError            a request we refuse to process: HTTP 400
    │   ├── ContextTooLongError        prompt + max_tokens over the model's window: HTTP 400
    │   └── PayloadTooLargeError       body over the configured limit: HTTP 413
    ├── AuthenticationError            missing or unknown API key: HTTP 401
    ├── PermissionDeniedError          a tenant key on an admin endpoint: HTTP 403
    ├── ModelNotFoundError             unknown model id: HTTP 404
    ├── NotCachedError                 `only-if-cached` and nothing cached: HTTP 504
    ├── StoreError                     any cache-store failure; becomes a counted miss, never
    │                                  a failed request
    └── UpstreamError                  the upstream answered with an error (its status kept)
        └── UpstreamUnavailableError   could not reach the upstream at all: HTTP 502

Every error renders in the OpenAI error shape: `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from typing import Any


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
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


class ConfigError(InfercacheError, ValueError):
    error_type = "invalid_configuration"


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


class ModelNotFoundError(InfercacheError):
    status_code = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class NotCachedError(InfercacheError):
    """`cache_control: only-if-cached` was asked and no fresh entry exists (HTTP's 504)."""

    status_code = 504
    error_type = "cache_miss"
    code = "not_cached"


class StoreError(InfercacheError):
    """A cache store failed. Callers turn it into a counted, logged miss."""

    error_type = "store_error"


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
    ) -> None:
        super().__init__(message, param=param)
        self.status_code = status_code
        self.body = body

    def to_openai(self) -> dict[str, Any]:
        if self.body is not None and isinstance(self.body.get("error"), dict):
            return self.body
        return super().to_openai()


class UpstreamUnavailableError(UpstreamError):
    """Connection refused, DNS failure or timeout before any answer."""

    error_type = "upstream_unavailable"

    def __init__(self, message: str) -> None:
        super().__init__(message, status_code=502)
