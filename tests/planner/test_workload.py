"""Whole-job placement (synth.planner.workload and ``--workload``): parsing job specs,
ranking placements by the total predicted time, and the CLI's table and JSON."""

from __future__ import annotations

import json
import math

import pytest
from helpers import model, synthesize_all, usage_error

from synth.cost import NetworkProfile, rank
from synth.errors import SynthError
from synth.planner.workload import WorkloadItem, parse_workload, placement_costs
from synth.synthesis.placement import enumerate_placements, parse_axes
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

AXES = parse_axes("dp=4,mp=16")
P2 = ("--topology", "p2-a100", "--axes", "dp=4,mp=16")
JOB = "dp:allreduce:1GiB,mp:allreduce:64MiB*48"


# ================================================================ parsing


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("dp:allreduce:1GiB", [(("dp",), Goal.ALLREDUCE, 2**30, 1)]),
        (JOB, [(("dp",), Goal.ALLREDUCE, 2**30, 1), (("mp",), Goal.ALLREDUCE, 64 * 2**20, 48)]),
        ("dp+mp:allreduce:1M", [(("dp", "mp"), Goal.ALLREDUCE, 2**20, 1)]),
        ("mp+dp:reducescatter:1KB*2", [(("dp", "mp"), Goal.REDUCESCATTER, 1000, 2)]),  # declared order
        (" dp:AllGather:4096 , mp:allreduce:1K*3 ",
         [(("dp",), Goal.ALLGATHER, 4096, 1), (("mp",), Goal.ALLREDUCE, 1024, 3)]),
        ("mp:allreduce:1.5K*1", [(("mp",), Goal.ALLREDUCE, 1536, 1)]),
        ("dp:allreduce:2G,dp:allreduce:1MB", [(("dp",), Goal.ALLREDUCE, 2 * 2**30, 1), (("dp",), Goal.ALLREDUCE, 10**6, 1)]),
    ],
)
def test_parse_workload(spec, expected):
    assert parse_workload(spec, AXES) == tuple(WorkloadItem(*e) for e in expected)


def test_workload_item_text():
    assert str(WorkloadItem(("dp", "mp"), Goal.ALLREDUCE, 2**20, 48)) == "dp+mp:allreduce:1048576*48"
    assert str(WorkloadItem(("dp",), Goal.ALLGATHER, 10)) == "dp:allgather:10"


FORMAT = ("expected AXES:GOAL:SIZE[*REPS], e.g. dp:allreduce:1GiB or mp:allreduce:64MiB*48 "
          "(a sparse all-reduce: dp:sparse-allreduce:256MiB@0.01)")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("zz:allreduce:1M", "--workload 'zz:allreduce:1M': unknown axis 'zz'; declared axes are dp, mp"),
        ("dp+zz:allreduce:1M", "--workload 'dp+zz:allreduce:1M': unknown axis 'zz'; declared axes are dp, mp"),
        ("dp:allsum:1M",
         "--workload 'dp:allsum:1M': unknown collective 'allsum'; use one of allreduce, reducescatter, allgather, "
         "sparse-allreduce"),
        ("dp:allreduce:abc", "--workload 'abc': expected a positive size like 256MiB, 1M (2^20), 64KB (10^3) or 4096"),
        ("dp:allreduce:-1M", "--workload '-1M': expected a positive size like 256MiB, 1M (2^20), 64KB (10^3) or 4096"),
        ("dp:allreduce:1XB", "--workload '1XB': expected a positive size like 256MiB, 1M (2^20), 64KB (10^3) or 4096"),
        ("dp:allreduce:0", "--workload '0': the size must be a whole number of bytes >= 1"),
        ("dp:allreduce:1M*0", "--workload 'dp:allreduce:1M*0': repetitions must be >= 1"),
        ("dp-allreduce-1M", f"--workload 'dp-allreduce-1M': {FORMAT}"),
        ("dp:allreduce", f"--workload 'dp:allreduce': {FORMAT}"),
        ("dp:allreduce:1M*", f"--workload 'dp:allreduce:1M*': {FORMAT}"),
        ("dp:allreduce:1M*x", f"--workload 'dp:allreduce:1M*x': {FORMAT}"),
        ("dp:allreduce:1M,", f"--workload '': {FORMAT}"),
        ("", f"--workload '': {FORMAT}"),
    ],
)
def test_parse_workload_errors(spec, message):
    with pytest.raises(SynthError) as exc:
        parse_workload(spec, AXES)
    assert str(exc.value) == message


# ================================================================ ranking


@pytest.fixture(scope="module")
def p2_placements():
    return enumerate_placements(load_topology("p2-a100"), AXES)


def independent_totals(placements, workload, algo="ring", profile=None, max_steps=5):
    """Sum over items of repetitions x the best predicted time, via rank()."""
    totals, defaults = [], []
    for placement in placements:
        total = default = 0.0
        for item in workload:
            (result,) = synthesize_all([placement], item.reduce_axes, item.goal, max_steps)
            r = rank(result, item.size_bytes, model(algo, profile))
            total += item.repetitions * min(r.predicted_s)
            default += item.repetitions * r.default_s
        totals.append(total)
        defaults.append(default)
    return totals, defaults


@pytest.mark.parametrize(
    "spec, algo",
    [(JOB, "ring"), (JOB, "tree"), ("dp+mp:allreduce:1M,mp:reducescatter:8M*3,dp:allgather:64K*5", "mpi")],
)
def test_rank_placements_orders_by_total(p2_placements, spec, algo):
    workload = parse_workload(spec, AXES)
    costs = placement_costs(p2_placements, workload, model=model(algo))
    totals, defaults = independent_totals(p2_placements, workload, algo)
    assert sorted(c.index for c in costs) == list(range(len(p2_placements)))
    for c in costs:
        assert c.placement == p2_placements[c.index]
        assert math.isclose(c.total_s(workload), totals[c.index], rel_tol=1e-12)
        assert math.isclose(c.default_total_s(workload), defaults[c.index], rel_tol=1e-12)
        assert c.total_s(workload) <= c.default_total_s(workload)
        assert len(c.items) == len(workload)
    assert [c.total_s(workload) for c in costs] == sorted(c.total_s(workload) for c in costs)


def test_whole_job_ranking_differs_from_one_reduction(p2_placements):
    """Alone, reducing dp inside a node wins; with 48 mp reductions per step the
    split placement (both axes half inside, half across) wins the job."""
    dp_only = placement_costs(p2_placements, parse_workload("dp:allreduce:1GiB", AXES))
    assert dp_only[0].placement.matrix == ((1, 4), (4, 4))
    job = placement_costs(p2_placements, parse_workload(JOB, AXES))
    assert [c.placement.matrix for c in job] == [((2, 2), (2, 8)), ((1, 4), (4, 4)), ((4, 1), (1, 16))]


def test_rank_placements_uses_the_profile(p2_placements):
    p2 = load_topology("p2-a100")
    fast = NetworkProfile(p2.name, p2.level_names, (80.0, 270.0), (5.0, 1.0))
    workload = parse_workload(JOB, AXES)
    costs = placement_costs(p2_placements, workload, model=model("ring", fast))
    totals, _ = independent_totals(p2_placements, workload, profile=fast)
    for c in costs:
        assert math.isclose(c.total_s(workload), totals[c.index], rel_tol=1e-12)
    prior = {c.index: c.total_s(workload) for c in placement_costs(p2_placements, workload)}
    # every placement sends one of the reductions across nodes: a 10x faster NIC helps all
    assert all(c.total_s(workload) < prior[c.index] for c in costs)


# ================================================================ CLI


def test_workload_table(cli, p2_placements):
    # NCCL's constants (--profile prior): the reasoning below is by bytes moved at the protocols' payload rates
    code, out, err = cli(*P2, "--workload", JOB, "--no-verify", "--profile", "prior")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "topology p2-a100 (64 devices); axes dp=4 mp=16"
    assert lines[1] == "workload per step: dp allreduce 1 GiB, mp allreduce 64 MiB x48"
    assert lines[2] == "NCCL 2.27.7 model, topology's numbers as priors"
    assert lines[3].startswith("3 placement(s) ranked in ")
    header = lines[5].split()
    assert header[:5] == ["rank", "#", "matrix", "total", "with"]
    rows = lines[7:]
    assert len(rows) == 3
    assert rows[0].split()[:4] == ["1", "1", "dp:2,2", "/"]
    # dp (1 GiB) keeps NCCL's 2-node tree: at this size Simple, which puts S/2 per flow on the NICs as BlueConnect
    # does, and BlueConnect adds two steps inside the nodes; mp (64 MiB) takes BlueConnect
    assert ("dp: AllReduce(root, inside) | mp: ReduceScatter(node, inside) ; AllReduce(node, parallel(root)) ; "
            "AllGather(node, inside)") in rows[0]
    assert rows[2].split()[:3] == ["3", "2", "dp:4,1"]
    assert "dp: AllReduce(root, inside) | mp: AllReduce(root, inside)" in rows[2]


def test_workload_json(cli, p2_placements):
    code, out, err = cli(*P2, "--workload", JOB, "--no-verify", "--algo", "tree", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["workload"] == [
        {"reduce": ["dp"], "collective": "allreduce", "size_bytes": 2**30, "repetitions": 1},
        {"reduce": ["mp"], "collective": "allreduce", "size_bytes": 64 * 2**20, "repetitions": 48},
    ]
    assert doc["model"] == {"algo": "tree", "profile": None}
    assert doc["topology"]["name"] == "p2-a100" and doc["axes"] == [{"name": "dp", "size": 4}, {"name": "mp", "size": 16}]
    workload = parse_workload(JOB, AXES)
    totals, defaults = independent_totals(p2_placements, workload, "tree")
    placements = doc["placements"]
    assert [p["rank"] for p in placements] == [0, 1, 2]
    assert sorted(p["index"] for p in placements) == [0, 1, 2]
    assert [p["total_predicted_s"] for p in placements] == sorted(p["total_predicted_s"] for p in placements)
    for p in placements:
        assert p["matrix"] == [list(r) for r in p2_placements[p["index"]].matrix]
        assert p["mesh"] == p2_placements[p["index"]].mesh.tolist()
        assert p["total_predicted_s"] == pytest.approx(totals[p["index"]], rel=1e-12)
        assert p["default_total_predicted_s"] == pytest.approx(defaults[p["index"]], rel=1e-12)
        assert p["total_predicted_s"] == pytest.approx(
            sum(i["repetitions"] * i["best_predicted_s"] for i in p["items"]), rel=1e-12)
        for item, spec in zip(p["items"], doc["workload"]):
            assert {k: item[k] for k in spec} == spec
            assert item["best_program"]["predicted_s"] == item["best_predicted_s"] <= item["default_predicted_s"]
            assert "verified" not in item["best_program"]


def test_workload_programs_are_verified_by_default(cli):
    code, out, err = cli("--topology", "testbed-2x4", "--axes", "dp=4,mp=2", "--workload",
                         "dp:allreduce:1M,mp:reducescatter:64K*4", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert len(doc["placements"]) == len(enumerate_placements(load_topology("testbed-2x4"), parse_axes("dp=4,mp=2")))
    for p in doc["placements"]:
        for item in p["items"]:
            assert item["best_program"]["verified"]["numpy_elements"] > 0
    code, out, err = cli("--topology", "testbed-2x4", "--axes", "dp=4,mp=2", "--workload", "dp:allreduce:1M")
    assert code == 0 and "those programs verified (numpy reference + z3)" in out


@pytest.mark.parametrize(
    "extra",
    [("--reduce", "dp"), ("--reduce", "mp"), ("--collective", "reducescatter"), ("--size", "1M")],
)
def test_workload_replaces_reduce_collective_and_size(cli, extra):
    assert usage_error(cli, *P2, "--workload", JOB, *extra) == (
        "--workload replaces --reduce, --collective, --size and --density (a sparse item takes its density after "
        "its size: dp:sparse-allreduce:256MiB@0.01); give one or the other"
    )


@pytest.mark.parametrize("extra", [("--size", "256MiB"), ("--collective", "allreduce")])
def test_workload_with_an_explicit_default_size_or_collective(cli, extra):
    assert usage_error(cli, *P2, "--workload", JOB, *extra) == (
        "--workload replaces --reduce, --collective, --size and --density (a sparse item takes its density after "
        "its size: dp:sparse-allreduce:256MiB@0.01); give one or the other"
    )


@pytest.mark.parametrize(
    "spec, message",
    [("zz:allreduce:1M", "--workload 'zz:allreduce:1M': unknown axis 'zz'; declared axes are dp, mp"),
     ("dp:allreduce:0", "--workload '0': the size must be a whole number of bytes >= 1"),
     ("dp", f"--workload 'dp': {FORMAT}")],
)
def test_workload_errors_in_the_cli(cli, spec, message):
    assert usage_error(cli, *P2, "--workload", spec) == message
