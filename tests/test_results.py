"""One shape for every collective's results (synth.api.results) and the one
table printer of the main command (synth.cli.solve.print_ranked)."""

from __future__ import annotations

import pytest

import synth
from synth.api import COLLECTIVE_MODULES
from synth.api.results import Column, RankedPlacement, RankedSolution
from synth.cli.solve import print_ranked


def test_the_printer_aligns_fixed_and_fitted_columns(capsys):
    columns = (Column("n", width=2, gap=""), Column("name", "<", 6, fit=True, gap="  "), Column("t", width=4),
               Column("text", "<", gap="  "))
    print_ranked(columns, [("1", "a-long-name", "1.5", "x ; y"), ("", "", "2.25", "z"), ("10", "b", "", "")])
    assert capsys.readouterr().out.splitlines() == [
        " n  name           t  text",
        "-" * 26,
        " 1  a-long-name  1.5  x ; y",
        "                2.25  z",
        "10  b",
    ]


SOLVED = {
    "reduction": lambda: synth.solve("testbed-2x4", {"dp": 4, "mp": 2}, reduce="dp", verify=False, top=2),
    "sparse": lambda: synth.solve_sparse("testbed-2x4", {"dp": 4, "mp": 2}, reduce="dp", density=0.1, verify=False),
    "alltoall": lambda: synth.solve_alltoall("testbed-2x4", {"ep": 4, "mp": 2}, verify=False),
    "workload": lambda: synth.rank_placements("testbed-2x4", {"dp": 4, "mp": 2},
                                              "dp:allreduce:1GiB,mp:allreduce:64MiB", verify=False),
}


@pytest.mark.parametrize("name", sorted(SOLVED))
def test_every_collective_answers_in_the_one_shape(name):
    solution = SOLVED[name]()
    assert isinstance(solution, RankedSolution)
    assert all(isinstance(p, RankedPlacement) for p in solution.placements)
    times = [p.best_s for p in solution.by_speed]
    assert times == sorted(times) and solution.best is solution.by_speed[0]
    assert sorted(p.index for p in solution.by_speed) == sorted(p.index for p in solution.placements)
    columns, rows = solution.table()
    assert [c.header for c in columns[:2]] == ["rank", "#"]
    firsts = [r for r in rows if r[0]]
    assert [(r[0], r[1]) for r in firsts] == [(str(n + 1), str(p.index)) for n, p in enumerate(solution.by_speed)]
    assert all(len(r) == len(columns) for r in rows)
    assert [r[2] for r in firsts] == [p.placement.matrix_text() if hasattr(p, "placement") else
                                      p.groups.placement.matrix_text() if hasattr(p, "groups") else
                                      p.reduction.placement.matrix_text() for p in solution.by_speed]


def test_every_registered_module_is_exported_by_the_package():
    import synth.api

    assert {m.__name__.rsplit(".", 1)[1] for m in COLLECTIVE_MODULES} >= set(SOLVED)
    for module in COLLECTIVE_MODULES:
        assert module.__all__ and all(getattr(synth.api, n) is getattr(module, n) for n in module.__all__)
