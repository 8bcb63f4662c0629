"""The field checks the Messages and Responses request parsers share (anthropic/request.py,
responses/request.py): each raises `InvalidRequestError` naming the field (`param`), the
client's 400."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infercache.errors import InvalidRequestError


def check_number(body: Mapping[str, Any], name: str, low: float, high: float) -> None:
    """`body[name]`, when present, is a number (not a bool) from `low` to `high`."""
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidRequestError(f"`{name}` must be a number from {low} to {high}", param=name)


def check_model(body: Mapping[str, Any]) -> None:
    """`body["model"]` is a non-empty string: the model's name."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("`model` is required: the model's name", param="model")
