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


# what z3 says in reason_unknown() when its check was stopped from outside: its own Ctrl-C handler (installed
# during each check) or Context.interrupt() cancel the check, which then returns unknown
_Z3_INTERRUPTED = ("canceled", "cancelled", "interrupted", "interrupted from keyboard")


def solver_check(solver: object) -> object:
    """``solver.check()`` (a z3 Solver) when it is ``sat`` or ``unsat``; never
    ``unknown``, which would read as the end of an enumeration. An interrupt
    (Ctrl-C during the check, which z3's own handler turns into ``unknown``,
    or z3's ``Context.interrupt``) raises KeyboardInterrupt; any other
    ``unknown`` a SynthError naming the solver's ``reason_unknown()``. A
    KeyboardInterrupt that Python raised while ctypes converted an argument
    of a z3 call (a ``ctypes.ArgumentError``) is raised as itself."""
    import z3

    with z3_interrupts():
        result = solver.check()  # type: ignore[attr-defined]
        if result == z3.unknown:
            reason = str(solver.reason_unknown())  # type: ignore[attr-defined]
            if reason.strip().lower() in _Z3_INTERRUPTED:
                raise KeyboardInterrupt
            from .errors import SynthError

            raise SynthError(f"the z3 solver gave no answer ({reason}); the result would be incomplete, so "
                             "nothing is reported: make the problem smaller (fewer axes, levels or steps)")
    return result


class z3_interrupts:
    """Context for a stretch of z3 calls: a Ctrl-C that Python raised inside
    ctypes' conversion of a call's arguments (``ctypes.ArgumentError: ...
    KeyboardInterrupt``) leaves as a plain KeyboardInterrupt, and a z3 error
    that says the solver was canceled as well, so the CLI's one-line
    ``interrupted`` (exit 130) handles it, never a traceback."""

    def __enter__(self) -> "z3_interrupts":
        return self

    def __exit__(self, kind: object, exc: object, traceback: object) -> bool:
        if exc is None or isinstance(exc, KeyboardInterrupt):
            return False
        import ctypes

        text = str(exc)
        interrupted = isinstance(exc, ctypes.ArgumentError) and "KeyboardInterrupt" in text
        if not interrupted and type(exc).__name__ == "Z3Exception":
            interrupted = any(word in text.lower() for word in ("canceled", "cancelled", "interrupted"))
        if interrupted:
            raise KeyboardInterrupt from None
        return False
