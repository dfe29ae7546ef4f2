"""Both independent verifiers: numpy reference execution and the z3 proof.

Every program the search emits must pass both on the whole system; programs
broken on purpose must fail both (each test pairs a valid and an invalid case).
"""

from dataclasses import replace

import numpy as np
import pytest
from helpers import synthesize_all

from synth.errors import SynthError
from synth.synthesis.execute import check_numerically, execute, numeric_scope
from synth.synthesis.language import Collective, parse_program
from synth.synthesis.lowering import lower
from synth.synthesis.placement import Placement, enumerate_placements, parse_axes
from synth.synthesis.prove import prove
from synth.synthesis.reduction import Reduction
from synth.synthesis.semantics import Goal
from synth.synthesis.verify import verify_lowered, verify_program
from synth.topology import load_topology

BLUECONNECT = "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)"


def _sweep(topology, spec, reduce_axes, goal, max_steps):
    axes = parse_axes(spec)
    results = synthesize_all(enumerate_placements(topology, axes), reduce_axes, goal, max_steps)
    checked = 0
    for result in results:
        for program in result.programs:
            lowered = lower(program, result.reduction)
            assert check_numerically(lowered, seed=checked) > 0
            proof = prove(lowered)
            assert proof.proved, (str(program), proof.counterexample)
            assert proof.scope == "whole system"
            checked += 1
    return checked


@pytest.mark.parametrize("goal", list(Goal))
@pytest.mark.parametrize("spec,reduce_axes", [("dp=2,mp=4", ["dp"]), ("dp=2,mp=4", ["mp"]),
                                              ("dp=2,mp=4", ["dp", "mp"]), ("dp=4,mp=2", ["dp"])])
def test_every_program_verifies_on_the_testbed(goal, spec, reduce_axes):
    topology = load_topology("testbed-2x4")
    assert _sweep(topology, spec, reduce_axes, goal, 4) > 0


def test_every_program_verifies_on_p2_a100_two_level_placement():
    topology = load_topology("p2-a100")
    assert _sweep(topology, "dp=4,mp=16", ["dp"], Goal.ALLREDUCE, 5) == 3 + 100 + 3


def test_three_axes_reduction_over_two_of_them():
    topology = load_topology("testbed-2x4")
    assert _sweep(topology, "a=2,b=2,c=2", ["a", "c"], Goal.ALLREDUCE, 3) > 0


@pytest.fixture
def blueconnect():
    topology = load_topology("p2-a100")
    placement = Placement(topology, parse_axes("dp=4,mp=16"), ((2, 2), (2, 8)))
    return lower(parse_program(BLUECONNECT), Reduction.of(placement, ["dp"]))


def test_blueconnect_lowering_groups(blueconnect):
    rs, ar, ag = blueconnect.steps
    # 16 reduction groups x 2 nodes' halves: groups of 2 devices on one node
    assert len(rs.groups) == 32 and all(len(g) == 2 and g[0] // 16 == g[1] // 16 for g in rs.groups)
    assert len(ar.groups) == 32 and all(len(g) == 2 and g[0] // 16 != g[1] // 16 for g in ar.groups)
    assert rs.groups == ag.groups
    # member i of a ReduceScatter group ends with part i: the AllReduce groups
    # cover the chunks their members own
    assert sorted(map(tuple, {tuple(c) for c in ar.chunks})) == [(0, 1), (2, 3)]
    assert check_numerically(blueconnect, length=1001) == 64 * 1001
    assert prove(blueconnect).proved


def _swap_collective(lowered, step, collective):
    steps = list(lowered.steps)
    instruction = replace(steps[step].instruction, collective=collective)
    steps[step] = replace(steps[step], instruction=instruction)
    return replace(lowered, steps=tuple(steps))


@pytest.mark.parametrize(
    "break_it",
    [
        lambda lp: replace(lp, steps=lp.steps[:-1]),                       # missing AllGather
        lambda lp: replace(lp, steps=lp.steps + lp.steps[1:2]),            # AllReduce twice
        lambda lp: _swap_collective(lp, 1, Collective.REDUCE),             # root only
        lambda lp: replace(lp, steps=(replace(lp.steps[0], chunks=tuple(                # RS parts
            c[::-1] if i == 0 else c for i, c in enumerate(lp.steps[0].chunks))), *lp.steps[1:])),
        lambda lp: replace(lp, steps=(lp.steps[0], replace(lp.steps[1], chunks=tuple(
            (0, 1) for _ in lp.steps[1].chunks)), lp.steps[2])),           # wrong chunks
    ],
)
def test_broken_programs_fail_both_verifiers(blueconnect, break_it):
    broken = break_it(blueconnect)
    with pytest.raises(SynthError, match="numpy reference"):
        check_numerically(broken)
    proof = prove(broken)
    assert not proof.proved and "device" in proof.counterexample


def test_reversed_chunk_order_is_still_correct(blueconnect):
    """Reversing one AllReduce group's chunk list permutes equal work: still valid,
    so the verifiers must accept it (they check values, not syntax)."""
    lp = blueconnect
    ar = lp.steps[1]
    flipped = replace(ar, chunks=tuple(c[::-1] for c in ar.chunks))
    ok = replace(lp, steps=(lp.steps[0], flipped, lp.steps[2]))
    assert check_numerically(ok) > 0 and prove(ok).proved


def test_double_counting_is_caught():
    topology = load_topology("testbed-2x4")
    placement = Placement(topology, parse_axes("x=8"), ((2, 4),))
    good = lower(parse_program("AllReduce(node, inside)\nAllReduce(node, parallel(root))"),
                 Reduction.of(placement, ["x"]))
    assert check_numerically(good) > 0 and prove(good).proved
    twice = replace(good, steps=good.steps + good.steps[:1])   # sums a sum again
    with pytest.raises(SynthError, match="numpy reference"):
        check_numerically(twice)
    assert not prove(twice).proved


def test_execute_allgather_and_broadcast_in_place():
    from synth.synthesis.language import Form, Instruction
    from synth.synthesis.lowering import LoweredStep
    buf = np.arange(4 * 4).reshape(4, 4, 1)
    ag = LoweredStep(Instruction(Collective.ALLGATHER, "root", Form.INSIDE), ((0, 1, 2, 3),), ((0, 1, 2, 3),))
    execute([ag], buf)
    assert buf[:, :, 0].tolist() == [[0, 5, 10, 15]] * 4
    bc = LoweredStep(Instruction(Collective.BROADCAST, "root", Form.INSIDE), ((2, 0),), ((1, 3),))
    buf[2, :, 0] = [7, 8, 9, 10]
    execute([bc], buf)
    assert buf[0, :, 0].tolist() == [0, 8, 10, 10]


@pytest.mark.slow
def test_verification_scope_shrinks_with_size():
    topology = load_topology("dgx-a100").scaled({"node": 8})
    placement = Placement(topology, parse_axes("dp=64"), ((8, 8),))
    lowered = lower(parse_program(BLUECONNECT), Reduction.of(placement, ["dp"]))
    proof = prove(lowered)
    assert proof.proved and proof.scope == "whole system"
    # 256 devices x 128 chunks is over z3's budget: one reduction group is proved
    topology = load_topology("dgx-a100").scaled({"node": 32})
    placement = Placement(topology, parse_axes("dp=128,mp=2"), ((16, 8), (2, 1)))
    lowered = lower(parse_program(BLUECONNECT), Reduction.of(placement, ["dp"]))
    assert check_numerically(lowered) == 256 * (2 * 128 + 1)  # numpy: whole system
    proof = prove(lowered)
    assert proof.proved and proof.scope == "reduction group 0 of 2"
    # a broken program is still refuted inside the scope
    broken = replace(lowered, steps=lowered.steps[:2])
    assert not prove(broken).proved


# ---------------------------------------------------------------- malformed programs (issue 12, item 3)


def _with_step(lowered, number, **change):
    steps = list(lowered.steps)
    steps[number] = replace(steps[number], **change)
    return replace(lowered, steps=tuple(steps))


@pytest.mark.parametrize("change, message", [
    # the second ReduceScatter group shares device 0 with the first
    (lambda lp: _with_step(lp, 0, groups=((0, 8), (0, 32)) + lp.steps[0].groups[2:]),
     "step 1 (ReduceScatter(node, inside)): group [0, 32] shares devices with another group of the step; "
     "the groups of a step must be disjoint"),
    # three chunks do not divide into one part per member of a group of two
    (lambda lp: _with_step(lp, 0, chunks=((0, 1, 2),) + lp.steps[0].chunks[1:]),
     "step 1 (ReduceScatter(node, inside)): 3 chunks do not divide into one part per member of group [0, 8] "
     "(2 members)"),
    (lambda lp: _with_step(lp, 2, chunks=((0, 1, 2),) + lp.steps[2].chunks[1:]),
     "step 3 (AllGather(node, inside)): 3 chunks do not divide into one part per member of group [0, 8] "
     "(2 members)"),
    (lambda lp: _with_step(lp, 1, groups=((0, 1),) + lp.steps[1].groups[1:]),
     "step 2 (AllReduce(node, parallel(root))): group [0, 1] spans reduction groups"),
    (lambda lp: _with_step(lp, 1, groups=((0, 0),) + lp.steps[1].groups[1:]),
     "step 2 (AllReduce(node, parallel(root))): group [0, 0] must hold 2 or more distinct devices of 0..63"),
    (lambda lp: _with_step(lp, 1, chunks=((0, 0),) + lp.steps[1].chunks[1:]),
     "step 2 (AllReduce(node, parallel(root))): the chunk list of group [0, 32] must hold distinct chunks of 0..3"),
    (lambda lp: replace(lp, chunk_of_rank=(0, 0, 1, 2)), "chunk_of_rank is not a permutation of chunks 0..3"),
])
def test_malformed_programs_are_a_clear_error_in_every_verifier(blueconnect, change, message):
    broken = change(blueconnect)
    for verifier in (check_numerically, prove, verify_lowered):
        with pytest.raises(SynthError) as exc:
            verifier(broken)
        assert str(exc.value) == message, verifier


def test_the_issue_example_with_an_idle_allgather_group_verifies():
    """ReduceScatter ; Reduce ; AllGather ; Broadcast on node x2 > gpu x2: in the
    AllGather the second node's devices hold nothing, so their group is idle
    (an empty chunk list); both verifiers prove the program."""
    placement = Placement(load_topology("p2-a100"), parse_axes("dp=4,mp=16"), ((2, 2), (2, 8)))
    program = parse_program("ReduceScatter(node, inside)\nReduce(node, parallel(root))\n"
                            "AllGather(node, inside)\nBroadcast(node, parallel(root))")
    lowered = lower(program, Reduction.of(placement, ["dp"]))
    gather = lowered.steps[2]
    assert sorted(len(c) for c in gather.chunks) == [0] * 16 + [4] * 16
    assert check_numerically(lowered) == 64 * (2 * 4 + 1)
    assert prove(lowered).proved and verify_lowered(lowered).proof.proved
    broken = replace(lowered, steps=lowered.steps[:3])  # the empty devices never receive the sum
    with pytest.raises(SynthError, match="numpy reference: device 32 holds a wrong result"):
        check_numerically(broken)
    assert not prove(broken).proved


def test_a_chunk_sample_is_checked_when_a_group_does_not_fit(monkeypatch, blueconnect):
    """Chunks never mix, so running some chunks checks those exactly: with a
    budget below one group, a sample is run, and a wrong program is still
    caught when every chunk is wrong."""
    import synth.synthesis.execute

    monkeypatch.setattr(synth.synthesis.execute, "LIMIT", 8)
    assert numeric_scope(64, 4, 16) == ("reduction group 0 of 16, 2 of its 4 chunks (chunks never mix)", 2)
    assert 0 < check_numerically(blueconnect) < 4 * (2 * 4 + 1)  # a part of group 0's elements
    assert "2 of its 4 chunks" in verify_lowered(blueconnect).numpy_scope
    with pytest.raises(SynthError, match="numpy reference"):
        check_numerically(replace(blueconnect, steps=blueconnect.steps[:2]))


def test_verify_program_proves_once_what_verify_lowered_proves_per_placement(blueconnect):
    reduction = Reduction.of(Placement(load_topology("p2-a100"), parse_axes("dp=4,mp=16"), ((2, 2), (2, 8))),
                             ["dp"])
    shared = verify_program(parse_program(BLUECONNECT), reduction)
    whole = verify_lowered(blueconnect)
    assert shared.proof.proved and whole.proof.proved
    assert shared.proof.scope == whole.proof.scope == (
        "reduction group 0 of 16; the others run the same program (checked)")
    assert shared.elements_checked == whole.elements_checked == 4 * (2 * 4 + 1)
    with pytest.raises(SynthError, match="the program does not implement allreduce"):
        verify_program(parse_program("ReduceScatter(node, inside)\nAllReduce(node, parallel(root))"), reduction)


def test_a_sampled_run_computes_the_sampled_columns_of_the_whole_run():
    """Chunks never mix: running a sample of the chunks (groups that hold
    none of them are skipped) gives exactly those columns of the full run,
    for every program of a two-level placement and random samples, seeded."""
    from synth.synthesis.execute import execute_runs, run_steps, samples_in

    rng = np.random.default_rng(3)
    topology = load_topology("p2-a100")
    results = synthesize_all(enumerate_placements(topology, parse_axes("dp=4,mp=16")), ["dp", "mp"],
                             Goal.ALLREDUCE, 4)
    runs = 0
    for result in results:
        for program in result.programs[:20]:
            lowered = lower(program, result.reduction)
            steps = run_steps(lowered.steps)
            n, k = lowered.num_devices, lowered.num_chunks
            data = rng.integers(-100, 100, size=(n, k, 2))
            whole = data.copy()
            execute_runs(steps, whole)
            for size in (1, 3, k // 2):
                sample = np.sort(rng.choice(k, size, replace=False))
                part = data[:, sample].copy()
                execute_runs(steps, part, sample)
                assert (part == whole[:, sample]).all(), str(program)
                runs += 1
    assert runs > 30
    assert samples_in(((0, 4), (10, 12)), [5, 11]) and not samples_in(((0, 4), (10, 12)), [4, 9, 12])


@pytest.mark.parametrize("collective", list(Collective))
def test_steps_that_tile_the_devices_run_on_a_view_with_the_same_result(collective, monkeypatch):
    """A step whose groups are consecutive devices acting on the same columns
    runs on a reshaped view of the buffers (``_apply_tiled``) instead of
    gathering every (member, column) pair: on random data, columns and owners,
    the buffers end the same as on the gathered path; steps that do not tile
    (groups on other columns, devices out of order) take the gathered path."""
    import synth.synthesis.execute as execute

    tiled_runs = []
    tiled = execute._apply_tiled
    rng = np.random.default_rng(5)
    for g, m in ((1, 2), (1, 5), (3, 2), (2, 4), (4, 3)):
        n, width, q = g * m, 7, 3
        for _ in range(6):
            buffers = rng.integers(-1000, 1000, size=(n, width, q), dtype=np.int32)
            col = np.sort(rng.choice(width, int(rng.integers(1, width + 1)), replace=False))
            cols, owner = np.tile(col, (g, 1)), np.tile(rng.integers(0, m, len(col)), (g, 1))
            members = np.arange(n).reshape(g, m)
            shuffled = rng.permutation(n).reshape(g, m)
            if g > 1 and rng.random() < 0.3:  # another column set in one group: not a tiling
                cols[-1] = np.sort(rng.choice(width, len(col), replace=False))
            for rows in (members, shuffled):
                got, want = buffers.copy(), buffers.copy()
                monkeypatch.setattr(execute, "_apply_tiled", lambda *a: tiled_runs.append(tiled(*a)) or tiled_runs[-1])
                execute._apply_columns(collective, got, rows[:, :, None], cols[:, None, :], owner[:, None, :], axis=1)
                monkeypatch.setattr(execute, "_apply_tiled", lambda *a: False)
                execute._apply_columns(collective, want, rows[:, :, None], cols[:, None, :], owner[:, None, :], axis=1)
                assert np.array_equal(got, want), (g, m, col.tolist(), rows.tolist())
    assert True in tiled_runs and False in tiled_runs
