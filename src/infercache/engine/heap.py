"""Giving freed heap memory back to the OS while a model loads.

Building a weight format's copies frees float32 temporaries of several MB each (fused
projections, FBGEMM's saturated copies of each weight). Once glibc has raised its mmap
threshold past them (it does after the first large free), they are served from the heap, and
freed into it they stay resident: the packed weights allocated between them keep the heap from
shrinking at its top. Loading the packaged model that way left ~70 MB of free heap resident at
the end and raised the peak while loading by as much. `return_freed_memory` asks glibc
(`malloc_trim(0)`, which also releases whole free pages inside the heap) to give them back; the
model calls it after each layer, so the temporaries of one layer at most are ever resident
(bench/README.md, "Weight formats"). Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    trim: Callable[[int], int] | None = getattr(ctypes.CDLL(None), "malloc_trim", None)
    return trim  # None under musl: nothing to do


def return_freed_memory() -> None:
    """Release the heap's free pages to the OS (glibc); nothing elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
