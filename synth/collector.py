"""Python's cyclic garbage collector, paused while work builds many objects.

A search, its ranking and its verification allocate millions of tuples, dict
entries and arrays that they keep (memos, the layered state graph, lowered
steps) and make no garbage cycles: each full collection walks everything built
so far for nothing. Objects still go as soon as nothing refers to them
(reference counting does not pause); only cycles wait for the collector, which
runs again when the outermost pause ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector disabled inside the block, and restored as it was
    on every exit (nested pauses leave it to the outermost)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
