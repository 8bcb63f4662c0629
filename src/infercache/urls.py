"""URLs as they may be shown: credentials masked, everywhere a URL is printed, logged or served.

`mask_credentials("redis://:hunter2@host:6379/0")` → `"redis://:***@host:6379/0"`; a password
is always replaced, a user name beside a password is kept (`default:***@`), a user name alone is
replaced (it is often a token: `https://TOKEN@host`), and so is any `token`, `password`, `key`
or `secret` query parameter. Pure; never raises on a malformed URL (it is
then returned with everything between `://` and `@` masked).
"""

from __future__ import annotations

import urllib.parse

MASK = "***"
_SECRET_PARAMS = ("password", "token", "key", "secret", "api_key", "apikey")


def has_credentials(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
        return parts.password is not None or parts.username is not None
    except ValueError:
        return "@" in url.partition("://")[2].partition("/")[0]


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """(the URL without `user:password@`, user, password), the last two unquoted."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None, None
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    bare = urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    user = urllib.parse.unquote(parts.username) if parts.username is not None else None
    password = urllib.parse.unquote(parts.password) if parts.password is not None else None
    return bare, user, password


def mask_credentials(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        userinfo, _, host = authority.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        authority = f"{user}:{MASK}@{host}" if colon else f"{MASK}@{host}"
    path, qmark, query = tail.partition("?")
    if qmark:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = urllib.parse.urlencode(
            [(k, MASK if k.lower() in _SECRET_PARAMS else v) for k, v in pairs], safe="*"
        )
    return f"{scheme}://{authority}{slash}{path}{qmark}{query}"
