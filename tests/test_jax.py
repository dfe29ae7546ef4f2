"""JAX consumes plans (synth.jax) on 8 fake CPU devices: the mesh holds the
plan's ids, ``execute`` leaves exactly what the MPI runtime's reference leaves
on a sample of every goal's programs of several placements, the compiled HLO's
replica groups are the plan's groups, and ppermute steps only exchange data
between members of one group of the plan."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

# before jax creates its CPU backend (no other test module imports jax)
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import PartitionSpec  # noqa: E402
from processes import limit_s  # noqa: E402

import synth.jax  # noqa: E402
from synth.cli import main  # noqa: E402
from synth.errors import SynthError  # noqa: E402
from synth.plan import Plan, PlannedProgram, PlannedReduction  # noqa: E402
from synth.runtime.bench_measure import rank_data  # noqa: E402
from synth.runtime.executor import reference  # noqa: E402
from synth.synthesis.language import parse_program  # noqa: E402
from synth.synthesis.lowering import lower  # noqa: E402
from synth.synthesis.placement import Placement, enumerate_placements, parse_axes  # noqa: E402
from synth.synthesis.reduction import Reduction  # noqa: E402
from synth.synthesis.search import synthesize_reduction  # noqa: E402
from synth.synthesis.semantics import Goal  # noqa: E402
from synth.topology import load_topology  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRAINERS_DOC = REPO / "docs" / "trainers.md"
TESTBED = load_topology("testbed-2x4")
BLUECONNECT = "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)"
# a placement whose mesh is not row-major: [[0, 1, 4, 5], [2, 3, 6, 7]]
SKEWED = Placement(TESTBED, parse_axes("dp=2,mp=4"), ((1, 2), (2, 2)))


@pytest.fixture(scope="module", autouse=True)
def eight_devices():
    assert jax.device_count() == 8, "jax was initialized before XLA_FLAGS asked for 8 CPU devices"


def single(text: str, reduction: Reduction) -> Plan:
    return Plan.single(lower(parse_program(text), reduction), reduction)


def test_mesh_holds_the_plans_device_ids_and_axis_names():
    plan = single(BLUECONNECT, Reduction.of(SKEWED, ["mp"]))
    flat = synth.jax.mesh(plan)
    assert flat.axis_names == ("dp", "mp")
    assert [[d.id for d in row] for row in flat.devices] == SKEWED.mesh.tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]
    tree = synth.jax.mesh(plan, hierarchical=True)
    assert tree.axis_names == ("dp_rank", "mp_node", "mp_rank")
    assert np.vectorize(lambda d: d.id)(tree.devices).reshape(2, 4).tolist() == SKEWED.mesh.tolist()
    with pytest.raises(SynthError, match="the plan is for 8 devices but 4 were given"):
        synth.jax.mesh(plan, devices=jax.devices()[:4])


def programs_of(topology: str, axes: str, reduce: str, per_goal: int):
    """About ``per_goal`` programs of each goal, spread evenly over the
    placements' programs in enumeration order (compiling costs ~0.3 s each)."""
    for goal in Goal:
        found = []
        for placement in enumerate_placements(load_topology(topology), parse_axes(axes)):
            result = synthesize_reduction(Reduction.of(placement, reduce.split(","), goal), 5)
            if result.reduction.k > 1:
                found += [(lower(program, result.reduction), result.reduction) for program in result.programs]
        yield from (found[int(i)] for i in np.unique(np.linspace(0, len(found) - 1, per_goal).round()))


def uneven(lowered) -> bool:
    """Some step's groups cover different numbers of chunks (after a master form)."""
    return any(len({len(c) for c in step.chunks}) > 1 for step in lowered.steps)


def exact_everywhere(lowered, reduction: Reduction, length: int, dtype: np.dtype) -> None:
    data = [rank_data(lowered, d, length, dtype) for d in range(8)]
    buffers = np.stack([d.input for d in data])
    with jax.enable_x64(dtype.itemsize == 8):
        got = synth.jax.execute(Plan.single(lowered, reduction), buffers)
    assert got.dtype == dtype
    where = f"{lowered.goal.value} {lowered.program} length {length} {dtype}"
    assert np.array_equal(got, reference(lowered, buffers)), where
    for d, rank in enumerate(data):  # and the goal's part is the direct reduction
        assert np.array_equal(got[d][rank.checked], rank.expected[rank.checked]), where


CASES = [("testbed-2x4", "dp=8", "dp"), ("testbed-2x4", "dp=2,mp=4", "dp,mp"), ("testbed-2x4", "dp=4,mp=2", "dp"),
         ("testbed-2x2x2", "dp=4,mp=2", "dp,mp")]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("topology, axes, reduce", CASES)
def test_execute_leaves_what_the_runtimes_reference_leaves(topology, axes, reduce):
    runs = 0
    for lowered, reduction in programs_of(topology, axes, reduce, per_goal=5):
        length = (1, 2 * lowered.num_chunks + 1, 3 * lowered.num_chunks)[runs % 3]
        exact_everywhere(lowered, reduction, length, np.dtype(("float32", "int32", "float64")[runs % 3]))
        runs += 1
    assert runs >= 12


def test_execute_is_exact_where_groups_of_a_step_cover_different_chunks():
    placement = Placement(load_topology("testbed-2x2x2"), parse_axes("dp=8"), ((2, 2, 2),))
    result = synthesize_reduction(Reduction.of(placement, ["dp"]), 5)
    picked = [lowered for lowered in (lower(p, result.reduction) for p in result.programs) if uneven(lowered)]
    assert len(picked) >= 3
    # docs/trainers.md counts them: it says what this search finds
    counts = re.search(r"in (\d+) of the (\d+) allreduce programs of\s+testbed-2x2x2 `dp=8`", TRAINERS_DOC.read_text())
    assert counts and (int(counts[1]), int(counts[2])) == (len(picked), len(result.programs))
    for lowered in picked[::max(1, len(picked) // 3)][:3]:
        exact_everywhere(lowered, result.reduction, 2 * lowered.num_chunks + 1, np.dtype("float64"))


def test_execute_is_exact_where_a_group_of_a_step_idles():
    """An AllGather whose members hold nothing (issue 12 item 15) leaves that
    group idle (an empty chunk list); the other groups of the step still run."""
    placement = Placement(TESTBED, parse_axes("dp=4,mp=2"), ((2, 2), (1, 2)))  # dp over 2 nodes x 2 ranks
    result = synthesize_reduction(Reduction.of(placement, ["dp"]), 5)
    idle = [lowered for lowered in (lower(p, result.reduction) for p in result.programs)
            if any(not chunks for step in lowered.steps for chunks in step.chunks)]
    assert len(idle) == 7, [str(lowered.program) for lowered in idle]
    for n, lowered in enumerate(idle):
        exact_everywhere(lowered, result.reduction, 2 * lowered.num_chunks + 1, np.dtype(("float32", "int32")[n % 2]))


def test_execute_picks_the_program_of_the_buffer_size_and_checks_its_input():
    reduction = Reduction.of(SKEWED, ["mp"])
    small, large = (lower(parse_program(t), reduction) for t in (BLUECONNECT, "AllReduce(root, inside)"))
    plan = Plan(SKEWED, (PlannedReduction(reduction, (PlannedProgram(small, 0, 64), PlannedProgram(large, 64))),))
    for length in (5, 33):  # 20 bytes and 132 bytes of float32
        buffers = np.arange(8 * length, dtype=np.float32).reshape(8, length) % 17
        lowered = small if length == 5 else large
        assert np.array_equal(synth.jax.execute(plan, buffers), reference(lowered, buffers))
    with pytest.raises(SynthError, match=r"buffers: expected shape \(8, n\), one row per device"):
        synth.jax.execute(plan, np.zeros((4, 3), np.float32))
    with pytest.raises(SynthError, match=r"buffers: float64 needs 64-bit JAX .* JAX would compute in 32 bits"):
        synth.jax.execute(plan, np.zeros((8, 3)))


def replica_groups(hlo: str, op: str) -> list[list[list[int]]]:
    """The replica groups of every ``op`` instruction, in both of XLA's
    notations: ``{{0,1},{2,3}}`` and the iota form ``[2,2]<=[4]`` or
    ``[2,2]<=[2,2]T(1,0)`` (iota over the dims, transposed, reshaped)."""
    out = []
    for line in hlo.splitlines():
        if f" {op}(" not in line:
            continue
        explicit = re.search(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}", line)
        if explicit:
            out.append([[int(v) for v in g.split(",")] for g in re.findall(r"\{([\d,]*)\}", explicit[1])])
            continue
        iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
        assert iota, line
        dims = [int(v) for v in iota[3].split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if iota[4]:
            ids = ids.transpose([int(v) for v in iota[4].split(",")])
        out.append(ids.reshape(int(iota[1]), int(iota[2])).tolist())
    return out


def compiled_hlo(plan: Plan, length: int) -> tuple[str, np.ndarray]:
    mesh = synth.jax.mesh(plan, hierarchical=True)
    spec = PartitionSpec(*mesh.axis_names, None)
    run = jax.jit(jax.shard_map(synth.jax.reducer(plan), mesh=mesh, in_specs=spec, out_specs=spec))
    ids = np.vectorize(lambda d: d.id)(mesh.devices).reshape(-1)  # logical id (mesh position) -> device
    return run.lower(np.zeros(mesh.devices.shape + (length,), np.float32)).compile().as_text(), ids


def test_compiled_replica_groups_are_the_plans_groups():
    plan = single(BLUECONNECT, Reduction.of(SKEWED, ["mp"]))
    hlo, device_of = compiled_hlo(plan, 13)
    steps = plan.lowered.steps
    for op, step in (("reduce-scatter", steps[0]), ("all-reduce", steps[1]), ("all-gather", steps[2])):
        found = replica_groups(hlo, op)
        assert len(found) == 1, (op, found)
        assert sorted(tuple(int(device_of[p]) for p in g) for g in found[0]) == sorted(step.groups), op
    assert "collective-permute" not in hlo


def test_ppermute_steps_only_exchange_within_the_plans_groups():
    program = "Reduce(node, inside)\nAllReduce(node, master(root))\nBroadcast(node, inside)"
    plan = single(program, Reduction.of(SKEWED, ["mp"]))
    hlo, device_of = compiled_hlo(plan, 9)
    pairs = [[(int(device_of[int(a)]), int(device_of[int(b)])) for a, b in re.findall(r"\{(\d+),(\d+)\}", m)]
             for m in re.findall(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", hlo)]
    assert pairs, "no collective-permute in the compiled program"
    members = [{d for g in step.groups for d in g} for step in plan.lowered.steps]
    together = [{frozenset(g) for g in step.groups} for step in plan.lowered.steps]
    for permute in pairs:
        # some step's groups hold every pair: data never leaves a group of the plan
        assert any(all(any({a, b} <= g for g in groups) for a, b in permute) for groups in together), permute
    assert all(len(m) for m in members)


def test_the_jax_example_matches_pmean(tmp_path):
    plan = tmp_path / "plan.json"
    assert main(["--topology", "testbed-2x4", "--axes", "dp=4,mp=2", "--placement", "1", "--out", str(plan)]) == 0
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "examples/jax_shard_map.py", "--plan", str(plan)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=limit_s(180))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "equal within float32 rounding" in done.stdout


@pytest.mark.parametrize("text", [BLUECONNECT, "Reduce(root, inside)\nBroadcast(root, inside)"])
def test_the_reducer_runs_under_shard_map_with_check_vma(text):
    """shard_map's varying-manual-axes check (check_vma=True) accepts the
    reducer on the hierarchical mesh, with the same result as without it."""
    placement = Placement(TESTBED, parse_axes("dp=4,mp=2"), ((2, 2), (1, 2)))
    reduction = Reduction.of(placement, ["dp"])
    plan = Plan.single(lower(parse_program(text), reduction), reduction)
    mesh = synth.jax.mesh(plan, hierarchical=True)
    spec = PartitionSpec(*mesh.axis_names)
    data = np.random.default_rng(0).integers(-50, 50, (*mesh.devices.shape, 12)).astype(np.float32)
    checked = jax.jit(jax.shard_map(synth.jax.reducer(plan), mesh=mesh, in_specs=spec, out_specs=spec,
                                    check_vma=True))(data)
    unchecked = jax.jit(jax.shard_map(synth.jax.reducer(plan), mesh=mesh, in_specs=spec, out_specs=spec,
                                      check_vma=False))(data)
    assert np.array_equal(np.asarray(checked), np.asarray(unchecked))
    assert mesh.axis_names == ("dp_node", "dp_rank", "mp_rank")
    total = data.sum(axis=(0, 1))  # every device holds the sum over its dp group (dp_node x dp_rank)
    assert np.array_equal(np.asarray(checked), np.broadcast_to(total, data.shape))
