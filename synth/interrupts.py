"""Ctrl-C held across a stretch of work that must not be cut in the middle.

An interrupt that lands inside a C extension's import (numpy turns it into an
ImportError with a traceback) or inside ``MPI_Init`` (the rank then leaves
with MPI initialised, and its ``MPI_Finalize`` at exit waits for ranks that are
waiting for it) is held until the stretch is done and then raised as
KeyboardInterrupt where the caller can end the job cleanly.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

# no typing import here: the CLI imports this module before it holds Ctrl-C,
# and an interrupt inside typing's import would give a traceback


def holding_interrupts(work: Callable[[], object]) -> tuple[object, bool]:
    """``work()`` with SIGINT held: its result and whether an interrupt
    arrived meanwhile (the caller raises KeyboardInterrupt where it can handle
    it). Where SIGINT is not Python's default handler (ignored, or set by an
    embedding program), or off the main thread, it is left alone and the
    flag is False."""
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return work(), False
    held: list[int] = []
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    except ValueError:  # not the main thread
        return work(), False
    try:
        result = work()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return result, bool(held)
