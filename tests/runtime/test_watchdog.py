"""``bench --timeout S``: a rank that stops making progress (here one that
never reaches its first program run, as a SIGSTOPped rank would) ends the whole
job after S seconds with one line and exit code 124, instead of leaving the
others waiting in a collective forever."""

from __future__ import annotations

import textwrap

import pytest
from helpers import usage_error
from test_runtime import mpirun

from synth.runtime.watchdog import EXIT_TIMEOUT, parse_timeout

STALLED = textwrap.dedent("""
    import sys, time
    from synth.runtime import executor
    from synth.cli import main

    real = executor._Runner.__call__

    def stalled(self, buffer):
        if self.world.rank == 1:
            time.sleep(3600)  # never reaches the collective, like a stopped rank
        return real(self, buffer)

    executor._Runner.__call__ = stalled
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.mpi
def test_a_stalled_rank_ends_the_job_after_the_timeout(tmp_path):
    script = tmp_path / "stalled.py"
    script.write_text(STALLED)
    done = mpirun(2, str(script), "bench", "--topology", "testbed-2x4", "--scale", "node=1,rank=2", "--axes",
                  "dp=2", "--sizes", "1K", "--iters", "2", "--warmup", "1", "--top", "1", "--timeout", "3",
                  timeout_s=120)
    assert done.returncode == EXIT_TIMEOUT, done.stdout + done.stderr
    assert ("synth-reduce: error: no progress for 3 s (--timeout 3): a rank is stalled (stopped, or waiting for one "
            "that is); ending the job") in done.stderr


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "soon", "1e9"])
def test_a_timeout_must_be_some_seconds(cli, text):
    assert usage_error(cli, "bench", "--topology", "testbed-2x4", "--axes", "dp=8", "--timeout", text) == (
        f"--timeout {text}: give the seconds without progress after which the job is ended, a number > 0 and at "
        "most 604800 (a week)")


def test_parse_timeout():
    assert parse_timeout(None) is None and parse_timeout("2.5") == 2.5


@pytest.mark.parametrize("option", ["--iters", "--warmup"])
def test_iterations_are_bounded(cli, option):
    assert usage_error(cli, "bench", "--topology", "testbed-2x4", "--axes", "dp=8", option, "9" * 20) == (
        f"{option} {'9' * 20}: at most 1,000,000")
    assert "invalid int value: 'x'" in usage_error(cli, "bench", "--topology", "testbed-2x4", "--axes", "dp=8",
                                                    option, "x")
