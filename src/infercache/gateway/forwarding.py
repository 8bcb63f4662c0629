"""Which parts of a client's request may reach an upstream: the one answer to that question.

An allowlist, never a denylist: a passed-through request carries only the client headers named
here (content negotiation, the providers' API-version and beta switches, idempotency keys, the
SDKs' `x-stainless-*` telemetry) plus what the operator forwards on purpose
(`--forward-header NAME`). Every other header is dropped, so no credential header of any name
(`authorization`, `x-api-key`, `api-key`, `proxy-authorization`, cookies, a vendor's
`x-goog-api-key`, ...) leaves with the request; the upstream's own credentials are added by the
upstream itself. As a second line, a header or query parameter whose value holds one of the
caller's presented credentials is dropped even when allowed, and so is a query parameter named
like a credential (`api-key`, `key`, `access_token`, ...).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import parse_qsl, urlencode

# Client headers an upstream may see on a passed-through request.
ALLOWED_HEADERS = frozenset(
    (
        "accept", "accept-encoding", "accept-language", "content-type", "content-encoding",
        "user-agent", "idempotency-key", "x-request-id",
        "openai-beta", "openai-organization", "openai-project",
        "anthropic-version", "anthropic-beta",
    )
)  # fmt: skip
ALLOWED_PREFIXES = ("x-stainless-",)  # the official SDKs' client description, no secrets

# Headers a client may present its gateway key in (auth.py reads them in this order).
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key")

# Query parameters that carry credentials by their name (Azure's `api-key`, Google's `key`, ...).
CREDENTIAL_PARAMS = frozenset(
    ("api-key", "api_key", "apikey", "key", "access_token", "token", "auth", "authorization",
     "x-api-key", "password", "secret", "client_secret")
)  # fmt: skip


def presented_secrets(headers: Mapping[str, str]) -> list[str]:
    """Every credential value the client presented: the raw values of the credential headers and
    a bearer's token alone (what must not appear anywhere upstream)."""
    secrets: list[str] = []
    for name in CREDENTIAL_HEADERS:
        value = headers.get(name)
        if not value:
            continue
        secrets.append(value)
        _, _, token = value.partition(" ")
        if token.strip():
            secrets.append(token.strip())
    return [s for s in secrets if len(s) >= 4]  # a value that short matches everything


def _holds_secret(value: str, secrets: Iterable[str]) -> bool:
    return any(secret in value for secret in secrets)


def forwarded_headers(
    headers: Mapping[str, str],
    secrets: Sequence[str],
    *,
    also_allowed: frozenset[str] = frozenset(),
) -> dict[str, str]:
    """The client headers a passed-through request keeps (names lower-cased). `secrets`: the
    caller's presented credentials and the gateway's own keys and tokens."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        key = name.lower()
        allowed = key in ALLOWED_HEADERS or key in also_allowed or key.startswith(ALLOWED_PREFIXES)
        if allowed and not _holds_secret(value, secrets):
            out[key] = value
    return out


def forwarded_query(query: str, secrets: Sequence[str]) -> str:
    """`query` without parameters named like credentials or holding one of `secrets`."""
    if not query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    kept = [
        (name, value)
        for name, value in pairs
        if name.lower() not in CREDENTIAL_PARAMS and not _holds_secret(value, secrets)
    ]
    return query if len(kept) == len(pairs) else urlencode(kept)
