"""Python's cyclic garbage collector, paused while work builds many objects.

A search, its ranking and its verification allocate millions of tuples, dict
entries and arrays that they keep (memos, the layered state graph, lowered
steps) and make no garbage cycles: each full collection walks everything built
so far for nothing. Objects still go as soon as nothing refers to them
(reference counting does not pause); only cycles wait for the collector, which
runs again when the outermost pause ends.

A process that owns its collector (the ``synth-reduce`` command) may ask,
with :func:`freeze_after_pauses`, that what survives an outermost pause be
moved to the collector's permanent generation (:func:`gc.freeze`): the first
collection after the pause would otherwise walk every object built during it
to find no cycle (0.2 s after a search of five levels of 4, about 1 s after
six), and every full collection after that again. Frozen objects are still
freed by reference counting when dropped; a garbage cycle that exists at that
moment is kept until the process ends, which is why a library call does not
freeze unless asked.

Test hook: ``_freezing`` (whether :func:`freeze_after_pauses` was asked in this
process), which tests reset and read.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_freezing = False


def freeze_after_pauses() -> None:
    """From now on, the end of an outermost pause freezes what survives it
    (the module's docstring): for the command-line process, not for
    libraries."""
    global _freezing
    _freezing = True


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector disabled inside the block, and restored as it was
    on every exit (nested pauses leave it to the outermost, which freezes
    what survives the block after :func:`freeze_after_pauses`)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if _freezing:
                gc.freeze()
            gc.enable()
