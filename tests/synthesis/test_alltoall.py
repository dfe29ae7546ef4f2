"""All-to-all as a synthesizer goal (issue 27, item 2): the language, the
search checked against the explicit rule on labelled blocks, the proof of each
program, the per-peer cost pinned to NCCL's measurement, the hierarchical
decomposition's price, the planner's choice and the command line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import usage_error

from synth.cost import Model, alltoall_s
from synth.cost.alltoall import NCCL_PEER_S, peer_seconds, program_alltoalls, program_seconds
from synth.cost.model import Algorithm
from synth.errors import SynthError
from synth.synthesis.alltoall import (
    AllToAllProgram,
    Exchange,
    check_alltoall,
    exchange_groupings,
    exchange_step,
    execute_alltoall,
    format_alltoall,
    initial_blocks,
    is_alltoall_done,
    parse_alltoall,
    synthesize_alltoall,
)
from synth.synthesis.language import Form
from synth.synthesis.placement import Axis, Placement
from synth.synthesis.problem import make_problem
from synth.synthesis.semantics import Hierarchy, distinct_groupings
from synth.topology import load_topology

DATA = Path(__file__).resolve().parents[2] / "data" / "nccl"


def _hierarchy(*sizes: int) -> Hierarchy:
    return Hierarchy(tuple("abcdef"[: len(sizes)]), sizes)


def _explicit_programs(hierarchy: Hierarchy, max_steps: int) -> set[tuple[Exchange, ...]]:
    """Every sequence of the language's groupings, up to ``max_steps``, whose
    steps are all valid under the explicit rule on labelled blocks and that ends
    with the goal: a depth-first walk that stops at the first invalid step."""
    groupings = exchange_groupings(hierarchy)
    found: set[tuple[Exchange, ...]] = set()

    def walk(sources, destinations, path):
        if path and is_alltoall_done(sources, destinations):
            found.add(path)
        if len(path) == max_steps:
            return
        for g in groupings:
            outcome = exchange_step(hierarchy, sources, destinations, g.groups)
            if not isinstance(outcome, str):
                walk(*outcome, path + (g.exchange,))

    walk(*initial_blocks(hierarchy.k), ())
    return found


@pytest.mark.parametrize("sizes", [(2,), (4,), (2, 2), (2, 3), (3, 2), (2, 2, 2), (2, 3, 2), (2, 2, 2, 2)])
def test_the_search_finds_exactly_the_programs_the_explicit_rule_accepts(sizes):
    """The search works on sets of settled levels; the reference moves
    explicit (source, destination) labels and checks the equal-split
    precondition per group. Over every sequence of groupings up to one step
    more than the depth, both give the same programs, and each is proved."""
    hierarchy = _hierarchy(*sizes)
    limit = len(sizes) + 1
    searched = synthesize_alltoall(hierarchy, limit).programs
    assert len(set(searched)) == len(searched)
    assert {p.steps for p in searched} == _explicit_programs(hierarchy, limit)
    assert searched[0] == AllToAllProgram((Exchange("root"),))  # the one-call all-to-all first
    for program in searched:
        assert check_alltoall(program, hierarchy) == hierarchy.k ** 2
    assert [len(p) for p in searched] == sorted(len(p) for p in searched)


def test_program_counts_are_the_ordered_partitions_into_contiguous_levels():
    """A valid program settles disjoint runs of adjacent levels that cover the
    hierarchy, in any order: 1 program on one level, 3 on two, 11 on three
    ([abc]; [a,bc] and [ab,c] both ways; [a,b,c] in 6 orders), and on four the
    sum over the 8 ways to cut it into runs of (runs)! orders = 49."""
    from itertools import product
    from math import factorial

    counts = [len(synthesize_alltoall(_hierarchy(*([2] * depth)), depth).programs) for depth in (1, 2, 3, 4)]
    assert counts == [1, 3, 11, sum(factorial(1 + sum(cuts)) for cuts in product((0, 1), repeat=3))] == [1, 3, 11, 49]
    assert synthesize_alltoall(_hierarchy(2, 2, 2), 2).programs == tuple(
        p for p in synthesize_alltoall(_hierarchy(2, 2, 2), 3).programs if len(p) <= 2)


def test_master_steps_only_lengthen_programs_the_language_has():
    """The language leaves out master forms (every step is an all-to-all on
    every device). Under the explicit rule a master step can still begin a
    program (a partial exchange among the master devices); on these
    hierarchies every such program is one step longer than a program the
    search lists: the same steps without the master step."""
    led = 0
    for sizes in ((2, 2), (2, 2, 2)):
        hierarchy = _hierarchy(*sizes)
        listed = {p.steps for p in synthesize_alltoall(hierarchy, len(sizes) + 1).programs}
        others = exchange_groupings(hierarchy)
        for master in (g for g in distinct_groupings(hierarchy) if g.form is Form.MASTER):
            outcome = exchange_step(hierarchy, *initial_blocks(hierarchy.k), master.groups)
            if isinstance(outcome, str):
                continue
            frontier = [(outcome, ())]
            for _ in range(len(sizes) + 1):
                frontier = [(o, path + (g.exchange,)) for state, path in frontier for g in others
                            if not isinstance(o := exchange_step(hierarchy, *state, g.groups), str)]
                for state, path in frontier:
                    if is_alltoall_done(*state):
                        led += 1
                        assert path in listed, path
    assert led >= 10


def test_the_proof_rejects_wrong_programs_with_the_reason():
    hierarchy = Hierarchy(("node", "gpu"), (2, 4))
    with pytest.raises(SynthError, match=r"device 0 does not end with one block from every device"):
        check_alltoall(parse_alltoall("AllToAll(node, inside)"), hierarchy)
    with pytest.raises(SynthError, match=r"step 2 AllToAll\(node, inside\): not valid: group \(0, 1, 2, 3\): members would send nothing"):
        check_alltoall(parse_alltoall("AllToAll(node, inside) ; AllToAll(node, inside)"), hierarchy)
    with pytest.raises(SynthError, match=r"step 2 AllToAll\(root, inside\): not valid: .* between 0 and 4 blocks"):
        check_alltoall(parse_alltoall("AllToAll(node, inside) ; AllToAll(root, inside)"), hierarchy)
    with pytest.raises(SynthError, match=r"level 'rack' is not in the synthesis hierarchy \(root, node, gpu\)"):
        check_alltoall(parse_alltoall("AllToAll(rack, inside)"), hierarchy)
    with pytest.raises(SynthError, match=r"one member each"):
        check_alltoall(parse_alltoall("AllToAll(gpu, inside)"), hierarchy)
    with pytest.raises(SynthError, match=r"parallel\(gpu\) needs a level above 'node'"):
        check_alltoall(parse_alltoall("AllToAll(node, parallel(gpu))"), hierarchy)
    sources, destinations = execute_alltoall(parse_alltoall("AllToAll(node, inside)\nAllToAll(node, parallel(root))"),
                                             hierarchy)
    assert (destinations == np.arange(8)[:, None]).all() and (sources == np.arange(8)[None, :]).all()


def test_text_form_round_trips_and_errors_name_the_step():
    text = "AllToAll(node, inside)\nAllToAll(node, parallel(root))"
    program = parse_alltoall(text)
    assert format_alltoall(program) == text and str(program) == text
    assert parse_alltoall("AllToAll(node,inside) ;AllToAll( node , parallel( root ))") == program
    assert program.steps == (Exchange("node"), Exchange("node", Form.PARALLEL, "root"))
    with pytest.raises(SynthError, match=r"step 2 'AllReduce\(node, inside\)': write AllToAll"):
        parse_alltoall("AllToAll(node, inside) ; AllReduce(node, inside)")
    with pytest.raises(SynthError, match="at least one"):
        parse_alltoall(" ; ")
    with pytest.raises(SynthError, match="not master"):
        Exchange("node", Form.MASTER, "root")


def test_the_cost_per_peer_is_nccls_measurement():
    """NCCL_PEER_S is the slope of NCCL's own all-to-all at 16 B per pair
    between 8 and 32 GPUs of one NVLink domain, as transcribed in data/nccl."""
    small = {}
    for path in sorted(DATA.glob("nvidia-contrib-gb200-*-alltoall.jsonl")):
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            assert doc["collective"] == "alltoall" and doc["source"].startswith("https://github.com/NVIDIA/nccl/blob/")
            if doc["size_bytes"] == 16 * doc["ranks"]:
                small[doc["ranks"]] = doc["time_us"] * 1e-6
    assert small == pytest.approx({8: 11.75e-6, 32: 28.20e-6}, rel=1e-12)
    assert NCCL_PEER_S == pytest.approx((small[32] - small[8]) / (32 - 8), rel=1e-12)
    assert peer_seconds(Algorithm.NCCL) == peer_seconds(Algorithm.RING) == NCCL_PEER_S
    assert peer_seconds(Algorithm.MPI) == 0.0


def test_a_hierarchical_program_is_priced_as_its_steps_on_the_placement():
    """On 8 nodes of 8 H100s with ep over all 64 GPUs, inside-then-across is two
    all-to-alls of the whole buffer: over each node's 8 GPUs, then over the 8
    GPUs of one index across nodes. Its time is the sum of the two, computed
    here on device groups written by hand; the one call pays 63 peers, the
    hierarchy 7 + 7, so it wins small all-to-alls and loses large ones (its
    extra NVLink step)."""
    topology = load_topology("dgx-h100").scaled({"node": 8})
    problem = make_problem(topology, {"ep": 64}, "ep", "allreduce")
    (placement,) = problem.placements()
    groups = problem.reduction(placement)
    profile = Model().profile_for(topology)
    hierarchical = parse_alltoall("AllToAll(node, inside) ; AllToAll(node, parallel(root))")
    direct = parse_alltoall("AllToAll(root, inside)")
    by_node = np.arange(64).reshape(8, 8)
    for size in (64 * 2**10, 2**20, 256 * 2**20):
        steps = program_alltoalls(topology, profile, groups, hierarchical)
        assert program_seconds(steps, size) == pytest.approx(
            alltoall_s(topology, profile, by_node, size) + alltoall_s(topology, profile, by_node.T.copy(), size))
        assert program_seconds(program_alltoalls(topology, profile, groups, direct), size) == pytest.approx(
            alltoall_s(topology, profile, by_node.reshape(1, 64), size))
    small = [program_seconds(program_alltoalls(topology, profile, groups, p), 64 * 2**10)
             for p in (direct, hierarchical)]
    large = [program_seconds(program_alltoalls(topology, profile, groups, p), 256 * 2**20)
             for p in (direct, hierarchical)]
    assert small[1] < small[0] and large[0] < large[1]
    # without the per-peer term the hierarchy never wins: the same NIC bytes plus a step
    no_peer = [program_seconds(program_alltoalls(topology, profile, groups, p, peer_s=0.0), 64 * 2**10)
               for p in (direct, hierarchical)]
    assert no_peer[0] < no_peer[1]


def test_the_planner_prices_expert_parallelism_with_the_best_program():
    """ep spread over nodes: the planner's all-to-all is the fastest of the
    synthesized programs (the hierarchy at small sizes, the one call at large);
    ep inside a node has one program, the one call."""
    from synth.planner.collectivecosts import CollectiveCosts

    topology = load_topology("dgx-h100").scaled({"node": 16})
    costs = CollectiveCosts(topology)
    spread = Placement(topology, (Axis("ep", 64), Axis("tp", 2)), ((8, 8), (2, 1)))
    seconds, program = costs.best_alltoall(spread, "ep", 64 * 2**10)
    assert format_alltoall(program, " ; ") == "AllToAll(node, inside) ; AllToAll(node, parallel(root))"
    assert seconds < costs.alltoall_programs(spread, "ep")[0][1][0].seconds(64 * 2**10)
    assert format_alltoall(costs.best_alltoall(spread, "ep", 256 * 2**20)[1]) == "AllToAll(root, inside)"
    assert costs.alltoall(spread, "ep", 64 * 2**10) == seconds
    inside = Placement(topology, (Axis("tp", 16), Axis("ep", 8)), ((16, 1), (1, 8)))
    assert [str(p) for p, _ in costs.alltoall_programs(inside, "ep")] == ["AllToAll(root, inside)"]


def test_the_main_command_lists_and_proves_alltoall_programs(cli):
    argv = ["--topology", "dgx-h100", "--scale", "node=8", "--axes", "ep=64", "--collective", "alltoall",
            "--size", "64KiB"]
    code, out, _ = cli(*argv)
    assert code == 0
    assert "alltoall over ep: 64 KiB per device" in out and "listed programs proved" in out
    row = next(line for line in out.splitlines() if line.lstrip().startswith("1 "))
    assert "AllToAll(node, inside) ; AllToAll(node, parallel(root))" in row
    code, out, _ = cli(*argv, "--json")
    doc = json.loads(out)
    assert doc["collective"] == "alltoall" and doc["axes"] == ["ep"] and doc["size_bytes"] == 64 * 2**10
    (placement,) = doc["placements"]
    assert placement["programs_found"] == 3 and len(placement["programs"]) == 3
    assert [p["checked_blocks"] for p in placement["programs"]] == [64 * 64] * 3
    assert placement["programs"][0]["predicted_s"] == placement["best_s"] < placement["direct_s"]
    assert placement["speedup"] == pytest.approx(placement["direct_s"] / placement["best_s"])
    assert any(p["text"] == "AllToAll(root, inside)" and p["predicted_s"] == placement["direct_s"]
               for p in placement["programs"])


def test_alltoall_errors_name_the_option(cli):
    base = ["--topology", "dgx-h100", "--axes", "ep=64", "--collective", "alltoall"]
    assert "--out: a plan holds reductions" in usage_error(cli, *base, "--out", "x.json")
    assert "--density does not apply to --collective alltoall" in usage_error(cli, *base, "--density", "0.1")
    assert "needs axis sizes" in usage_error(cli, "--topology", "dgx-h100", "--axes", "ep,tp",
                                             "--collective", "alltoall")
    assert "this command runs reductions" in usage_error(cli, "bench", *base)


def test_plan_names_the_alltoall_program_of_expert_parallelism(cli):
    """plan --json gives each configuration with ep > 1 its all-to-all program
    (programs["ep/alltoall"]), the fastest at the step's all-to-all size on its
    placement; configurations without ep have none."""
    moe = "layers=4,hidden=64,heads=4,ffn=96,mlp=swiglu,seq=32,vocab=100,experts=8,top_k=2,expert_ffn=48"
    code, out, _ = cli("plan", "--topology", "dgx-h100", "--scale", "node=2", "--model", moe, "--global-batch", "64",
                       "--no-verify", "--json")
    assert code == 0
    configurations = json.loads(out)["configurations"]
    with_ep = [c for c in configurations if c["axes"].get("ep", 1) > 1]
    assert with_ep and len(with_ep) < len(configurations)
    for c in configurations:
        text = c["programs"].get("ep/alltoall")
        assert (text is not None) == (c in with_ep)
        if text is not None:
            assert text.startswith("AllToAll(") and parse_alltoall(text)
    # tiny tokens: ep 8 over both nodes (2 x 4) pays 3 + 1 peers inside-then-across instead of 7
    axes = json.loads(out)["axes"]
    spread = [c for c in with_ep if c["matrix"][axes.index("ep")] == [2, 4]]
    assert spread and all(c["programs"]["ep/alltoall"] == "AllToAll(node, inside) ; AllToAll(node, parallel(root))"
                          for c in spread)


def test_an_alltoall_too_large_to_price_is_refused_with_the_count(cli):
    message = usage_error(cli, "--topology", "dgx-h100", "--scale", "node=512", "--axes", "ep=4096",
                          "--collective", "alltoall", "--no-verify")
    assert "an all-to-all over 1 group(s) of 4096 devices is 16,773,120 flows" in message
    assert "limit of 4,192,256" in message


def _expected(table: np.ndarray, device: int, block: int) -> np.ndarray:
    """What the one-call all-to-all gives ``device``: from each member i of its
    group (all-to-all rank order), the block i addressed to ``device``'s rank."""
    row, rank = (int(v[0]) for v in np.nonzero(table == device))
    return np.concatenate([np.arange(rank * block, (rank + 1) * block) + 1000 * int(d) for d in table[row]])


@pytest.mark.parametrize("axes", ["ep=8", "ep=4,tp=2", "tp=2,ep=4"])
def test_every_program_runs_exactly_on_thread_ranks(axes):
    """synth.runtime.alltoall on 8 thread ranks of the emulated 2 x 4 testbed:
    every program of every placement gives each device, block for block, what
    the one-call all-to-all over its group gives (the direct transpose)."""
    from synth.runtime.alltoall import run_alltoall
    from synth.runtime.backends import run_local
    from synth.synthesis.placement import enumerate_placements, parse_axes
    from synth.synthesis.reduction import Reduction

    topology = load_topology("testbed-2x4")
    checked = 0
    for placement in enumerate_placements(topology, parse_axes(axes)):
        groups = Reduction.of(placement, ("ep",))
        table = groups.reduction_groups
        k = table.shape[1]
        for program in synthesize_alltoall(groups.hierarchy, 5).programs:
            for block in (1, 5):
                results = run_local(8, lambda world: run_alltoall(
                    world, groups, program, np.arange(k * block, dtype=np.int64) + 1000 * world.rank))
                for device, got in enumerate(results):
                    assert np.array_equal(got, _expected(table, device, block)), (placement.matrix, str(program))
                checked += 1
    assert checked >= 6  # at least one placement with the one call and both hierarchical orders


def test_a_wrong_buffer_is_refused_alike_on_every_rank():
    """A buffer that does not divide into blocks, or one rank's buffer or program
    differing from the others': every rank raises the same SynthError (they agree
    before any all-to-all, so none waits in one)."""
    from synth.runtime.alltoall import run_alltoall
    from synth.runtime.backends import run_local
    from synth.synthesis.reduction import Reduction

    topology = load_topology("testbed-2x4")
    (placement,) = make_problem(topology, {"ep": 8}, "ep", "allreduce").placements()
    groups = Reduction.of(placement, ("ep",))
    one_call = parse_alltoall("AllToAll(root, inside)")
    hierarchical = parse_alltoall("AllToAll(node, inside) ; AllToAll(node, parallel(root))")

    def messages(program_of, length_of) -> set[str]:
        def rank(world):
            try:
                run_alltoall(world, groups, program_of(world.rank), np.zeros(length_of(world.rank)))
            except SynthError as exc:
                return str(exc)
            return "no error"
        return set(run_local(8, rank))

    (message,) = messages(lambda r: one_call, lambda r: 12)
    assert "buffer of shape (12,): give a flat buffer whose length is a multiple of the group size 8" in message
    (message,) = messages(lambda r: one_call, lambda r: 24 if r == 3 else 16)
    assert message == ("all-to-all: rank 3 passed a buffer of shape (24,) (float64), rank 0 (16,) (float64); every "
                       "rank must pass the same shape and dtype")
    (message,) = messages(lambda r: hierarchical if r == 5 else one_call, lambda r: 16)
    assert message == ("all-to-all: rank 5 runs 'AllToAll(node, inside) ; AllToAll(node, parallel(root))', rank 0 "
                       "'AllToAll(root, inside)'; every rank must run the same program")
    # a world larger than the placement: every rank is told, none waits in a split
    small = Reduction.of(make_problem(load_topology("testbed-2x4").scaled({"node": 1}), {"ep": 4}, "ep",
                                      "allreduce").placements()[0], ("ep",))
    found = set(run_local(8, lambda world: _error_of(lambda: run_alltoall(world, small, one_call, np.zeros(8)))))
    assert found == {"all-to-all: rank 4 is not a device of the placement (4 devices); launch 4 ranks"}


def _error_of(fn) -> str:
    try:
        fn()
    except SynthError as exc:
        return str(exc)
    return "no error"


@pytest.mark.mpi
def test_every_program_runs_exactly_under_mpi():
    from processes import run_watched
    from test_runtime import REPO, mpi_env, mpiexec_command

    done = run_watched(mpiexec_command(8, "tests/mpi_worker.py", "alltoall"), stall_s=120, cwd=REPO, env=mpi_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all exact" in done.stdout and "ok: " in done.stdout, done.stdout


def test_a_configuration_that_fits_nowhere_is_priced_with_the_one_call():
    """Like its reductions (the library's one-call collectives), the all-to-all
    of a configuration that fits on no placement is the one call, not the
    fastest program."""
    from synth.planner.collectivecosts import CollectiveCosts

    topology = load_topology("dgx-h100").scaled({"node": 16})
    costs = CollectiveCosts(topology)
    spread = Placement(topology, (Axis("ep", 64), Axis("tp", 2)), ((8, 8), (2, 1)))
    size = 64 * 2**10
    one_call_s, program = costs.default_alltoall(spread, "ep", size)
    assert str(program) == "AllToAll(root, inside)"
    assert costs.on(spread, default_only=True).alltoall("ep", size) == one_call_s
    assert costs.on(spread).alltoall("ep", size) == costs.best_alltoall(spread, "ep", size)[0] < one_call_s
