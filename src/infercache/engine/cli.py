"""`infercache engine ...` commands (placeholder until the engine lands)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: argparse._SubParsersAction[Any]) -> None:
    sub.add_parser("engine", help="the built-in inference engine")
