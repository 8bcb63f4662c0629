"""API keys → tenants, and the admin token.

With keys configured (`--api-key KEY=TENANT`), every request needs `Authorization: Bearer KEY`
with a known key (else 401), and the key's tenant scopes every layer; whatever tenant the body
or a header claims is ignored. Without keys the gateway is open: the tenant is the one the
request names (`x-infercache-tenant` or `infercache.tenant`), else one derived from the bearer
token (sha256, so two callers with different provider keys never share answers), else "".

Admin endpoints need the separate admin token: none → 401, a tenant key → 403, and with no
admin token configured they are disabled (403). Comparisons are constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from infercache.errors import AuthenticationError, PermissionDeniedError


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str | None  # None: not fixed by authentication (the request may name one)
    bearer: str | None  # the raw token, for passing through to the upstream


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def tenant_of_token(token: str) -> str:
    return "key:" + hashlib.sha256(token.encode()).hexdigest()[:16]


class Auth:
    def __init__(self, api_keys: Mapping[str, str], admin_token: str | None) -> None:
        self._keys = dict(api_keys)
        self._admin_token = admin_token

    @property
    def keys_required(self) -> bool:
        return bool(self._keys)

    def caller(self, authorization: str | None) -> Caller:
        token = bearer_token(authorization)
        if not self._keys:
            return Caller(None, token)
        if token is None:
            raise AuthenticationError("missing API key: send 'Authorization: Bearer KEY'")
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
