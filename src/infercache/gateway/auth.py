"""Who is calling: API keys → tenants, the admin token, and the one tenant resolver.

`resolve_tenant(caller, headers, body)` is the only place a tenant is read from a key, a header
(`x-infercache-tenant`) or a directive (`infercache.tenant` in the body). It decides:

    key    `Authorization: Bearer KEY`, else `x-api-key`, else `api-key` (client_credential)
    base   with API keys (`--api-key KEY=TENANT`): the key's tenant (an unknown key is a 401)
           open mode with a bearer token: `key:` + sha256(token)[:16], so two callers with
           different provider keys never share answers
           open mode without a bearer: `open`
    claim  a header or directive tenant may only *narrow* the base, to a sub-namespace:
           `base/claim`; it can never name another base (a claim is not a base, and every
           narrowed tenant contains a `/`, which no base does)

So a caller reaches exactly the answers of its own key (or of the keyless), whatever it claims.
Admin endpoints need the separate admin token: none → 401, a tenant key → 403, and with no
admin token configured they are disabled (403). With API keys configured, `/stats` needs the
admin token too, and `/metrics` needs the metrics token (or, without one, the admin token); in
open mode both are open unless a metrics token is set. Comparisons are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infercache.errors import AuthenticationError, InvalidRequestError, PermissionDeniedError
from infercache.gateway.forwarding import CREDENTIAL_HEADERS
from infercache.request import DIRECTIVES_FIELD

TENANT_HEADER = "x-infercache-tenant"
OPEN_TENANT = "open"
_MAX_CLAIM_CHARS = 256


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str | None  # the key's tenant; None in open mode (no keys configured)
    bearer: str | None  # the raw token, never forwarded upstream unless configured to


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def client_credential(headers: Mapping[str, str]) -> str | None:
    """The gateway key a client presented: `Authorization: Bearer KEY`, else `x-api-key` (the
    Anthropic SDKs), else `api-key` (the Azure SDKs). `headers`: lower-cased names."""
    for name in CREDENTIAL_HEADERS:
        value = headers.get(name)
        if not value:
            continue
        token = bearer_token(value) if name == "authorization" else value.strip()
        if token:
            return token
    return None


def tenant_of_token(token: str) -> str:
    return "key:" + hashlib.sha256(token.encode()).hexdigest()[:16]


def _claim(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The tenant a request names, from its directive, else its header; validated."""
    directives = body.get(DIRECTIVES_FIELD)
    claimed: object = None
    if isinstance(directives, dict):
        claimed = directives.get("tenant")
    if claimed is None:
        claimed = headers.get(TENANT_HEADER)
    if claimed is None or claimed == "":
        return None
    if not isinstance(claimed, str):
        raise InvalidRequestError(
            f"infercache.tenant must be a string, got {claimed!r}", param="infercache.tenant"
        )
    if len(claimed) > _MAX_CLAIM_CHARS or not claimed.isprintable():
        raise InvalidRequestError(
            f"a tenant is at most {_MAX_CLAIM_CHARS} printable characters",
            param="infercache.tenant",
        )
    return claimed


def resolve_tenant(caller: Caller, headers: Mapping[str, str], body: Mapping[str, Any]) -> str:
    """The tenant that scopes every cache layer for this request (see the module docstring)."""
    if caller.tenant is not None:
        base = caller.tenant
    elif caller.bearer is not None:
        base = tenant_of_token(caller.bearer)
    else:
        base = OPEN_TENANT
    claim = _claim(headers, body)
    return base if claim is None else f"{base}/{claim}"


class Auth:
    def __init__(
        self,
        api_keys: Mapping[str, str],
        admin_token: str | None,
        metrics_token: str | None = None,
    ) -> None:
        self._keys = dict(api_keys)
        self._admin_token = admin_token
        self._metrics_token = metrics_token

    def require_stats(self, authorization: str | None) -> None:
        if self._keys:
            self.require_admin(authorization)

    def require_metrics(self, authorization: str | None) -> None:
        if self._metrics_token is not None:
            token = bearer_token(authorization)
            if token is not None and hmac.compare_digest(
                token.encode(), self._metrics_token.encode()
            ):
                return
            if token is None:
                raise AuthenticationError("missing metrics token: send 'Authorization: Bearer T'")
            self.require_admin(authorization)  # the admin token opens everything
            return
        if self._keys:
            self.require_admin(authorization)

    def secrets(self) -> list[str]:
        """Every key and token the gateway holds: none of them may go upstream."""
        tokens = (self._admin_token, self._metrics_token)
        return [*self._keys, *(t for t in tokens if t)]

    def caller(self, headers: Mapping[str, str]) -> Caller:
        """Who sent a request with these (lower-cased) headers; see `client_credential`."""
        token = client_credential(headers)
        if not self._keys:
            return Caller(None, token)
        if token is None:
            raise AuthenticationError(
                "missing API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')"
            )
        for key, tenant in self._keys.items():
            if hmac.compare_digest(key.encode(), token.encode()):
                return Caller(tenant, token)
        raise AuthenticationError("invalid API key")

    def require_admin(self, authorization: str | None) -> None:
        if self._admin_token is None:
            raise PermissionDeniedError("admin endpoints are disabled: start with --admin-token")
        token = bearer_token(authorization)
        if token is None:
            raise AuthenticationError("missing admin token: send 'Authorization: Bearer TOKEN'")
        if hmac.compare_digest(token.encode(), self._admin_token.encode()):
            return
        if any(hmac.compare_digest(k.encode(), token.encode()) for k in self._keys):
            raise PermissionDeniedError("a tenant API key cannot use admin endpoints")
        raise AuthenticationError("invalid admin token")
