"""Cache controls sent as HTTP headers, folded into the body's `infercache` object.

    Cache-Control: no-cache | no-store | only-if-cached | max-age=N   (comma-separated)
    x-infercache-tags: kb:pricing, kb:faq
    x-infercache-context: <opaque version string or digest>

(The tenant header is read by `auth.resolve_tenant`, the one place that decides the tenant.)

A field the body's `infercache` object already sets wins over its header; cache-control
directives from both are combined. Unknown Cache-Control directives are ignored, as HTTP says;
a malformed max-age is a 400. The caller's body is not mutated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infercache.errors import InvalidRequestError
from infercache.request import DIRECTIVES_FIELD

_KNOWN = ("no-cache", "no-store", "only-if-cached")


def _cache_control(value: str) -> tuple[list[str], float | None]:
    flags: list[str] = []
    max_age: float | None = None
    for part in (p.strip().lower() for p in value.split(",")):
        if part in _KNOWN:
            flags.append(part)
        elif part.startswith("max-age="):
            raw = part.split("=", 1)[1].strip('"')
            if not (raw.isascii() and raw.isdigit()):
                raise InvalidRequestError(
                    f"Cache-Control max-age must be whole seconds, got {raw!r}",
                    param="cache-control",
                )
            # RFC 9111 §1.2.2: a delta-seconds too large to hold means 2**31 seconds.
            max_age = float(min(int(raw), 2**31))
    return flags, max_age


def apply_header_controls(body: dict[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
    """`body` with header controls merged into its `infercache` object (a new dict)."""
    raw = body.get(DIRECTIVES_FIELD)
    directives: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}
    if raw is not None and not isinstance(raw, dict):
        return body  # parse_request reports the malformed object itself
    changed = False
    if "cache-control" in headers:
        flags, max_age = _cache_control(headers["cache-control"])
        if flags:
            existing = directives.get("cache_control") or []
            if isinstance(existing, str):
                existing = [p.strip() for p in existing.split(",") if p.strip()]
            if isinstance(existing, list) and all(isinstance(e, str) for e in existing):
                directives["cache_control"] = sorted(set(existing) | set(flags))
                changed = True  # (a malformed body value is left for parse_request to refuse)
        if max_age is not None and "max_age_s" not in directives:
            directives["max_age_s"] = max_age
            changed = True
    if "x-infercache-tags" in headers and "tags" not in directives:
        tags = [t.strip() for t in headers["x-infercache-tags"].split(",") if t.strip()]
        directives["tags"] = tags
        changed = True
    if "x-infercache-context" in headers and "context" not in directives:
        directives["context"] = headers["x-infercache-context"]
        changed = True
    if not changed:
        return body
    return {**body, DIRECTIVES_FIELD: directives}
