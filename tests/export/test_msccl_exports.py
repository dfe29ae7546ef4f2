"""The MSCCL files the export writes run on the executor: every file of the
shipped topologies and of the P2 configurations passes the independent
checker, whose flow-control interpreter runs each at every size of its range
(pieces per step as the kernel cuts them, slots per protocol); none writes
LL128 for a group that crosses nodes without a stated NIC path; steps use
several channels where NCCL's ring has several. The fast cases run always;
the sweep over every topology and every P2 program is marked slow."""

from __future__ import annotations

import glob
import os

import pytest

from synth.api import solve
from synth.cost.nccl import choose, comm_of, ring_graph
from synth.export.msccl import plan_files
from synth.export.msccl_check import check_algorithm
from synth.export.msccl_flow import chunk_effective_bytes
from synth.plan import Plan
from synth.synthesis.language import Collective
from synth.synthesis.lowering import lower
from synth.synthesis.placement import enumerate_placements, parse_axes
from synth.synthesis.reduction import Reduction
from synth.synthesis.search import synthesize_reduction
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

GOALS = ("allreduce", "reducescatter", "allgather")
TOPOLOGIES = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(os.path.dirname(__file__), "..", "..",
                                                                            "topologies", "*.yaml")))
MOST_DEVICES = 64  # larger topologies are scaled down at their outermost level (a ring of 128 exceeds 64 steps)


def _topology(name: str):
    top = load_topology(name)
    if top.num_devices > MOST_DEVICES:
        top = top.scaled({top.level_names[0]: max(1, MOST_DEVICES * top.counts[0] // top.num_devices)})
    return top


def _check_files(files) -> None:
    """Each file passes the checker (data in both modes, flow at every size of
    its range); the ranges of a reduction's files tile 0..unbounded; no
    cross-node LL128 without a stated NIC path."""
    assert files
    for f in files:
        a = f.algorithm
        result = check_algorithm(a.xml(), f.name)
        assert result.flow_sizes and result.flow_sizes[0] == max(1, a.min_bytes)
        members = tuple(int(d) for d in f.reduction.reduction_groups[0])
        comm = comm_of(f.reduction.topology, members)
        assert a.proto != "LL128" or comm.nodes == 1 or comm.nic_path is not None, f.name
        assert a.nchunksperloop % a.ngpus == 0 and a.instances <= a.pieces
    ordered = sorted(files, key=lambda f: f.algorithm.min_bytes)
    assert ordered[0].algorithm.min_bytes == 0 and ordered[-1].algorithm.max_bytes == 0
    for a, b in zip(ordered, ordered[1:]):
        assert b.algorithm.min_bytes == a.algorithm.max_bytes + 1


def _plan_of_main_command(name: str, goal: str) -> Plan:
    top = _topology(name)
    return solve(top, f"dp={top.num_devices}", goal=goal, verify=False, top=1).plan()


@pytest.mark.parametrize("name,goal", [("testbed-2x2x2", g) for g in GOALS] + [("p4de", "allreduce")])
def test_exports_of_the_main_command_run_at_every_size(name, goal):
    _check_files(plan_files(_plan_of_main_command(name, goal)))


def test_the_p2_a100_mp_export_that_hung_runs_at_every_size():
    """p2-a100 dp=4,mp=16 reducing mp, placement 1: its Simple all-reduce sent
    messages of several chunks first in a ring and hung above 16-128 MiB."""
    placement = enumerate_placements(load_topology("p2-a100"), parse_axes("dp=4,mp=16"))[1]
    reduction = Reduction.of(placement, "mp", Goal.ALLREDUCE)
    program = synthesize_reduction(reduction, 5).programs[0]
    files = plan_files(Plan.single(lower(program, reduction), reduction))
    _check_files(files)
    largest = max(files, key=lambda f: f.algorithm.min_bytes).algorithm
    assert largest.proto == "Simple" and largest.max_bytes == 0
    # sizes up to unbounded: the last one interpreted has one chunk per piece (a chunk over 2 MiB) and two iterations
    per_chunk = -(-check_algorithm(largest.xml()).flow_sizes[-1] // largest.nchunksperloop)
    assert per_chunk > chunk_effective_bytes("Simple") == 2 * 2**20


def test_steps_use_several_channels_where_nccls_ring_has_them():
    """p4de's all-reduce over 16 GPUs on 2 nodes: NCCL's ring graph there has
    several channels, so a file of one channel per step would get a fraction
    of the ring's bandwidth; the large-size file spreads each step over more."""
    top = load_topology("p4de")
    plan = _plan_of_main_command("p4de", "allreduce")
    members = tuple(int(d) for d in plan.reductions[0].reduction.reduction_groups[0])
    assert ring_graph(comm_of(top, members)).channels > 1
    largest = max(plan_files(plan), key=lambda f: f.algorithm.min_bytes).algorithm
    assert largest.instances > 1
    assert {tb.chan for tbs in largest.thread_blocks for tb in tbs} == set(range(largest.nchannels))


def test_no_cross_node_ll128_where_the_model_would_pick_it():
    """dgx-h100 over 2 nodes: NCCL's ring model picks LL128 for mid sizes
    (the topology states no NIC path); the export writes LL or Simple there."""
    top = load_topology("dgx-h100").scaled({"node": 2})
    plan = solve(top, "dp=16", verify=False, top=1).plan()
    comm = comm_of(top, tuple(int(d) for d in plan.reductions[0].reduction.reduction_groups[0]))
    assert comm.nodes == 2 and comm.nic_path is None
    assert "LL128" in {choose(comm, Collective.ALLREDUCE, float(1 << k), ("ring",)).protocol for k in range(35)}
    files = plan_files(plan)
    _check_files(files)
    assert {f.algorithm.proto for f in files} <= {"LL", "Simple"}


@pytest.mark.slow
@pytest.mark.sweep
@pytest.mark.parametrize("goal", GOALS)
@pytest.mark.parametrize("name", TOPOLOGIES)
def test_every_shipped_topology_exports_files_that_run(name, goal):
    _check_files(plan_files(_plan_of_main_command(name, goal)))


@pytest.mark.slow
@pytest.mark.sweep
@pytest.mark.parametrize("topology,axes,reduce", [("p2-a100", "dp=4,mp=16", "dp"), ("p2-a100", "dp=4,mp=16", "mp"),
                                                  ("p2-v100", "dp=4,mp=8", "dp"), ("p2-v100", "dp=4,mp=8", "mp")])
def test_every_listed_p2_program_exports_files_that_run(topology, axes, reduce):
    """Every program the main command lists (at most 5 steps) of every
    placement, all-reduce, as the export writes it over every size."""
    for placement in enumerate_placements(load_topology(topology), parse_axes(axes)):
        reduction = Reduction.of(placement, reduce, Goal.ALLREDUCE)
        for program in synthesize_reduction(reduction, 5).programs:
            _check_files(plan_files(Plan.single(lower(program, reduction), reduction)))


def test_the_gpu_check_runs_msccl_where_pieces_are_one_chunk():
    """scripts/gpu_check.py's MSCCL step: 64 MiB, and a size of at least
    256 MiB where the executor cuts every step into one-chunk pieces and
    loops more than once (where a ring that fills its connections hangs)."""
    import importlib.util
    from pathlib import Path

    from synth.export.msccl_flow import iterations, max_allowed_count

    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).parents[2] / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    assert gpu_check.SIMPLE_CHUNK_BYTES == chunk_effective_bytes("Simple")
    for chunks in (8, 64, 512):
        small, large = gpu_check.msccl_sizes(chunks)
        assert small == 64 * 2**20 and large >= 256 * 2**20
        assert max_allowed_count("Simple", large, chunks) == 1 and iterations("Simple", large, chunks) == 2
