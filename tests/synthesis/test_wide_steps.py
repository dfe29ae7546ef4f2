"""Wide AllGather steps: the trace's chunk lists and the numeric check on them.

Thousands of groups of a wide step often hold the same chunk list (every node
holds the same chunks after a step across the nodes); the trace shares one
list object among them and the numeric check computes its columns once per
object. These tests check the lists against the reference rules of
``semantics`` and that a fault planted in one group of a wide step is still
caught.
"""

import numpy as np
import pytest

from synth.errors import SynthError
from synth.synthesis.execute import check_runs, execute_runs
from synth.synthesis.language import Collective, parse_program
from synth.synthesis.lowering import expand, trace
from synth.synthesis.semantics import Goal, Hierarchy, apply_step, initial_state, resolve, step_chunks

# 512 devices (the search's device frame) and 64 (its absolute frame)
WIDE = Hierarchy(("node", "gpu"), (256, 2))
NARROW = Hierarchy(("node", "gpu"), (16, 4))
ACROSS_THEN_INSIDE = ("ReduceScatter(node, parallel(root))\nReduceScatter(node, inside)\n"
                      "AllGather(node, parallel(root))\nAllGather(node, inside)")
INSIDE_THEN_ACROSS = ("ReduceScatter(node, inside)\nReduceScatter(node, parallel(root))\n"
                      "AllGather(node, inside)\nAllGather(node, parallel(root))")
ROOTED = ("ReduceScatter(node, inside)\nReduce(node, parallel(root))\nAllGather(node, inside)\n"
          "Broadcast(node, parallel(root))")


def _reference_chunks(program, hierarchy, goal):
    """Per step, per group, the ordered chunk list by the reference rules."""
    state = initial_state(goal, hierarchy.k)
    out = []
    for instruction in program.instructions:
        groups = resolve(instruction, hierarchy).groups
        out.append([tuple(step_chunks(instruction.collective, [state[d] for d in g])) for g in groups])
        state = apply_step(state, instruction.collective, groups)
        assert not isinstance(state, str), state
    return out


@pytest.mark.parametrize("hierarchy", [WIDE, NARROW], ids=["512-devices", "64-devices"])
@pytest.mark.parametrize("text", [ACROSS_THEN_INSIDE, INSIDE_THEN_ACROSS, ROOTED])
def test_traced_chunk_lists_are_the_reference_lists_and_equal_lists_share_one_object(hierarchy, text):
    program = parse_program(text)
    traced = trace(program, hierarchy, Goal.ALLREDUCE)
    reference = _reference_chunks(program, hierarchy, Goal.ALLREDUCE)
    for step, want in zip(traced.steps, reference, strict=True):
        assert [expand(runs) for runs in step.runs] == want, str(step.instruction)
        # groups with the same list hold one object: as many objects as distinct lists
        assert len({id(runs) for runs in step.runs}) == len(set(want)), str(step.instruction)


def test_a_wide_allgather_step_shares_one_list_among_every_node():
    traced = trace(parse_program(ACROSS_THEN_INSIDE), WIDE, Goal.ALLREDUCE)
    gather = traced.steps[3]
    assert gather.instruction.collective is Collective.ALLGATHER
    assert len(gather.groups) == 256 and len({id(runs) for runs in gather.runs}) == 1
    assert sorted(expand(gather.runs[0])) == list(range(512))


def _steps(traced):
    """The traced steps as the numeric check runs them (identity rank map)."""
    return [(t.instruction.collective, list(zip(t.groups, t.runs))) for t in traced.steps]


def _swap_parts(runs, size):
    """The list with its first two members' parts swapped (still ``size`` parts)."""
    chunks = expand(runs)
    part = len(chunks) // size
    swapped = chunks[part:2 * part] + chunks[:part] + chunks[2 * part:]
    return tuple((c, c + 1) for c in swapped)


def _plant(steps, number, group, runs):
    out = [(c, list(groups)) for c, groups in steps]
    members, _ = out[number][1][group]
    out[number][1][group] = (members, runs)
    return out


def test_the_numeric_check_of_a_wide_allgather_program_passes_and_matches_unshared_lists():
    """The check passes on the valid program, with every chunk and with a
    sample, and gives the same count with every group's list a fresh
    object (columns found by value instead of by identity); running the
    steps on the same data ends with the same buffers either way."""
    traced = trace(parse_program(ACROSS_THEN_INSIDE), WIDE, Goal.ALLREDUCE)
    k, rows = WIDE.k, np.arange(WIDE.k)[None, :]
    steps = _steps(traced)
    fresh = [(c, [(m, tuple(tuple(r) for r in runs)) for m, runs in groups]) for c, groups in steps]
    assert fresh[3][1][0][1] is not fresh[3][1][1][1]
    for chunks in (None, 37):
        counts = [check_runs(Goal.ALLREDUCE, rows, range(k), s, chunks, seed=4) for s in (steps, fresh)]
        assert counts[0] == counts[1] > 0
    data = np.random.default_rng(9).integers(-100, 100, size=(k, k, 2))
    shared, unshared = data.copy(), data.copy()
    execute_runs(steps, shared)
    execute_runs(fresh, unshared)
    assert np.array_equal(shared, unshared) and not np.array_equal(shared, data)


@pytest.mark.parametrize("chunks", [None, 37], ids=["every-chunk", "sampled"])
@pytest.mark.parametrize("group", [0, 100, 255])
def test_a_fault_in_one_group_of_a_step_whose_groups_share_a_list_is_caught(chunks, group):
    """256 groups of the last AllGather share one list; one of them given its
    members' parts swapped (a new object of the same length) copies a
    member's stale partial sums: the check must compute that group's
    columns, not reuse the shared ones."""
    traced = trace(parse_program(ACROSS_THEN_INSIDE), WIDE, Goal.ALLREDUCE)
    steps = _steps(traced)
    broken = _plant(steps, 3, group, _swap_parts(steps[3][1][group][1], 2))
    assert len(broken[3][1][group][1]) == len(steps[3][1][group][1])
    node = f"numpy reference: device ({2 * group}|{2 * group + 1}) holds a wrong result"
    with pytest.raises(SynthError, match=node):
        check_runs(Goal.ALLREDUCE, np.arange(WIDE.k)[None, :], range(WIDE.k), broken, chunks, seed=4)


@pytest.mark.parametrize("text,number", [(ACROSS_THEN_INSIDE, 2), (INSIDE_THEN_ACROSS, 3)])
def test_a_fault_in_a_group_of_256_members_is_caught(text, number):
    """In an AllGather over 256 members, two members' parts swapped in one
    group's list: their chunks are copied from members that do not hold
    them."""
    traced = trace(parse_program(text), WIDE, Goal.ALLREDUCE)
    steps = _steps(traced)
    collective, groups = steps[number]
    assert collective is Collective.ALLGATHER and len(groups[1][0]) == 256
    rows = np.arange(WIDE.k)[None, :]
    assert check_runs(Goal.ALLREDUCE, rows, range(WIDE.k), steps) > 0
    broken = _plant(steps, number, 1, _swap_parts(groups[1][1], 256))
    with pytest.raises(SynthError, match="numpy reference"):
        check_runs(Goal.ALLREDUCE, rows, range(WIDE.k), broken)


def test_an_allgather_goal_with_a_wide_step_is_checked_and_a_fault_caught():
    """The AllGather goal: across the nodes, then inside; the wide step's
    groups hold distinct lists, and one swapped is caught."""
    program = parse_program("AllGather(node, parallel(root))\nAllGather(node, inside)")
    traced = trace(program, WIDE, Goal.ALLGATHER)
    reference = _reference_chunks(program, WIDE, Goal.ALLGATHER)
    assert [[expand(r) for r in t.runs] for t in traced.steps] == reference
    steps, rows = _steps(traced), np.arange(WIDE.k)[None, :]
    assert check_runs(Goal.ALLGATHER, rows, traced.owned, steps) > 0
    broken = _plant(steps, 1, 7, _swap_parts(steps[1][1][7][1], 2))
    with pytest.raises(SynthError, match="numpy reference"):
        check_runs(Goal.ALLGATHER, rows, traced.owned, broken)
