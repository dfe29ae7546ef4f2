"""Progress on stderr (issue 12, item 8): a status line rewritten in place on
a terminal; when stderr is not a terminal (CI, batch logs), a plain line at
most every few seconds, none for short runs. Time is a fake clock here."""

from __future__ import annotations

import io

from synth.cli.solve import ProgressLine
from synth.synthesis.search import clear_cache


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_every_interval_and_short_runs_print_nothing():
    clock, log = Clock(), io.StringIO()
    progress = ProgressLine(log, interval_s=5.0, clock=clock)
    for second, message in [(0, "a"), (1, "b"), (4.9, "c"), (5.0, "d"), (6, "e"), (9.9, "f"), (10.1, "g")]:
        clock.now = 100.0 + second
        progress(message)
    progress("")
    assert log.getvalue() == "d\ng\n"
    quiet = io.StringIO()
    short = ProgressLine(quiet, interval_s=5.0, clock=clock)
    short("searching")
    short("")
    assert quiet.getvalue() == ""


def test_a_terminal_gets_one_line_rewritten_in_place():
    clock, terminal = Clock(), Terminal()
    progress = ProgressLine(terminal, clock=clock)
    progress("synthesizing placement 1/2")
    progress("verifying placement 1/2")
    progress("")
    assert terminal.getvalue() == ("\rsynthesizing placement 1/2\033[K\rverifying placement 1/2\033[K\r\033[K")


def test_a_long_synthesis_reports_its_search_to_a_log():
    """solve's progress reaches the log: the placements and, inside a search,
    its steps and states (here every call of the fake clock is 1 s)."""
    import synth

    clear_cache()
    clock, log = Clock(), io.StringIO()

    def tick() -> float:
        clock.now += 1.0
        return clock.now

    progress = ProgressLine(log, interval_s=5.0, clock=tick)
    synth.solve("rack", {"x": 64}, top=1, verify=False, progress=progress)
    lines = log.getvalue().splitlines()
    assert any(line.startswith("searching 2x4x2x4: step ") and line.endswith(" states") for line in lines)
    assert all(line.startswith(("synthesizing placement", "searching", "listing placement")) for line in lines)
    clear_cache()
