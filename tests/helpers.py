"""Assertion helpers shared by the CLI tests."""

from __future__ import annotations

PREFIX = "synth-reduce: error: "


def usage_error(cli, *argv) -> str:
    """Run the CLI (the ``cli`` fixture), expect exit code 2, empty stdout and
    exactly one error line with no traceback; return the message after the prefix."""
    code, out, err = cli(*argv)
    assert code == 2, (code, out, err)
    assert out == ""
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(PREFIX)
    return err[len(PREFIX) : -1]


def synthesize_all(placements, reduce, goal=None, max_steps=5):
    """Every placement's programs for a reduction over ``reduce`` (names) toward
    ``goal`` (default allreduce), in placement order."""
    from synth.synthesis.reduction import Reduction
    from synth.synthesis.search import synthesize_reduction
    from synth.synthesis.semantics import Goal

    goal = Goal.ALLREDUCE if goal is None else goal
    return [synthesize_reduction(Reduction.of(p, reduce, goal), max_steps) for p in placements]


def model(algo="ring", profile=None):
    """A cost model from an algorithm name and an optional profile."""
    from synth.cost import Algorithm, Model

    return Model(Algorithm(algo), profile)


def messages_on_every_rank(size, body) -> list:
    """Run ``body(world)`` on ``size`` in-process ranks (threads,
    ``run_local``); each rank's SynthError message, or None where it passed."""
    from synth.errors import SynthError
    from synth.runtime.backends import run_local

    def catch(world):
        try:
            body(world)
        except SynthError as exc:
            return str(exc)
        return None

    return run_local(size, catch)
