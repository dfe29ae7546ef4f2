"""Ctrl-C held across a stretch of work that must not be cut in the middle.

An interrupt that lands inside a C extension's import (numpy turns it into an
ImportError with a traceback) or inside ``MPI_Init`` (the rank then leaves
with MPI initialised, and its ``MPI_Finalize`` at exit waits for ranks that are
waiting for it) is held until the stretch is done and then raised as
KeyboardInterrupt where the caller can end the job cleanly.

A Ctrl-C during z3 work is never lost (``solver_check``, ``z3_interrupts``):
z3's own SIGINT handler is turned off, so Python's records every SIGINT; a
watch thread cancels the check in flight; and an interrupt that lands inside
a finalizer (where Python would drop the KeyboardInterrupt) is raised again
once the finalizer is done.
"""

from __future__ import annotations

import os
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


# what z3 says in reason_unknown() when its check was stopped from outside: Context.interrupt() (from the
# SIGINT watch below or any other thread) cancels the check, which then returns unknown
_Z3_INTERRUPTED = ("canceled", "cancelled", "interrupted", "interrupted from keyboard")


def solver_check(solver: object) -> object:
    """``solver.check()`` (a z3 Solver) when it is ``sat`` or ``unsat``; never
    ``unknown``, which would read as the end of an enumeration. An interrupt
    (Ctrl-C during the check, which cancels it through the SIGINT watch of
    ``z3_interrupts``, or z3's ``Context.interrupt``) raises
    KeyboardInterrupt; any other ``unknown`` a SynthError naming the solver's
    ``reason_unknown()``. A check that answers while a Ctrl-C arrives still
    ends in KeyboardInterrupt (Python's handler recorded it). A
    KeyboardInterrupt that Python raised while ctypes converted an argument
    of a z3 call (a ``ctypes.ArgumentError``) is raised as itself."""
    import z3

    with z3_interrupts(solver.ctx):  # type: ignore[attr-defined]  # z3's global ctrl_c off: every solver reads it
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
    """Context for a stretch of z3 calls on context ``ctx`` (z3's main
    context when None).

    Ctrl-C is never lost: z3's own SIGINT handler (its global parameter
    ``ctrl_c``), which cancels a check and swallows the signal, is turned
    off, so Python's handler records every SIGINT. While the stretch runs on
    the main thread with Python's default SIGINT handler, a SIGINT also
    cancels the check in flight: Python writes it to a wakeup pipe
    (``signal.set_wakeup_fd``; the previous wakeup fd is restored when the
    outermost stretch ends and gets every byte meanwhile) that one daemon
    thread per process reads, calling ``Context.interrupt()``. Off the main
    thread, or with another SIGINT handler, nothing but ``ctrl_c`` changes.

    While a watched stretch runs, SIGINT's handler is
    :func:`_stretch_sigint_handler`: it raises KeyboardInterrupt as Python's
    default handler does, except inside a finalizer (a ``__del__`` on the
    stack: z3 objects are freed all along a stretch), where Python would
    print and drop it; there it asks the watch thread to deliver SIGINT again
    shortly, so the interrupt is raised once the finalizer has returned. The
    outermost stretch puts Python's default handler back.

    A Ctrl-C that Python raised inside ctypes' conversion of a call's
    arguments (``ctypes.ArgumentError: ... KeyboardInterrupt``) leaves as a
    plain KeyboardInterrupt, and a z3 error that says the solver was
    canceled as well, so the CLI's one-line ``interrupted`` (exit 130)
    handles it, never a traceback. From the first watched stretch on, a
    KeyboardInterrupt that Python dropped in a finalizer (a z3 object's
    ``__del__``, anywhere in the process) is delivered again as SIGINT
    (``sys.unraisablehook``).
    """

    def __init__(self, ctx: object = None) -> None:
        self._ctx = ctx
        self._watching = False

    def __enter__(self) -> "z3_interrupts":
        import z3

        z3_ctrl_c_off()
        self._watching = _watch_sigint(self._ctx if self._ctx is not None else z3.main_ctx())
        return self

    def __exit__(self, kind: object, exc: object, traceback: object) -> bool:
        if self._watching:
            self._watching = False
            _unwatch_sigint()
        if exc is None or isinstance(exc, KeyboardInterrupt):
            return False
        interrupted = _wrapped_interrupt(exc)
        if not interrupted and type(exc).__name__ == "Z3Exception":
            interrupted = any(word in str(exc).lower() for word in ("canceled", "cancelled", "interrupted"))
        if interrupted:
            raise KeyboardInterrupt from None
        return False


def _wrapped_interrupt(exc: object) -> bool:
    """Whether ``exc`` is the KeyboardInterrupt that Python raised while
    ctypes converted a call's arguments, which ctypes wraps in a
    ``ctypes.ArgumentError`` whose text names it."""
    import ctypes

    return isinstance(exc, ctypes.ArgumentError) and "KeyboardInterrupt" in str(exc)


_CTRL_C_OFF: list[bool] = []  # once set, z3's global parameter stays off for the process


def z3_ctrl_c_off() -> None:
    """z3's ``ctrl_c`` off for the process, before any z3 call that reads it
    (a check or a simplification reads it at its start, solvers made before
    included). With it on, z3 installs its own SIGINT handler during
    the call, and a SIGINT that lands as the call ends is lost (the call
    answers and Python never hears of it); one that lands while z3 installs
    the handler can deadlock the process."""
    if not _CTRL_C_OFF:
        import z3

        z3.set_param("ctrl_c", False)  # type: ignore[attr-defined]
        _CTRL_C_OFF.append(True)


_REDELIVER = 0  # the byte that asks the watch thread for SIGINT again (signal numbers start at 1)


def _redeliver_dropped_interrupt(previous: Callable[[object], object]) -> Callable[[object], object]:
    """A ``sys.unraisablehook`` for the KeyboardInterrupt that Python raised
    inside a finalizer, where it would be printed and dropped (each z3
    object's ``__del__`` calls z3 through ctypes, a point where Python raises
    a pending interrupt, bare or wrapped by ctypes: :func:`_wrapped_interrupt`),
    outside a watched stretch (inside one, :func:`_stretch_sigint_handler`
    never raises in a finalizer): it asks the watch thread to deliver SIGINT
    again (from here, on the main thread, it would be raised inside this hook
    and dropped as well). Anything else, or a SIGINT that is not Python's
    default handler, goes to ``previous``."""
    def hook(unraisable: object) -> None:
        exc = getattr(unraisable, "exc_value", None)
        if ((isinstance(exc, KeyboardInterrupt) or _wrapped_interrupt(exc)) and _WATCH
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            try:
                _ask_redelivery()
            except KeyboardInterrupt:  # the thread's redelivery, raised here as the write returned
                _ask_redelivery()
        else:
            previous(unraisable)

    return hook


def _inside_finalizer(frame: object) -> bool:
    """Whether ``frame`` (where a signal handler was called) runs inside a
    ``__del__``: an exception raised there is printed and dropped."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":  # type: ignore[attr-defined]
            return True
        frame = frame.f_back  # type: ignore[attr-defined]
    return False


def _stretch_sigint_handler(signum: int, frame: object) -> None:
    """SIGINT's handler during a watched stretch of z3 work: Python's default
    (KeyboardInterrupt), except inside a finalizer, where the interrupt would
    be dropped: then the watch thread is asked to deliver it again (it calls
    this handler once more, after the finalizer has had time to return, and
    asks again while it has not). The check in flight was cancelled by the
    signal's wakeup byte either way."""
    if _WATCH and _inside_finalizer(frame):
        _ask_redelivery()
        return
    raise KeyboardInterrupt


def _ask_redelivery() -> None:
    try:
        os.write(_WATCH[0].write_fd, bytes([_REDELIVER]))
    except OSError:
        pass  # the pipe is full: the thread has bytes to read, an interrupt among them


class _SigintWatch:
    """One wakeup pipe and the daemon thread that reads it: for each SIGINT
    byte it interrupts the z3 contexts of the stretches in progress (none
    after the outermost one ended, so an interrupt never outlives its
    stretch); every byte goes on to the wakeup fd the stretch replaced. For
    a ``_REDELIVER`` byte it delivers SIGINT to the main thread again."""

    def __init__(self) -> None:
        import threading

        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # Python's signal handler must never block on it
        self.lock = threading.Lock()
        self.contexts: list[object] = []  # innermost last; empty: no stretch in progress
        self.previous_fd = -1
        threading.Thread(target=self._read, name="synth-z3-sigint", daemon=True).start()

    def _read(self) -> None:
        import _thread
        import time

        while True:
            data = os.read(self.read_fd, 512)
            if _REDELIVER in data:
                time.sleep(0.01)  # the main thread leaves the hook that asked (raised there, it would be dropped)
                _thread.interrupt_main()  # Python's handler, as for a SIGINT; its byte comes next
                data = data.replace(bytes([_REDELIVER]), b"")
            with self.lock:
                if self.previous_fd != -1 and data:
                    try:
                        os.write(self.previous_fd, data)
                    except OSError:
                        pass  # its owner's pipe is full or gone: as if the byte had been dropped there
                if signal.SIGINT in data:
                    for ctx in {id(c): c for c in self.contexts}.values():
                        ctx.interrupt()  # type: ignore[attr-defined]


_WATCH: list[_SigintWatch] = []  # at most one per process, made by the first stretch that needs it


def _forget_watch() -> None:
    """In a forked child: the thread did not survive the fork."""
    _WATCH.clear()


def _watch_sigint(ctx: object) -> bool:
    """Adds ``ctx`` to the contexts a SIGINT interrupts, arming the wakeup fd
    when no stretch is in progress; False (nothing done) off the main thread
    or where SIGINT is not Python's default handler."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) not in (signal.default_int_handler, _stretch_sigint_handler):
        return False
    if not _WATCH:
        import sys

        _WATCH.append(_SigintWatch())
        os.register_at_fork(after_in_child=_forget_watch)
        sys.unraisablehook = _redeliver_dropped_interrupt(sys.unraisablehook)
    watch = _WATCH[0]
    with watch.lock:
        if not watch.contexts:
            watch.previous_fd = signal.set_wakeup_fd(watch.write_fd, warn_on_full_buffer=False)
            signal.signal(signal.SIGINT, _stretch_sigint_handler)
        watch.contexts.append(ctx)
    return True


def _unwatch_sigint() -> None:
    """Undoes the latest ``_watch_sigint``; the outermost one restores the
    previous wakeup fd."""
    if not _WATCH:
        return  # forked inside the stretch: the child has no watch
    watch = _WATCH[0]
    with watch.lock:
        watch.contexts.pop()
        if not watch.contexts:
            if signal.getsignal(signal.SIGINT) is _stretch_sigint_handler:  # unless the stretch set another
                signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.set_wakeup_fd(watch.previous_fd)
            watch.previous_fd = -1
