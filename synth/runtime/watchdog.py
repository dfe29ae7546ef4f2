"""A progress watchdog for commands that run collectives (``bench --timeout``),
like NCCL's and torch.distributed's collective timeouts: a rank that stops
(SIGSTOP, a debugger, a dead host) leaves the others waiting in a collective
forever; with a timeout, each rank ends the job once it has made no progress
for that long.

Progress is what the runtime reports through :func:`progressed`: every program
run on a buffer and every agreement among the ranks
(:class:`~synth.runtime.executor.World`). When a rank's last progress is
older than the timeout, its watchdog thread prints one line on stderr and
aborts the job: ``MPI_Abort`` under mpiexec (every rank ends), else the process
exits and the launcher (torchrun) ends the others. Exit code
:data:`EXIT_TIMEOUT`.
"""

from __future__ import annotations

import os
import sys
import threading
import time

EXIT_TIMEOUT = 124  # as coreutils' timeout: the command was ended for taking too long
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week: any longer is no timeout

_last_progress = [time.monotonic()]


def progressed() -> None:
    """This rank made progress (a program ran, the ranks agreed): cheap,
    called on the hot path."""
    _last_progress[0] = time.monotonic()


def parse_timeout(text: str | None, option: str = "--timeout") -> float | None:
    """Seconds from ``--timeout S`` (None: no timeout); SynthError unless a
    number of seconds > 0 and at most :data:`MAX_TIMEOUT_S`."""
    if text is None:
        return None
    from ..errors import SynthError

    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= MAX_TIMEOUT_S:
        raise SynthError(f"{option} {text}: give the seconds without progress after which the job is ended, a "
                         f"number > 0 and at most {MAX_TIMEOUT_S:.0f} (a week)")
    return seconds


def arm(timeout_s: float | None) -> threading.Thread | None:
    """Start this rank's watchdog (a daemon thread) for ``timeout_s`` seconds
    without progress; None does nothing. Counts from now."""
    if timeout_s is None:
        return None
    progressed()
    thread = threading.Thread(target=_watch, args=(timeout_s,), name="synth-watchdog", daemon=True)
    thread.start()
    return thread


def _watch(timeout_s: float) -> None:
    while True:
        idle = time.monotonic() - _last_progress[0]
        if idle >= timeout_s:
            _end_job(timeout_s)
            return
        time.sleep(min(1.0, timeout_s - idle + 0.01))


def _end_job(timeout_s: float) -> None:
    """One line, then every rank ends: MPI_Abort where MPI is running, else
    this process exits (torchrun then ends the other workers)."""
    print(f"synth-reduce: error: no progress for {timeout_s:g} s (--timeout {timeout_s:g}): a rank is stalled "
          "(stopped, or waiting for one that is); ending the job", file=sys.stderr, flush=True)
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Abort(EXIT_TIMEOUT)
    os._exit(EXIT_TIMEOUT)
