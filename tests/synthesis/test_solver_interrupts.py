"""Every z3 loop takes ``unknown`` for what it is: an interrupted check ends
the command (``synth-reduce: interrupted``, exit 130, nothing written), any
other ``unknown`` is an error naming the solver's reason; neither is ever read
as the end of an enumeration or as an answer."""

from __future__ import annotations

import os
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import z3
from processes import run

from synth.errors import SynthError
from synth.synthesis.bounded import bounded_programs, is_valid
from synth.synthesis.language import parse_program
from synth.synthesis.lowering import lower
from synth.synthesis.placement import Placement, enumerate_matrices_z3, parse_axes
from synth.synthesis.prove import prove
from synth.synthesis.reduction import Reduction
from synth.synthesis.semantics import Goal, Hierarchy
from synth.topology import load_topology

REPO = Path(__file__).resolve().parents[2]


def unknown_from_call(monkeypatch, call: int, reason: str) -> list[int]:
    """z3.Solver.check answers ``unknown`` (reason ``reason``) from its
    ``call``-th call on; the calls made are counted in the list returned."""
    real_check, real_reason = z3.Solver.check, z3.Solver.reason_unknown
    calls: list[int] = []

    def check(self, *args):
        calls.append(1)
        return z3.unknown if len(calls) >= call else real_check(self, *args)

    monkeypatch.setattr(z3.Solver, "check", check)
    monkeypatch.setattr(z3.Solver, "reason_unknown",
                        lambda self: reason if len(calls) >= call else real_reason(self))
    return calls


def broken_program():
    """A lowered program whose proof needs the solver (its second step's
    chunks are wrong, so the sums differ)."""
    placement = Placement(load_topology("p2-a100"), parse_axes("dp=4,mp=16"), ((2, 2), (2, 8)))
    text = "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)"
    lowered = lower(parse_program(text), Reduction.of(placement, ["dp"]))
    steps = lowered.steps
    return replace(lowered, steps=(steps[0], replace(steps[1], chunks=tuple((0, 1) for _ in steps[1].chunks)),
                                   steps[2]))


LOOPS = {
    "placement (the tests' z3 reference)": lambda: enumerate_matrices_z3((2, 2, 2), (2, 2, 2)),
    "bounded programs": lambda: bounded_programs(Hierarchy(("node", "gpu"), (2, 2)), Goal.ALLREDUCE, 3),
    "bounded validity": lambda: is_valid(Hierarchy(("node", "gpu"), (2, 2)), Goal.ALLREDUCE, ["AllReduce(root, inside)"]),
    "proof": lambda: prove(broken_program()),
}


@pytest.mark.parametrize("loop", LOOPS)
def test_an_interrupted_check_is_an_interrupt_never_the_end(monkeypatch, loop):
    work = LOOPS[loop]
    real = work()  # the answer without interruption: the loops end on unsat, not on unknown
    assert real or real is False or hasattr(real, "proved")
    calls = unknown_from_call(monkeypatch, 2 if loop.startswith(("placement", "bounded programs")) else 1, "canceled")
    with pytest.raises(KeyboardInterrupt):
        work()
    assert calls


@pytest.mark.parametrize("loop", LOOPS)
def test_any_other_unknown_is_an_error_naming_the_reason(monkeypatch, loop):
    unknown_from_call(monkeypatch, 1, "(resource limits reached)")
    with pytest.raises(SynthError, match=r"z3 solver gave no answer \(\(resource limits reached\)\)"):
        LOOPS[loop]()


def test_z3s_own_interrupt_ends_the_enumeration_with_keyboardinterrupt():
    """z3's Context.interrupt from another thread cancels the check in flight
    (it then answers unknown): the enumeration raises instead of returning the
    placements found so far."""
    stop = threading.Event()

    def interrupt_until_stopped():
        while not stop.wait(0.005):
            z3.main_ctx().interrupt()

    thread = threading.Thread(target=interrupt_until_stopped)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            enumerate_matrices_z3((2,) * 6, (2,) * 6)  # 720 matrices: many checks, each one long enough to cancel
    finally:
        stop.set()
        thread.join()
    assert len(enumerate_matrices_z3((2,) * 3, (2,) * 3)) == 6  # the context is usable again afterwards


# the CLI with the placement enumeration wrapped: once it has listed the placements a SIGINT arrives (as a
# Ctrl-C would, mid-command): the command ends as interrupted, never with the placements found so far
DRIVER = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # an interactive shell's Ctrl-C, whatever the runner inherited
    import synth.synthesis.placement as placement
    from synth.cli import main

    real = placement.enumerate_matrices

    def enumerate_then_ctrl_c(*args, **kwargs):
        found = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # the KeyboardInterrupt arrives here
        return found

    placement.enumerate_matrices = enumerate_then_ctrl_c
    sys.exit(main(sys.argv[1:]))
""")


def test_ctrl_c_during_the_enumeration_exits_130_and_writes_nothing(tmp_path):
    levels = "\n".join(f"  - {{name: l{i}, count: 2, bandwidth_GBps: 10.0, latency_us: 1.0}}" for i in range(7))
    (tmp_path / "seven.yaml").write_text(f"name: seven\nlevels:\n{levels}\n")
    out = tmp_path / "p.json"
    axes = ",".join(f"a{i}=2" for i in range(7))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = run([sys.executable, "-c", DRIVER, "--topology", str(tmp_path / "seven.yaml"), "--axes", axes,
                  "--out", str(out)], 120, env=env, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (130, ""), result
    assert result.stderr == "synth-reduce: interrupted\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seven.yaml"]


def test_a_ctrl_c_that_ctypes_wraps_is_an_interrupt_not_a_traceback(cli, monkeypatch):
    """Python raises a pending KeyboardInterrupt while ctypes converts a z3
    call's arguments, and ctypes wraps it (ctypes.ArgumentError): the command
    still ends as interrupted, exit 130, one line."""
    import ctypes

    def wrapped(self, *args):
        raise ctypes.ArgumentError("argument 1: KeyboardInterrupt: ")

    import synth.synthesis.placement as placement

    with monkeypatch.context() as patch:  # raised anywhere in a command: the command line's net
        patch.setattr(placement, "enumerate_matrices", lambda *args, **kwargs: wrapped(None))
        code, out, err = cli("--topology", "testbed-2x4", "--axes", "dp=2,mp=4")
    assert (code, out, err) == (130, "", "synth-reduce: interrupted\n")
    monkeypatch.setattr(z3.Solver, "check", wrapped)  # inside the loop: solver_check's own
    with pytest.raises(KeyboardInterrupt):
        enumerate_matrices_z3((2, 4), (2, 4))


# ---------------------------------------------------------------- a real SIGINT during z3 work

# a child doing many small checks (a fresh solver each time, as the proofs do, so z3 objects are freed all
# along) for argv[1] seconds after "ready": a SIGINT anywhere in them ends it with exit 130, never "completed"
SMALL_CHECKS = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # an interactive shell's Ctrl-C, whatever the runner inherited
    import z3
    from synth.interrupts import solver_check, z3_interrupts
    try:
        with z3_interrupts():
            print("ready", flush=True)
            end = time.monotonic() + float(sys.argv[1])
            while time.monotonic() < end:
                solver = z3.Solver()
                x, y = z3.Ints("x y")
                solver.add(x + y == 10, x > 2, y > 3)
                solver_check(solver)
    except KeyboardInterrupt:
        sys.exit(130)
    print("completed", flush=True)
""")

# a child whose one check (pigeonhole 12 -> 11, a minute or more of z3) is cancelled by SIGINT: the check
# itself must stop (z3 says it was canceled), not end with an answer that Python then interrupts
LONG_CHECK = textwrap.dedent("""
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as above
    import z3
    from synth.interrupts import solver_check
    n = 12
    pigeon = [[z3.Bool(f"p{i}_{j}") for j in range(n - 1)] for i in range(n)]
    solver = z3.Solver()
    solver.add([z3.Or(row) for row in pigeon])
    solver.add([z3.Or(z3.Not(pigeon[i][j]), z3.Not(pigeon[k][j]))
                for j in range(n - 1) for i in range(n) for k in range(i + 1, n)])
    print("ready", flush=True)
    try:
        print("answered", solver_check(solver), flush=True)
    except KeyboardInterrupt:
        print("interrupted:", solver.reason_unknown(), flush=True)
        sys.exit(130)
""")


def sigint_after_ready(script: str, delay_s: float, quiet_s: float, *args: str) -> tuple[int, str, str]:
    """Runs ``script`` (with ``args``), sends it SIGINT ``delay_s`` after it printed "ready",
    and returns its exit code, stdout and stderr (killed past
    ``limit_s(quiet_s)``: a lost interrupt fails, never hangs)."""
    import signal
    import subprocess
    import time

    from processes import limit_s

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        first = proc.stdout.readline()
        assert first == "ready\n", (first, proc.stderr.read())
        time.sleep(delay_s)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=limit_s(quiet_s))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, first + out, err


@pytest.mark.slow
def test_a_sigint_at_any_point_of_many_checks_ends_the_loop():
    """z3's own Ctrl-C handler, installed during each check, swallowed a
    SIGINT that landed as the check ended (and Python drops a
    KeyboardInterrupt raised in a z3 object's finalizer): about one such run
    in eight went on to the end as if nothing had happened."""
    import random

    delays = sorted(random.uniform(0.02, 0.6) for _ in range(12))
    from processes import limit_s

    ends = [sigint_after_ready(SMALL_CHECKS, delay, 30, str(limit_s(3.0))) for delay in delays]
    assert [end[:2] for end in ends] == [(130, "ready\n")] * len(delays), list(zip(delays, ends))


@pytest.mark.slow
def test_a_sigint_cancels_a_long_check_midway():
    code, out, err = sigint_after_ready(LONG_CHECK, 0.5, 60)
    cancelled = [f"ready\ninterrupted: {reason}\n" for reason in ("interrupted", "canceled", "interrupted from keyboard")]
    assert code == 130 and out in cancelled, (code, out, err)


def test_a_check_restores_the_wakeup_fd_it_found():
    """The SIGINT watch borrows Python's wakeup fd during a stretch of z3 work
    on the main thread and gives back the one that was set."""
    import signal

    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.set_wakeup_fd(write_fd)
    try:
        assert enumerate_matrices_z3((2, 2), (2, 2)) == [((1, 2), (2, 1)), ((2, 1), (1, 2))]
        assert signal.set_wakeup_fd(previous) == write_fd
    finally:
        signal.set_wakeup_fd(previous)
        signal.signal(signal.SIGINT, inherited)
        os.close(read_fd)
        os.close(write_fd)


# a proof that z3's simplification settles (no solver check): z3 reads ctrl_c in each simplification too
PROOF_ONLY = textwrap.dedent("""
    import z3
    from synth.synthesis.language import parse_program
    from synth.synthesis.lowering import lower
    from synth.synthesis.placement import Placement, parse_axes
    from synth.synthesis.prove import prove
    from synth.synthesis.reduction import Reduction
    from synth.topology import load_topology

    def no_check(self, *args):
        raise AssertionError("a solver check")

    z3.Solver.check = no_check
    placement = Placement(load_topology("p2-a100"), parse_axes("dp=4,mp=16"), ((2, 2), (2, 8)))
    text = "ReduceScatter(node, inside)\\nAllReduce(node, parallel(root))\\nAllGather(node, inside)"
    print(prove(lower(parse_program(text), Reduction.of(placement, ["dp"]))).proved, z3.get_param("ctrl_c"))
""")


def test_z3s_own_ctrl_c_handler_is_off_before_a_proof_simplifies():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = run([sys.executable, "-c", PROOF_ONLY], 60, env=env)
    assert (result.returncode, result.stdout) == (0, "True false\n"), result


# a child whose finalizer gets a SIGINT in the middle of its work, during a stretch of z3 work (argv[1]
# "stretch") or after one (argv[1] "after", the finalizer raising what ctypes makes of an interrupt)
FINALIZER_INTERRUPTED = textwrap.dedent("""
    import ctypes, os, signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as above
    import z3
    from synth.interrupts import solver_check, z3_interrupts

    class Freed:
        def __del__(self):
            if sys.argv[1] == "after":
                raise ctypes.ArgumentError("argument 1: KeyboardInterrupt: ")  # as ctypes wraps one
            os.kill(os.getpid(), signal.SIGINT)
            total = 0
            for i in range(200000):  # Python work: the interrupt is due at any of these steps
                total += i
            print("finalized", flush=True)

    def checks(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            solver = z3.Solver()
            solver.add(z3.Int("x") > 2)
            solver_check(solver)

    try:
        with z3_interrupts():
            checks(0.1)
            if sys.argv[1] == "stretch":
                Freed()
                checks(3.0)
        if sys.argv[1] == "after":
            Freed()
            checks(3.0)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
    print("completed", flush=True)
""")


@pytest.mark.parametrize("when", ["stretch", "after"])
def test_an_interrupt_in_a_finalizer_is_raised_after_it(when):
    """During a stretch of z3 work a SIGINT that lands in a finalizer (z3
    frees its objects in ``__del__``, where Python drops an exception) waits
    until the finalizer has returned and then ends the work; after the
    stretch, one that a finalizer dropped (bare, or wrapped by ctypes as
    here) is delivered again."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = run([sys.executable, "-c", FINALIZER_INTERRUPTED, when], 60, env=env)
    finalized = "finalized\n" if when == "stretch" else ""
    assert (result.returncode, result.stdout) == (130, f"{finalized}interrupted\n"), result
    assert "Exception ignored" not in result.stderr, result.stderr
