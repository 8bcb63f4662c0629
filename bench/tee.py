"""`Tee`: what a bench prints, printed as it comes and kept, so the bench can also write it to
its output file at the end (bench/batching.py, prefix.py, weight_formats.py)."""

from __future__ import annotations

import io
from typing import TextIO


class Tee(io.StringIO):
    """Prints and keeps what is printed."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self._out = out

    def write(self, text: str) -> int:
        self._out.write(text)
        self._out.flush()
        return super().write(text)
