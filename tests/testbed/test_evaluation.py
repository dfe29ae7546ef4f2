"""The measured evaluation (synth.testbed.evaluation, scripts/evaluation_report.py): the
case list and the measures docs/results.md reports, on hand-made records, and the
report script run on measurements of a known model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from processes import limit_s

from synth.synthesis.problem import ProblemSpec
from synth.testbed import evaluation as rep

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
run = rep  # the case list lives beside the measures


def test_cases_cover_every_shape_and_reduction():
    eight = run.cases(8)
    assert eight == [
        ("dp=8", "dp"),
        ("dp=4,mp=2", "dp"), ("dp=4,mp=2", "mp"),
        ("dp=2,mp=2,pp=2", "dp"), ("dp=2,mp=2,pp=2", "mp"), ("dp=2,mp=2,pp=2", "pp"),
        ("dp=2,mp=2,pp=2", "dp,mp"), ("dp=2,mp=2,pp=2", "dp,pp"), ("dp=2,mp=2,pp=2", "mp,pp"),
    ]
    assert run.cases(8, quick=True) == eight[:3]
    assert [a for a, _ in run.cases(16)].count("dp=4,mp=2,pp=2") == 6


@pytest.mark.parametrize("cluster", run.CLUSTERS)
def test_every_case_is_a_valid_problem_on_its_cluster(cluster):
    from synth.topology import load_topology

    for axes, reduce in run.cases(load_topology(cluster).num_devices):
        assert ProblemSpec(cluster, axes, reduce).build().placements()


def test_spans_counts_the_outer_levels_a_reduction_crosses():
    # rows: axes dp, mp; columns: rack, node, rank
    matrix = ((2, 1, 2), (1, 2, 1))
    assert rep.spans(matrix, ["dp", "mp"], ["dp"]) == 1  # across racks only
    assert rep.spans(matrix, ["dp", "mp"], ["mp"]) == 1  # across nodes only
    assert rep.spans(matrix, ["dp", "mp"], ["dp", "mp"]) == 2
    assert rep.spans(((1, 1, 4), (2, 2, 1)), ["dp", "mp"], ["dp"]) == 0  # inside a node


def _rec(matrix, program, default, median_s, size=1024, reduce="dp", spans=1):
    return rep.ProgramTime("c", "flat", "dp=4,mp=2", matrix, reduce, program, default, size, median_s,
                      median_s * 0.9, median_s * 1.2, 0, spans)


def test_placement_spread_compares_the_default_across_placements():
    a, b = ((2, 2), (1, 2)), ((1, 4), (2, 1))
    records = [
        _rec(a, "AR", True, 2.0), _rec(a, "X", False, 0.5),  # a synthesized program does not count
        _rec(b, "AR", True, 30.0, spans=0),
        _rec(a, "AR", True, 5.0, size=2048),  # one placement only at this size: no spread
    ]
    spreads = rep.placement_spreads(records)
    assert len(spreads) == 1
    assert spreads[0].ratio == 15.0 and spreads[0].placements == 2
    # no spread when no placement crosses nodes
    assert rep.placement_spreads([_rec(a, "AR", True, 1.0, spans=0), _rec(b, "AR", True, 3.0, spans=0)]) == []


def test_case_results_take_the_fastest_synthesized_program_of_cross_node_cases():
    a = ((2, 2), (1, 2))
    records = [_rec(a, "AR", True, 3.0), _rec(a, "X", False, 2.0), _rec(a, "Y", False, 1.5),
               _rec(((1, 4), (2, 1)), "AR", True, 1.0, spans=0), _rec(((1, 4), (2, 1)), "Z", False, 0.1, spans=0)]
    (result,) = rep.case_results(records)
    assert result.best_program == "Y" and result.speedup == 2.0 and result.programs == 3


def test_distribution_and_top_k():
    d = rep.distribution([0.5, 1.0, 2.0, 2.5])
    assert (d.cases, d.share_above_1, d.mean, d.median, d.max, d.min) == (4, 0.5, 1.5, 1.5, 2.5, 0.5)
    assert math.isnan(rep.distribution([]).mean)
    ranks = [rep.Ranking(("k", i), programs, position, None, True)
             for i, (programs, position) in enumerate([(3, 0), (3, 2), (12, 4), (12, 0)])]
    assert rep.top_k(ranks, 1) == (0.5, 4)
    assert rep.top_k(ranks, 3) == (0.75, 4)
    assert rep.top_k(ranks, 3, more_than_k=True) == (0.5, 2)  # the 3-program cases are trivial hits


def test_rankings_position_and_pick_against_the_default():
    records = [_rec(((2, 2), (1, 2)), name, name == "AR", t) for name, t in (("AR", 4.0), ("X", 2.0), ("Y", 3.0))]
    p = rep.Predicted(records, np.array([4.0, 2.0, 3.0]), np.zeros(3), np.zeros(3), None)
    (r,) = rep.rankings(p, np.array([1.0, 3.0, 2.0]))  # predicts AR < Y < X
    assert r.position == 2  # the measured fastest (X) is predicted last
    assert r.pick_over_default == 1.0  # the pick is the default itself
    (r,) = rep.rankings(p, np.array([3.0, 2.0, 1.0]))  # predicts Y first
    assert r.position == 1 and r.pick_over_default == 0.75 and r.pick_over_best == 1.5


@pytest.mark.slow
def test_report_on_measurements_of_a_known_model(tmp_path):
    """Records whose times the prior model itself predicts: the report finds the
    simulator exact (top-1 100%, no error) and the speedups of the data."""
    pytest.importorskip("matplotlib")
    from synth.cost import Algorithm, Model, rank
    from synth.synthesis.language import format_program
    from synth.synthesis.search import synthesize_reduction
    from synth.topology import load_topology

    topology = load_topology("testbed-2x4")
    lines = []
    for axes, reduce in (("dp=8", "dp"), ("dp=4,mp=2", "dp"), ("dp=4,mp=2", "mp")):
        problem = ProblemSpec("testbed-2x4", axes, reduce).build()
        results = [synthesize_reduction(problem.reduction(p), problem.max_steps) for p in problem.placements()]
        for result in results:
            for size in (4096, 65536, 1 << 20, 4 << 20, 16 << 20):
                ranked = rank(result, size, Model(Algorithm.MPI))
                seen = set()
                for j, t in zip(ranked.order[:6], ranked.predicted_s):
                    if round(t, 9) in seen:
                        continue  # programs of equal cost: either is the fastest, keep one
                    seen.add(round(t, 9))
                    lines.append(json.dumps({
                        "schema": "synth-reduce/measurement", "version": 1, "topology": topology.to_dict(),
                        "axes": [{"name": a.name, "size": a.size} for a in problem.axes],
                        "matrix": [list(r) for r in result.placement.matrix], "reduce": [reduce],
                        "collective": "allreduce", "program": format_program(result.programs[j]),
                        "is_default": j == ranked.default_index, "backend": "mpi", "algo": None,
                        "times_s": [t] * 3, "size_bytes": size, "median_s": t, "min_s": t, "max_s": t, "wrong": 0}))
    data = tmp_path / "data"
    data.mkdir()
    (data / "testbed-2x4-flat.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "results.md"
    subprocess.run([sys.executable, str(SCRIPTS / "evaluation_report.py"), "--data", str(data), "--out", str(out)],
                   check=True, timeout=limit_s(300))
    text = out.read_text()
    parsed = [json.loads(x) for x in lines]
    cases = len({(repr(d["matrix"]), d["reduce"][0], d["size_bytes"]) for d in parsed})
    assert f"| top-1 >= 80% (held-out) | 100% of {cases} | met |" in text
    assert "| testbed-2x4 | " + str(len(lines)) + " | 0% | 0% |" in text
    for name in ("placement_spread.png", "speedup.png", "predicted_vs_measured.png", "topk.png"):
        assert (tmp_path / "results" / name).stat().st_size > 1000


def test_repeats_compare_one_program_on_the_same_ranks_across_cases(tmp_path):
    from synth.topology import load_topology

    topology = load_topology("testbed-2x4").to_dict()

    def line(axes, matrix, reduce, median_s):
        return json.dumps({"schema": "synth-reduce/measurement", "version": 1,
                           "topology": topology, "axes": axes, "matrix": matrix, "reduce": reduce,
                           "collective": "allreduce", "program": "AllReduce(root, inside)", "backend": "mpi",
                           "size_bytes": 1024, "median_s": median_s})

    # dp=8 over everything and dp,mp of dp=4,mp=2 laid out alike: the same 8 ranks in the same order
    path = tmp_path / "testbed-2x4-flat.jsonl"
    path.write_text("\n".join([
        line([{"name": "dp", "size": 8}], [[2, 4]], ["dp"], 2.0),
        line([{"name": "dp", "size": 4}, {"name": "mp", "size": 2}], [[2, 2], [1, 2]], ["dp", "mp"], 3.0),
        line([{"name": "dp", "size": 4}, {"name": "mp", "size": 2}], [[2, 2], [1, 2]], ["dp"], 5.0),
    ]) + "\n")
    from synth.cost.fit import load_samples

    assert rep.repeats(load_samples(path)[1]) == [1.5]


def test_the_crossover_density_is_interpolated_in_log_density():
    from synth.testbed.evaluation import crossover_density

    # ratio 2 at 1%, 0.5 at 10%: 1 is two thirds of the way, in log density: 0.01 x 10^(2/3)
    assert crossover_density([(0.01, 2.0), (0.1, 0.5)]) == pytest.approx(0.01 * 10 ** (2 / 3))
    assert crossover_density([(0.01, 2.0), (0.05, 1.5), (0.1, 1.0), (0.2, 0.5)]) == pytest.approx(0.05 * 2 ** 1.0)
    assert crossover_density([(0.01, 3.0), (0.1, 1.5)]) is None  # sparse faster everywhere
    assert crossover_density([(0.01, 0.9), (0.1, 0.5)]) is None  # slower everywhere


def test_the_sparse_section_shows_each_density_with_the_best_programs_rank_and_the_crossovers():
    sys.path.insert(0, str(SCRIPTS))
    from evaluation_report import sparse_section

    def record(density, dense_s, sparse_s, rank):
        return {"setting": "one box", "date": "2026-11-27", "size": "64M", "encoding": "coo", "density": density,
                "dense_median_s": dense_s, "sparse_median_s": sparse_s, "program": "P", "predicted_rank": rank,
                "top": 8, "predicted_crossover": 0.154}

    lines: list[str] = []
    sparse_section(lines.append, [record(0.1, 0.3, 0.6, 1), record(0.01, 0.3, 0.1, 6)])
    text = "\n".join(lines)
    assert "| one box | 2026-11-27 | 64M | coo | 0.01 | 300.0 ms | 100.0 ms | 3.00x | 6 of 8 | `P` |" in text
    assert "| one box | 2026-11-27 | 64M | coo | 0.1 | 300.0 ms | 600.0 ms | 0.50x | 1 of 8 | `P` |" in text
    # ratio 3 at 1%, 0.5 at 10%: 1 is (3 - 1) / (3 - 0.5) of the way, in log density
    assert f"| one box | {0.01 * 10 ** 0.8:.3g} | 0.154 |" in text
