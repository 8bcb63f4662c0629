"""How a refused request value is described to a client: in JSON's words, never Python's.

An error body quoting `{value!r}` showed Python to an HTTP client: `None` for a field it never
sent, `True`, single-quoted strings. Every client-facing refusal of a value says it with these:

    shown(value)            its JSON text, cut at 80 characters: `null`, `true`, `"ten"`, `[1, 2]`
    missing(name)           "Missing required parameter: 'model'." (OpenAI's own wording)
"""

from __future__ import annotations

from typing import Any

import orjson

_MAX_CHARS = 80


def shown(value: Any) -> str:
    """`value` as JSON text (what the client sent), at most about 80 characters."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # not JSON-able: never from a parsed body, but say something
        text = type(value).__name__
    return text if len(text) <= _MAX_CHARS else text[: _MAX_CHARS - 1] + "…"


def missing(name: str) -> str:
    return f"Missing required parameter: '{name}'."
