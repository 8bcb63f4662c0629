"""The report's tree (report_tree.py) as the JSON document `--format json` prints, and back.

`to_json(node)`: each frozen node's fields are its keys, in order; tuples become lists; a field
whose metadata is `OMIT_NONE` is left out while None (a strategy's prefix-only or
answer-cache-only figures). `from_json(Figures, doc)` reads a document back into the tree,
from the fields' type hints: a union of two node types is told apart by the flag the document
carries (`measured`, `available`: the fields a node sets itself), and `simulation: {}` (no
replay) is None.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

Node = TypeVar("Node")
OMIT_NONE = {"omit_none": True}


def to_json(node: Any) -> Any:
    """A tree node as the JSON document holds it (dicts, lists, numbers, strings, None)."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return {
            f.name: to_json(value)
            for f in dataclasses.fields(node)
            if not ((value := getattr(node, f.name)) is None and f.metadata.get("omit_none"))
        }
    if isinstance(node, tuple | list):
        return [to_json(item) for item in node]
    if isinstance(node, Mapping):
        return {key: to_json(value) for key, value in node.items()}
    return node


def from_json(kind: type[Node], doc: Mapping[str, Any]) -> Node:
    """The tree node of type `kind` a JSON document holds (`to_json`'s inverse): a saved
    `--format json` report read back as `from_json(Figures, doc)`."""
    hints = typing.get_type_hints(kind)
    values = {
        f.name: _read(hints[f.name], doc[f.name])
        for f in dataclasses.fields(kind)  # type: ignore[arg-type]
        if f.init and f.name in doc
    }
    return kind(**values)


def _read(hint: Any, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in args if a is not type(None)]
        if value is None or (value == {} and len(options) < len(args)):
            return None  # `simulation: {}` is no replay
        return _read(options[0] if len(options) == 1 else _shape(options, value), value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_read(args[0], item) for item in value)
        return tuple(_read(a, item) for a, item in zip(args, value, strict=True))
    if origin is Mapping or origin is dict:
        return {key: _read(args[1], item) for key, item in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return from_json(hint, value)
    return value


def _shape(options: list[Any], value: Mapping[str, Any]) -> Any:
    """Which of two node types a section is: the one whose flag (`measured`, `available`)
    has the value the document carries."""
    for option in options:
        flags = [f for f in dataclasses.fields(option) if not f.init]
        if flags and all(value.get(f.name) == f.default for f in flags):
            return option
    raise ValueError(f"no node type among {options} fits {sorted(value)}")
