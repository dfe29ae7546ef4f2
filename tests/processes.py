"""Subprocesses in tests, bounded so that a hang fails the test and a slow
machine does not.

A limit is given as what a quiet 2-core machine needs with a wide margin, and
stretched by :func:`time_scale`: the load per core when the process starts
(a machine whose load average is 30 on 2 cores runs a process about 15 times
slower), or ``SYNTH_TEST_TIME_SCALE`` where the caller knows better. Long runs
that print as they go are bounded by progress instead (:func:`run_watched`):
they fail only when they print nothing for a while, however long they take.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence

# the most a limit is stretched: a test that hangs still fails in bounded time
MAX_SCALE = 30.0


def time_scale() -> float:
    """How many times slower than a quiet machine this one runs now, at least 1
    (``SYNTH_TEST_TIME_SCALE`` if set, else the 1-minute load average per core)."""
    given = os.environ.get("SYNTH_TEST_TIME_SCALE")
    if given:
        return min(MAX_SCALE, max(1.0, float(given)))
    try:
        load = os.getloadavg()[0]
    except OSError:  # not on this platform
        return 1.0
    return min(MAX_SCALE, max(1.0, load / (os.cpu_count() or 1)))


def limit_s(quiet_s: float) -> float:
    """A time limit: ``quiet_s`` (enough on a quiet machine, with margin) times
    :func:`time_scale` now."""
    return quiet_s * time_scale()


def run(argv: Sequence[str], quiet_s: float, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True)`` bounded by
    ``limit_s(quiet_s)``; TimeoutExpired past it."""
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=limit_s(quiet_s), **kwargs)


class Stalled(AssertionError):
    """A watched process printed nothing for too long (it was killed)."""


def run_watched(argv: Sequence[str], stall_s: float, **kwargs) -> subprocess.CompletedProcess:
    """Run ``argv`` (its own process group, output captured as text) until it
    exits; kill the whole group and raise :class:`Stalled` only when it prints
    nothing on stdout or stderr for ``limit_s(stall_s)`` (re-scaled at every
    check, so load that comes later is allowed for). For launches whose workers
    print a line per unit of work: progress, not total time, bounds them."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)
    chunks: dict[str, list[str]] = {"out": [], "err": []}
    last = [time.monotonic()]

    def drain(stream, into: list[str]) -> None:
        for line in iter(stream.readline, ""):
            into.append(line)
            last[0] = time.monotonic()
        stream.close()

    readers = [threading.Thread(target=drain, args=(proc.stdout, chunks["out"]), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, chunks["err"]), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        while proc.poll() is None:
            if time.monotonic() - last[0] > limit_s(stall_s):
                raise Stalled(f"{' '.join(argv[:6])} ...: no output for {limit_s(stall_s):.0f} s, killed\n"
                              + "".join(chunks["out"][-20:]) + "".join(chunks["err"][-20:]))
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        for reader in readers:
            reader.join(timeout=10)
    return subprocess.CompletedProcess(list(argv), proc.returncode, "".join(chunks["out"]), "".join(chunks["err"]))


def launch_output(done: subprocess.CompletedProcess) -> str:
    """What a failed multi-process launch printed, for an assertion message:
    the tail of stdout, the head of stderr (where a rank's own error comes,
    before the launcher's summary) and the tail of stderr (the summary)."""
    err = done.stderr if len(done.stderr) <= 6000 else done.stderr[:4500] + "\n[...]\n" + done.stderr[-1500:]
    return done.stdout[-3000:] + err


def launch_sections(stdout: str) -> dict[str, tuple[str, int | None]]:
    """The sections of a launch's stdout whose rank 0 prints ``#section NAME``,
    the section's output, then the JSON line ``{"section": NAME, "code": CODE}``
    (tests/torch_worker.py ``run_sections``): NAME -> (its output, CODE; None
    where the section never reported one)."""
    sections: dict[str, list] = {}
    name = None
    for line in stdout.splitlines(keepends=True):
        if line.startswith("#section "):
            name = line.split()[1]
            sections[name] = ["", None]
        elif line.startswith('{"section": '):
            record = json.loads(line)
            sections[record["section"]][1] = record["code"]
        elif name is not None:
            sections[name][0] += line
    return {k: (text, code) for k, (text, code) in sections.items()}
