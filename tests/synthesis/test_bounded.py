"""The enumerator (synth.synthesis.search) against an independent z3 bounded search
(synth.synthesis.bounded): same valid programs up to the step limit on small hierarchies,
plus paired valid/invalid programs and unit checks of the z3 rules."""

from __future__ import annotations

import pytest
import z3

from synth.synthesis.bounded import DevState, bounded_programs, concrete, effects, instructions, is_valid, transitions
from synth.synthesis.language import Collective
from synth.synthesis.search import synthesize
from synth.synthesis.semantics import Goal, Hierarchy

NAMES = {1: ("gpu",), 2: ("node", "gpu"), 3: ("rack", "node", "gpu")}


def hierarchy(*sizes: int) -> Hierarchy:
    return Hierarchy(NAMES[len(sizes)], sizes)


def enumerated(h: Hierarchy, goal: Goal, max_steps: int) -> set[tuple[str, ...]]:
    return {tuple(str(i) for i in p.instructions) for p in synthesize(h, goal, max_steps)[0]}


LIMITS = [((2,), 5), ((3,), 5), ((4,), 5), ((2, 2), 5), ((2, 3), 4), ((3, 2), 4), ((2, 2, 2), 3)]
# three levels, or six devices at four steps: seconds to a minute of CPU each (the fast loop leaves them out)
SLOW = {(2, 2, 2), (3, 2)}
CASES = [pytest.param(sizes, steps, goal, marks=[pytest.mark.slow] if sizes in SLOW else [])
         for sizes, steps in LIMITS for goal in Goal] + [pytest.param((2, 2, 2), 4, Goal.ALLGATHER, marks=pytest.mark.slow)]


@pytest.mark.parametrize("sizes,max_steps,goal", CASES, ids=lambda v: getattr(v, "value", str(v)))
def test_enumerator_finds_exactly_the_valid_programs(sizes, max_steps, goal):
    h = hierarchy(*sizes)
    bounded = bounded_programs(h, goal, max_steps)
    found = enumerated(h, goal, max_steps)
    assert not bounded - found, f"missed by the enumerator: {sorted(bounded - found)[:5]}"
    assert not found - bounded, f"invalid but enumerated: {sorted(found - bounded)[:5]}"
    assert bounded  # the flat one-step collective is always there


@pytest.mark.parametrize(
    "sizes,goal,program",
    [
        ((2, 2), Goal.ALLREDUCE, "AllReduce(root, inside)"),
        ((2, 2), Goal.REDUCESCATTER, "ReduceScatter(root, inside)"),
        ((2, 2), Goal.ALLGATHER, "AllGather(root, inside)"),
        ((2, 2, 2), Goal.REDUCESCATTER, "ReduceScatter(root, inside)"),
    ],
)
def test_one_step_only_the_flat_collective(sizes, goal, program):
    assert bounded_programs(hierarchy(*sizes), goal, 1) == {(program,)}


BLUECONNECT = ["ReduceScatter(node, inside)", "AllReduce(node, parallel(root))", "AllGather(node, inside)"]


@pytest.mark.parametrize(
    "sizes,goal,program,valid",
    [
        ((2, 2), Goal.ALLREDUCE, ["Reduce(root, inside)", "Broadcast(root, inside)"], True),
        ((2, 2), Goal.ALLREDUCE, ["Reduce(root, inside)"], False),  # others hold nothing
        ((2, 2), Goal.ALLREDUCE, BLUECONNECT, True),
        ((2, 2), Goal.ALLREDUCE, BLUECONNECT[:2], False),  # shards not gathered
        ((2, 2), Goal.ALLREDUCE, ["AllReduce(node, inside)", "AllReduce(node, inside)"], False),  # double counting
        ((2, 2), Goal.ALLREDUCE, ["AllGather(root, inside)"], False),  # chunks overlap
        ((2, 3), Goal.REDUCESCATTER, ["ReduceScatter(node, inside)", "ReduceScatter(node, parallel(root))"], True),
        ((2, 3), Goal.REDUCESCATTER, ["ReduceScatter(node, parallel(root))", "ReduceScatter(node, inside)"], True),
        ((2, 3), Goal.REDUCESCATTER, ["ReduceScatter(node, inside)", "ReduceScatter(node, inside)"], False),  # shards differ
        ((2, 2), Goal.ALLGATHER, ["AllGather(node, inside)", "AllGather(node, parallel(root))"], True),
        ((2, 2), Goal.ALLGATHER, ["Broadcast(root, inside)"], False),  # members not in the root
        # issue 12 item 15: the AllGather's second group holds nothing and stays idle
        ((2, 2), Goal.ALLREDUCE, ["ReduceScatter(node, inside)", "Reduce(node, parallel(root))",
                                  "AllGather(node, inside)", "Broadcast(node, parallel(root))"], True),
        ((2, 2), Goal.ALLREDUCE, ["ReduceScatter(node, inside)", "Reduce(node, parallel(root))",
                                  "AllGather(node, inside)"], False),  # the idle devices never get the sum
    ],
)
def test_paired_valid_and_invalid_programs(sizes, goal, program, valid):
    h = hierarchy(*sizes)
    assert is_valid(h, goal, program) is valid
    assert (tuple(program) in enumerated(h, goal, len(program))) is valid


def test_no_program_starts_with_a_failing_precondition():
    programs = bounded_programs(hierarchy(2, 2), Goal.ALLREDUCE, 3)
    assert programs
    assert not [p for p in programs if p[0].startswith(("AllGather", "Broadcast"))]


def test_merged_instruction_text_is_rejected():
    with pytest.raises(ValueError):  # the same groups as AllReduce(root, inside)
        is_valid(hierarchy(2, 2), Goal.ALLREDUCE, ["AllReduce(gpu, parallel(root))"])


# ---------------------------------------------------------------- the z3 rules on concrete groups


def holds(expr: z3.BoolRef) -> bool:
    return z3.is_true(z3.simplify(expr))


def contents(s: DevState) -> dict[int, set[int]]:
    """Chunk -> contributor set of a concrete result."""
    out = {x: {e for e, v in enumerate(row) if holds(v)} for x, row in enumerate(s.has)}
    return {x: c for x, c in out.items() if c}


def apply(collective: Collective, *members: dict[int, set[int]], k: int = 4):
    pre, results = effects([concrete(k, m) for m in members])[collective]
    return holds(pre), [contents(r) for r in results]


def test_reducescatter_splits_held_chunks_in_increasing_order():
    ok, out = apply(Collective.REDUCESCATTER, {1: {0}, 3: {0}}, {1: {1}, 3: {1}})
    assert ok and out == [{1: {0, 1}}, {3: {0, 1}}]
    ok, _ = apply(Collective.REDUCESCATTER, {0: {0}, 1: {0}, 2: {0}}, {0: {1}, 1: {1}, 2: {1}})
    assert not ok  # 3 chunks do not split into 2 parts


def test_summing_rejects_double_counting_and_different_chunks():
    assert not apply(Collective.ALLREDUCE, {0: {0, 1}}, {0: {1}})[0]
    assert not apply(Collective.REDUCE, {0: {0}}, {1: {1}})[0]
    ok, out = apply(Collective.REDUCE, {0: {0}, 2: {2}}, {0: {1}, 2: {3}})
    assert ok and out == [{0: {0, 1}, 2: {2, 3}}, {}]


def test_allgather_needs_disjoint_chunk_sets_of_equal_size():
    assert not apply(Collective.ALLGATHER, {0: {0}, 1: {0}}, {2: {2}})[0]
    assert not apply(Collective.ALLGATHER, {0: {0}}, {0: {1}})[0]
    ok, out = apply(Collective.ALLGATHER, {0: {0}, 1: {0}}, {2: {2}, 3: {2}})
    assert ok and out == [{0: {0}, 1: {0}, 2: {2}, 3: {2}}] * 2
    assert apply(Collective.ALLGATHER, {}, {}) == (True, [{}, {}])  # empty sets: disjoint, of equal size
    assert not apply(Collective.ALLGATHER, {}, {1: {1}})[0]


def test_a_step_that_changes_nothing_has_no_model():
    """The no-change rule, encoded independently: from a state where both
    devices hold nothing, an AllGather over both satisfies its precondition
    but changes nothing, so it is not a step."""
    h = hierarchy(2)
    steps = instructions(h)
    gather = next(i for i, s in enumerate(steps) if s.collective is Collective.ALLGATHER)
    before = (concrete(2, {}), concrete(2, {}))
    after = tuple(concrete(2, {}) for _ in range(2))
    op = z3.Int("op")
    solver = z3.Solver()
    solver.add(transitions(steps, op, before, after))
    assert solver.check(op == len(steps)) == z3.sat  # STOP keeps the state
    assert solver.check(op == gather) == z3.unsat


def test_broadcast_needs_containment_and_a_gain():
    root = {0: {0, 1}, 1: {0, 1}}
    assert apply(Collective.BROADCAST, root, {0: {1}}) == (True, [root, root])
    assert not apply(Collective.BROADCAST, root, root)[0]  # nobody gains
    assert not apply(Collective.BROADCAST, root, {2: {2}})[0]  # not in the root
