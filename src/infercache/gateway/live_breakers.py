"""Prefix breakers in live traffic: each request that goes upstream offers its first message
(chat's first message, Messages' `system`, Responses' `instructions` or first input item) to the
one finder the analyzer uses too (prefix_breakers.py), per tenant and model; `/stats` lists
what it found in the analyzer's words (`advice_line`).

Only misses are observed: a hit never reaches the provider, so its layout costs no prompt-cache
reuse. Token counts are estimated at 4 characters a token (the gateway has no tokenizer for a
hosted model). Bounded as the finder is (exemplars per namespace, namespaces); thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from infercache.prefix_breakers import BreakerFinder, advice_line
from infercache.request import ChatRequest, Endpoint

CHARS_PER_TOKEN = 4
SHOWN = 5  # breakers listed in /stats, the most tokens lost first


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and content:
        parts = [p.get("text") for p in content if isinstance(p, Mapping)]
        if parts and all(isinstance(p, str) for p in parts):
            return "".join(parts)  # type: ignore[arg-type]
    return None


def first_message(request: ChatRequest) -> tuple[str, str] | None:
    """(role, text) of the message a request's prompt starts with; None when it has none."""
    body = request.body
    if request.endpoint is Endpoint.MESSAGES:
        text = _text(body.get("system"))
        return ("system", text) if text else None
    if request.endpoint is Endpoint.RESPONSES:
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            return "system", body["instructions"]
        items = body.get("input")
        first = items[0] if isinstance(items, list) and items else None
    else:
        messages = body.get("messages")
        first = messages[0] if isinstance(messages, list) and messages else None
    if not isinstance(first, Mapping):
        return None
    text = _text(first.get("content"))
    return (str(first.get("role", "user")), text) if text else None


class LiveBreakers:
    def __init__(self) -> None:
        self._finder = BreakerFinder(lambda text: len(text) // CHARS_PER_TOKEN)
        self._lock = threading.Lock()

    def observe(self, request: ChatRequest) -> None:
        found = first_message(request)
        if found is None:
            return
        tenant, model = request.directives.tenant, request.model
        with self._lock:
            self._finder.observe(f"{tenant}\x00{model}", tenant, model, *found)

    def lines(self) -> list[str]:
        """What /stats says: each breaker in the analyzer's words, most tokens lost first."""
        with self._lock:
            found = self._finder.findings()[:SHOWN]
        return [advice_line(b, f"tenant {b.tenant!r}, model {b.model!r}") for b in found]
