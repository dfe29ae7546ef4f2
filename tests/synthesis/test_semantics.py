"""Groups, collective rules (valid/invalid pairs), and the state search."""

import itertools
import math
from dataclasses import replace
from collections import Counter
from collections.abc import Iterator

import numpy as np
import pytest

from synth.synthesis.language import Collective, Form, format_program, parse_program
from synth.synthesis.search import instruction_set, synthesize
from synth.synthesis.semantics import (
    NO_CHANGE,
    Goal,
    Hierarchy,
    apply_collective,
    apply_step,
    distinct_groupings,
    groups_of,
    initial_state,
    is_goal,
    may_finish_in_one_step,
    profile_of,
    resolve,
    runs_of,
    step_load,
)
from synth.synthesis.statespace import Packed, SearchTuning, StateSpace
from synth.synthesis.statespace.lookahead import Quantities

AR, RS, AG, RED, BC = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER,
                       Collective.REDUCE, Collective.BROADCAST)


def H(*sizes):
    return Hierarchy(tuple("abcdefg"[: len(sizes)]), tuple(sizes))


def test_groups_follow_the_design_definitions():
    sizes = (2, 3)  # device index = 3*c1 + c2
    assert groups_of(sizes, 0, Form.INSIDE, None) == ((0, 1, 2, 3, 4, 5),)
    assert groups_of(sizes, 1, Form.INSIDE, None) == ((0, 1, 2), (3, 4, 5))
    assert groups_of(sizes, 1, Form.PARALLEL, 0) == ((0, 3), (1, 4), (2, 5))
    assert groups_of(sizes, 1, Form.MASTER, 0) == ((0, 3),)
    assert groups_of(sizes, 2, Form.INSIDE, None) == ()  # leaves: no-op
    assert groups_of(sizes, 2, Form.PARALLEL, 1) == ((0, 1, 2), (3, 4, 5))
    # three levels: (2, parallel(0)) varies c1,c2 and fixes c3
    assert groups_of((2, 2, 2), 2, Form.PARALLEL, 0) == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert groups_of((2, 2, 2), 2, Form.MASTER, 1) == ((0, 2), (4, 6))


def test_distinct_groupings_merge_instructions_with_equal_groups():
    h = H(2, 3)
    shapes = [(g.level, g.form, g.ancestor) for g in distinct_groupings(h)]
    # root inside, a inside, a parallel(root), a master(root); every b-slice
    # instruction repeats one of these or is a no-op
    assert shapes == [(0, Form.INSIDE, None), (1, Form.INSIDE, None),
                      (1, Form.PARALLEL, 0), (1, Form.MASTER, 0)]
    assert len(instruction_set(h)) == 4 * len(Collective)


def test_resolve_rejects_bad_levels():
    with pytest.raises(Exception, match="not in the synthesis hierarchy"):
        resolve(parse_program("AllReduce(rack, inside)").instructions[0], H(2, 2))
    with pytest.raises(Exception, match="needs a level above"):
        resolve(parse_program("AllReduce(a, parallel(b))").instructions[0], H(2, 2))


def _state(k, *devices):
    """Device states from lists of (first, stop, set of contributors)."""
    from synth.synthesis.semantics import from_runs
    return [from_runs([(a, b, sum(1 << d for d in ds)) for a, b, ds in runs], k) for runs in devices]


@pytest.mark.parametrize(
    "collective,members,ok",
    [
        (AR, [[(0, 2, {0})], [(0, 2, {1})]], True),
        (AR, [[(0, 2, {0, 1})], [(0, 2, {1})]], False),           # double counting
        (AR, [[(0, 1, {0})], [(1, 2, {1})]], False),              # different chunks
        (RS, [[(0, 2, {0})], [(0, 2, {1})]], True),
        (RS, [[(0, 1, {0})], [(0, 1, {1})]], False),              # 1 chunk, 2 parts
        (AG, [[(0, 1, {0})], [(1, 2, {1})]], True),
        (AG, [[(0, 1, {0})], [(0, 1, {1})]], False),              # overlapping chunks
        (AG, [[(0, 1, {0})], [(1, 3, {1})]], False),              # unequal sizes
        (AG, [[], []], True),                                     # nothing held: the union is nothing
        (AG, [[], [(0, 1, {1})]], False),                         # unequal sizes (0 and 1)
        (RED, [[(0, 2, {0})], [(0, 2, {1})]], True),
        (RED, [[], [(0, 2, {1})]], False),
        (BC, [[(0, 2, {0, 1})], []], True),
        (BC, [[(0, 2, {0, 1})], [(0, 2, {1})]], True),           # subset: overwritten
        (BC, [[(0, 2, {0})], [(0, 2, {1})]], False),              # not contained
        (BC, [[(0, 2, {0})], [(0, 2, {0})]], False),              # no information gain
    ],
)
def test_collective_preconditions(collective, members, ok):
    result = apply_collective(collective, _state(2, *members))
    assert isinstance(result, list) == ok, result


def test_collective_effects():
    a, b = _state(4, [(0, 4, {0})], [(0, 4, {1})])
    rs = apply_collective(RS, [a, b])
    assert [runs_of(s) for s in rs] == [[(0, 2, 0b11)], [(2, 4, 0b11)]]
    red = apply_collective(RED, [a, b])
    assert runs_of(red[0]) == [(0, 4, 0b11)] and runs_of(red[1]) == []
    ag = apply_collective(AG, rs)
    assert [runs_of(s) for s in ag] == [[(0, 4, 0b11)]] * 2


def test_step_leaves_devices_outside_groups_alone():
    state = initial_state(Goal.ALLREDUCE, 4)
    after = apply_step(state, AR, [(0, 2)])  # a master-style partial step
    assert after[1] == state[1] and after[3] == state[3]
    assert runs_of(after[0]) == [(0, 4, 0b0101)] == runs_of(after[2])


def _brute_force(h, goal, max_steps):
    """Every instruction string, checked step by step: the definition itself."""
    instructions = [(i, resolve(i, h).groups) for i in instruction_set(h)]
    found = set()
    for n in range(1, max_steps + 1):
        for seq in itertools.product(instructions, repeat=n):
            state = initial_state(goal, h.k)
            for instruction, groups in seq:
                state = apply_step(state, instruction.collective, groups)
                if isinstance(state, str):
                    break
            else:
                if is_goal(state, goal):
                    found.add(tuple(str(i) for i, _ in seq))
    return found


@pytest.mark.parametrize("sizes,steps", [((4,), 4), pytest.param((2, 2), 4, marks=pytest.mark.slow), ((2, 3), 3),
                                         pytest.param((2, 2, 2), 3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("goal", list(Goal))
def test_state_search_equals_string_enumeration(sizes, steps, goal):
    h = H(*sizes)
    programs, stats = synthesize(h, goal, steps)
    assert {tuple(str(i) for i in p.instructions) for p in programs} == _brute_force(h, goal, steps)
    assert len(set(programs)) == len(programs) == stats.programs
    assert [len(p) for p in programs] == sorted(len(p) for p in programs)


def test_two_level_reduction_includes_the_classic_programs():
    h = Hierarchy(("node", "gpu"), (2, 8))
    texts = {format_program(p, " ; ") for p in synthesize(h, Goal.ALLREDUCE, 5)[0]}
    for required in [
        "AllReduce(root, inside)",
        "ReduceScatter(node, inside) ; AllReduce(node, parallel(root)) ; AllGather(node, inside)",
        "Reduce(node, inside) ; AllReduce(node, master(root)) ; Broadcast(node, inside)",
        "AllReduce(node, inside) ; AllReduce(node, parallel(root))",
    ]:
        assert required in texts


def test_reducescatter_and_allgather_goals():
    h = Hierarchy(("node", "gpu"), (2, 4))
    rs = {format_program(p, " ; ") for p in synthesize(h, Goal.REDUCESCATTER, 3)[0]}
    assert rs == {
        "ReduceScatter(root, inside)",
        "ReduceScatter(node, inside) ; ReduceScatter(node, parallel(root))",
        "ReduceScatter(node, parallel(root)) ; ReduceScatter(node, inside)",
    }
    ag = {format_program(p, " ; ") for p in synthesize(h, Goal.ALLGATHER, 2)[0]}
    assert ag == {
        "AllGather(root, inside)",
        "AllGather(node, inside) ; AllGather(node, parallel(root))",
        "AllGather(node, parallel(root)) ; AllGather(node, inside)",
    }


def test_single_device_reduction_is_the_empty_program():
    programs, _ = synthesize(Hierarchy((), ()), Goal.ALLREDUCE, 3)
    assert [len(p) for p in programs] == [0]


def test_4096_devices_state_stays_compact():
    """[node x512, gpu x8] over every device: the same programs as [2, 8] and
    states of a few runs per device, not k x k bits."""
    big = Hierarchy(("node", "gpu"), (512, 8))
    small = Hierarchy(("node", "gpu"), (2, 8))
    big_programs, stats = synthesize(big, Goal.ALLREDUCE, 3)
    small_programs, _ = synthesize(small, Goal.ALLREDUCE, 3)
    assert [format_program(p) for p in big_programs] == [format_program(p) for p in small_programs]
    assert stats.states < 100
    state = initial_state(Goal.ALLREDUCE, big.k)
    for instruction in parse_program("ReduceScatter(node, inside)\nAllReduce(node, parallel(root))").instructions:
        state = apply_step(state, instruction.collective, resolve(instruction, big).groups)
        assert not isinstance(state, str)
        assert max(len(s[0]) for s in state) <= 3


# ---------------------------------------------------------------- no-op steps (docs/model.md)


def test_an_allgather_of_empty_members_is_a_noop_group_but_not_a_step():
    """The AllGather rule (pairwise disjoint chunk sets of equal size)
    holds for members that all hold nothing: that group stays as it is. A step
    must still change some device."""
    empty = ((2,), (0,))
    assert apply_step((empty, empty), AG, ((0, 1),)) == NO_CHANGE
    # one group gathers, the other holds nothing: a valid step, the idle group unchanged
    k = 4
    a, b, nothing = _state(k, [(0, 2, {0, 1})], [(2, 4, {0, 1})], [])
    after = apply_step((a, b, nothing, nothing), AG, ((0, 1), (2, 3)))
    assert [runs_of(s) for s in after] == [[(0, 4, 0b11)]] * 2 + [[]] * 2


def test_device_0_never_empties_so_no_allgather_step_is_a_noop():
    """Every grouping has a group holding device 0, and device 0 (the root of
    every group it is in) always holds data: so the no-change rule never
    removes a program today; it is stated so that no self-loop can appear."""
    for sizes in [(2, 2), (2, 3), (2, 2, 2), (3, 2)]:
        h = H(*sizes)
        assert all(0 in g.groups[0] for g in distinct_groupings(h))
        for goal in Goal:
            space = StateSpace(sizes, goal)
            for state in _reachable(space, 3):
                assert runs_of(space.absolute(state)[0]), state


def test_the_issue_example_uses_an_idle_allgather_group():
    h = H(2, 2)
    program = parse_program("ReduceScatter(a, inside) ; Reduce(a, parallel(root)) ; AllGather(a, inside) ; "
                            "Broadcast(a, parallel(root))")
    texts = {format_program(p) for p in synthesize(h, Goal.ALLREDUCE, 5)[0]}
    assert format_program(program) in texts
    state = initial_state(Goal.ALLREDUCE, 4)
    for instruction in program.instructions[:2]:
        state = apply_step(state, instruction.collective, resolve(instruction, h).groups)
    assert [runs_of(s) for s in state][2:] == [[], []]  # the second subtree's devices hold nothing
    assert not isinstance(apply_step(state, AG, resolve(program.instructions[2], h).groups), str)


# ---------------------------------------------------------------- the state space against the rules


def _check_space_against_rules(space: StateSpace, steps: int) -> int:
    """Assert that ``space`` computes exactly the reference rules (apply_step
    on absolute states) on every state reachable in ``steps`` steps: the same
    valid steps, next states and loads; returns how many states it checked."""
    h = space.hierarchy
    assert space.absolute(space.start) == initial_state(space.goal, h.k)
    checked = 0
    for state in _reachable(space, steps):
        absolute = space.absolute(state)
        got = {(g, c): (space.absolute(new), loads)
               for g, c, new, loads in space.successors(state, list(Collective))}
        want = {}
        for g, grouping in enumerate(space.groupings):
            for c in Collective:
                new = apply_step(absolute, c, grouping.groups)
                if not isinstance(new, str):
                    want[g, c] = (new, tuple(step_load(c, [absolute[d] for d in group])
                                             for group in grouping.groups))
        assert got == want, (space.frame, absolute)
        assert space.is_goal(state) == is_goal(absolute, space.goal)
        checked += 1
    return checked


def _reachable(space: StateSpace, steps: int, seen: set | None = None) -> Iterator[tuple[int, ...]]:
    """Every state of ``space`` reachable in fewer than ``steps`` steps,
    breadth first, each once (a state is expanded after the caller has looked
    at it); ``seen`` receives every state reached within ``steps`` steps."""
    seen = set() if seen is None else seen
    seen.add(space.start)
    frontier = [space.start]
    for _ in range(steps):
        nxt = []
        for state in frontier:
            yield state
            for _, _, new, _ in space.successors(state, list(Collective)):
                if new not in seen:
                    seen.add(new)
                    nxt.append(new)
        frontier = nxt


@pytest.mark.parametrize("sizes", [(4,), (2, 2), (2, 3), (3, 2), (2, 2, 2)])
@pytest.mark.parametrize("goal", list(Goal))
def test_every_frame_of_the_state_space_follows_the_rules(sizes, goal):
    """The interned, frame-relative state space computes exactly the reference
    rules, in every frame it can use, on every state reachable in 3 steps."""
    frames = ["chunk"] if goal is Goal.ALLGATHER else ["device", "absolute"]
    for frame in frames:
        _check_space_against_rules(StateSpace(sizes, goal, frame), 3)


@pytest.mark.parametrize("sizes, steps", [((2, 2, 2), 4), ((2, 4), 4), ((4, 2), 4), ((2, 3, 2), 3)])
@pytest.mark.parametrize("goal", [Goal.ALLREDUCE, Goal.REDUCESCATTER])
@pytest.mark.parametrize("by_value", [True, False])
def test_groups_that_are_chunk_shifts_of_one_another_share_one_computation(sizes, steps, goal, by_value):
    """In the device frame a group whose members hold nothing below some chunk
    is computed once moved down to chunk 0 and shared with every group that is
    a shift of it (after a ReduceScatter every device holds other chunks). The
    space still follows the rules exactly, one step deeper than above, and the
    sharing happens: fewer groups are computed than the groups looked up.
    States interned by value and by mask ids (what large spaces use) alike."""
    space = StateSpace(sizes, goal, "device", by_value)
    computed = []
    compute_here = space._compute_here
    space._compute_here = lambda g, c, key: computed.append(key) or compute_here(g, c, key)
    assert _check_space_against_rules(space, steps) > 20
    looked_up = sum(len(memo) for memos in space._memos for memo in memos)
    shifted = sum(len(memo) for memos in space._shifted_memos for memo in memos)
    assert shifted > 0 and len(computed) < looked_up
    # a state is stored once for every chunk position it is seen at ("Positions")
    ids = list(space.device_states)
    assert len({i // space._stride for i in ids}) < len(ids)
    from synth.synthesis.semantics import shifted
    from synth.synthesis.statespace.positions import first_held
    for i in ids:
        s, first = space.device_states[i], i % space._stride - 1
        assert first_held(s) == first and space.runs(i) == runs_of(s) and space.intern(s) == i
        if first > 0:  # the same shape at chunk 0 has the id of this one less first
            assert space.device_states[i - first] == shifted(s, -first, space.k)


def test_a_chunk_shift_moves_every_held_run_and_keeps_states_canonical():
    """shifted moves held runs by x chunks (there and back gives the state
    back, chunk by chunk the masks move) and first_held finds the first held
    chunk; random states, seeded."""
    import random

    from synth.synthesis.semantics import make_state, shifted
    from synth.synthesis.statespace.positions import first_held

    rng = random.Random(11)
    k = 16
    for _ in range(2000):
        stops = sorted(rng.sample(range(1, k), rng.randint(0, 6))) + [k]
        s = make_state(stops, [rng.choice((0, 0, 0b1, 0b110, 0b1011)) for _ in stops])
        per_chunk = [0] * k
        for first, stop, mask in runs_of(s):
            per_chunk[first:stop] = [mask] * (stop - first)
        held = [c for c in range(k) if per_chunk[c]]
        assert first_held(s) == (held[0] if held else -1)
        if not held:
            continue
        room = k - 1 - held[-1]
        for x in {-held[0], 0, room}:
            moved = shifted(s, x, k)
            want = [0] * k
            for c in held:
                want[c + x] = per_chunk[c]
            got = [0] * k
            for first, stop, mask in runs_of(moved):
                got[first:stop] = [mask] * (stop - first)
            assert got == want
            assert moved == make_state(*zip(*[(c + 1, m) for c, m in enumerate(want)]))  # canonical runs
            assert shifted(moved, -x, k) == s


def test_interning_does_not_depend_on_which_mask_objects_a_state_holds():
    """Device states are interned by value; in large spaces masks are looked up
    by identity first, so two equal states built from different int objects
    must still get one id."""
    # states keyed by value below tuning.device_frame_from devices, by mask ids from it
    for sizes in [(2, 4), (2, 256)]:
        _check_interning(StateSpace(sizes, Goal.ALLREDUCE, "device"))


def _check_interning(space: StateSpace) -> None:
    k = space.k
    big_a = ((4, k), ((1 << 70) - 1, 0))
    big_b = ((4, k), (int("1" * 70, 2), 0))
    assert big_a[1][0] is not big_b[1][0] and big_a == big_b
    assert space.intern(big_a) == space.intern(big_b)
    assert space.device_states[space.intern(big_b)] == big_a
    assert space.intern(((4, k), ((1 << 69) - 1, 0))) != space.intern(big_a)


def test_containment_walk_agrees_with_a_chunk_by_chunk_check():
    """The Broadcast precondition walks both run lists at once; it must say
    what comparing every chunk's contributor masks says, on states with runs
    that end at different places (random, seeded)."""
    import random

    from synth.synthesis.semantics import contains, make_state

    rng = random.Random(7)
    k = 12

    def random_state():
        stops = sorted(rng.sample(range(1, k), rng.randint(0, 5))) + [k]
        return make_state(stops, [rng.choice((0, 0b1, 0b11, 0b110, 0b111, 0b1111)) for _ in stops])

    def per_chunk(s):
        out, first = [], 0
        for stop, mask in zip(*s):
            out += [mask] * (stop - first)
            first = stop
        return out

    outcomes = set()
    for _ in range(3000):
        big, small = random_state(), random_state()
        want = all(b & m == m for b, m in zip(per_chunk(big), per_chunk(small)))
        assert contains(big, small) == want, (big, small)
        outcomes.add(want)
    assert outcomes == {True, False}


@pytest.mark.parametrize("sizes, frame", [((2, 2, 2), "absolute"), ((2, 2, 2), "device"), ((2, 3, 2), "absolute"),
                                          ((4, 2), "device"), ((4, 4), "device"), ((2, 2, 2, 2), "absolute")])
@pytest.mark.parametrize("goal", [Goal.ALLREDUCE, Goal.REDUCESCATTER])
def test_lookahead_keeps_exactly_the_steps_whose_next_state_can_finish_or_is_the_goal(sizes, frame, goal):
    """The search's lookahead judges a step before any group is looked at: for
    the AllReduce goal on sums over fixed sets of devices (``_hopeful``), for
    the others on packed profile counts (memoised per group, Broadcast taking
    the root's profile without the rules) after ``_hopeful``'s validity
    bounds. Either way it must keep exactly the valid steps whose next state
    may finish in one step ("finish") or is the goal ("goal"), on every state
    reachable in 3 steps; and for the AllReduce goal ``_hopeful`` must turn
    valid steps away before any group is looked at."""
    space = StateSpace(sizes, goal, frame)
    seen: set = set()
    kept = turned_away = 0
    for state in _reachable(space, 3, seen):
        every = space.successors(state, list(Collective))
        finish = [s for s in every if space.may_finish(s[2])]
        goal = [s for s in every if space.is_goal(s[2])]
        assert space.successors(state, list(Collective), "finish") == finish
        assert space.successors(state, list(Collective), "goal") == goal
        kept += len(finish) + len(goal)
        palette = list(dict.fromkeys(state))
        sums = space._grouping_sums(space._set_counts(np.array([palette.index(i) for i in state]), len(palette)),
                                    palette)
        hopeful = space._hopeful("finish", sums)
        turned_away += sum(1 for g, c, _, _ in every if not hopeful[g] >> list(Collective).index(c) & 1)
    assert kept > 0 and len(seen) > 30 and (turned_away > 0 or goal is not Goal.ALLREDUCE)


@pytest.mark.parametrize("sizes, frame", [((2, 2, 2), "absolute"), ((2, 3, 2), "absolute"), ((4, 2), "device"),
                                          ((4, 4), "device")])
def test_grouping_sums_count_the_devices_of_each_set(sizes, frame):
    """The lookahead's grouping sums (per grouping: its group 0's, its roots'
    and its members' devices holding every chunk, complete, held chunks, mass,
    holding nothing, held chunks squared; device 0's alone; every device's)
    equal the same quantities summed over the devices of the absolute state,
    on every state reachable in 3 steps, in floats and in integers alike."""
    space = StateSpace(sizes, Goal.ALLREDUCE, frame)
    k = space.k
    for state in _reachable(space, 3):
        absolute = space.absolute(state)

        def quantities(devices):
            holds_all = complete = held_total = mass = empty = squared = 0
            for d in devices:
                runs = [(b - a, mask.bit_count()) for a, b, mask in runs_of(absolute[d]) if mask]
                held = sum(n for n, _ in runs)
                holds_all += held == k
                complete += all(count == k for _, count in runs)
                held_total += held
                mass += sum(n * count for n, count in runs)
                empty += held == 0
                squared += held * held
            return Quantities(holds_all=holds_all, complete=complete, held=held_total, mass=mass, empty=empty,
                              held_squared=squared)

        palette = list(dict.fromkeys(state))
        labels = np.array([palette.index(i) for i in state])
        sums = space._grouping_sums(space._set_counts(labels, len(palette)), palette)
        space._exact_in_floats = False  # as from 208,064 devices, where sums of k**3 need 64-bit integers
        assert space._grouping_sums(space._set_counts(labels, len(palette)), palette) == sums
        space._exact_in_floats = True
        device0, everything, per_grouping = space._named_sums(sums)
        assert device0 == quantities([0])
        assert everything == quantities(range(k))
        for grouping, (first, roots, members) in zip(space.groupings, per_grouping):
            groups = grouping.groups
            assert first == quantities(groups[0])
            assert roots == quantities([group[0] for group in groups])
            assert members == quantities([d for group in groups for d in group])


@pytest.mark.parametrize("sizes, frame", [((2, 2, 2), "absolute"), ((2, 2, 2), "device"), ((2, 3, 2), "absolute"),
                                          ((4, 2), "device"), ((4, 4), "device"), ((2, 2, 2, 2), "absolute")])
def test_may_finish_is_necessary_and_checks_the_mass_a_last_step_needs(sizes, frame):
    """``may_finish`` (on packed profile counts) is ``may_finish_in_one_step``
    (on absolute states), and it is necessary: every reachable state (4 steps)
    from which one valid step reaches the goal passes it. Beyond "every device
    holds every chunk, or every held sum is complete, or device 0 is done"
    it asks for the mass a last AllReduce or AllGather needs (contributors
    summed over devices and chunks: ``(G + k - n) * k**2`` for a grouping of
    ``G`` groups over ``n`` devices), and that turns some states away."""
    space = StateSpace(sizes, Goal.ALLREDUCE, frame)
    k = space.k
    full = (1 << k) - 1
    finishing = stronger = 0
    for state in _reachable(space, 5):
        absolute = space.absolute(state)
        reaches = any(space.is_goal(new) for _, _, new, _ in space.successors(state, list(Collective)))
        want = may_finish_in_one_step(absolute, Goal.ALLREDUCE, space.hierarchy)
        assert space.may_finish(state) == want, absolute
        assert want or not reaches, absolute
        masks = [m for s in absolute for m in s[1]]
        counts_only = (all(masks) or all(m in (0, full) for m in masks)
                       or absolute[0] == ((k,), (full,)))
        assert want <= counts_only
        finishing += reaches
        stronger += counts_only and not want
    assert finishing > 0 and stronger > 0


def test_held_chunk_runs_agree_with_chunk_sets():
    """The shape checks work on merged runs of held chunks (a bitmask per
    member would cost k bits each): containment, union size and counts must
    say what the chunk sets say; random states, seeded."""
    import random

    from synth.synthesis.semantics import (
        held_count,
        held_runs,
        make_state,
        runs_within,
        shape_bits,
        shape_reason,
        union_count,
    )

    rng = random.Random(5)
    k = 14

    def random_state():
        stops = sorted(rng.sample(range(1, k), rng.randint(0, 6))) + [k]
        return make_state(stops, [rng.choice((0, 0, 0b1, 0b10, 0b11)) for _ in stops])

    def chunks(s):
        return {c for first, stop, _ in runs_of(s) for c in range(first, stop)}

    outcomes, passing = set(), set()
    for _ in range(3000):
        states = [random_state() for _ in range(rng.randint(1, 4))]
        runs = [held_runs(s) for s in states]
        sets = [chunks(s) for s in states]
        for r, c in zip(runs, sets):
            assert held_count(r) == len(c)
            assert {x for a, b in r for x in range(a, b)} == c
            assert all(b1 < a2 for (_, b1), (a2, _) in zip(r, r[1:]))  # merged: no touching runs
        assert union_count(runs) == len(set().union(*sets))
        assert runs_within(runs[-1], runs[0]) == (sets[-1] <= sets[0])
        outcomes.add(sets[-1] <= sets[0])
        size = len(runs) + rng.randint(0, 1)  # a state given once for two members, sometimes
        want = sum(1 << i for i, c in enumerate(Collective) if shape_reason(c, runs, size) is None)
        assert shape_bits(runs, size) == want, (runs, size)
        passing.add(want)
    assert outcomes == {True, False}
    assert len(passing) >= 4  # several different combinations of passing collectives were met


def test_moving_a_state_to_chunk_0_and_back_agrees_with_a_chunk_shift():
    """The device frame's positions (moved_down to chunk 0, moved_to a first
    chunk) are shifted without building runs: the same canonical states on random
    states, seeded, including ones that hold the last chunk."""
    import random

    from synth.synthesis.semantics import make_state, shifted
    from synth.synthesis.statespace.positions import first_held, moved_down, moved_to

    rng = random.Random(5)
    k = 16
    for _ in range(3000):
        stops = sorted(rng.sample(range(1, k), rng.randint(0, 6))) + [k]
        s = make_state(stops, [rng.choice((0, 0, 0b1, 0b110, 0b1011)) for _ in stops])
        first = first_held(s)
        if first <= 0:
            continue
        base = moved_down(s, first, k)
        assert base == shifted(s, -first, k) and first_held(base) == 0
        assert moved_to(base, first, k) == s
        last = max(b for a, b, _ in runs_of(base))
        for x in range(1, k - last + 1):
            assert moved_to(base, x, k) == shifted(base, x, k)


@pytest.mark.parametrize("sizes", [(32,), (16, 2), (2, 16), (4, 8)])
@pytest.mark.parametrize("goal", [Goal.ALLREDUCE, Goal.REDUCESCATTER])
@pytest.mark.parametrize("numpy_counts_from, few", [(2048, 16), (2, 16), (2048, 2)])
def test_the_device_frame_follows_the_rules_on_groups_of_many_positions(sizes, goal, numpy_counts_from, few):
    """Groups of more than few_profiles_upto (16) members that hold one run at
    many positions (a ReduceScatter's parts) are checked, split and gathered
    without building each member's state ("Positions"): the space still
    follows the rules exactly, and those paths ran; also with the members'
    profiles counted with numpy from 2 members on (numpy_counts_from lowered),
    and with the positions' check from 3 distinct profiles on
    (few_profiles_upto lowered to 2)."""
    tuning = SearchTuning(numpy_counts_from=numpy_counts_from, few_profiles_upto=few)
    space = StateSpace(sizes, goal, "device", tuning=tuning)
    copies, splits, gathers = [], [], []
    positions_shape, split_ids, gathered = space._positions_shape, space._split_ids, space._gathered
    space._positions_shape = lambda *args: copies.append(positions_shape(*args)) or copies[-1]
    space._split_ids = lambda total, parts: splits.append(split_ids(total, parts)) or splits[-1]
    space._gathered = lambda grouping, key: gathers.append(gathered(grouping, key)) or gathers[-1]
    assert _check_space_against_rules(space, 3) >= 4
    if max(sizes) > few:
        assert copies
    assert any(ids is not None for ids in splits)
    assert any(s is not None for s in gathers)


@pytest.mark.parametrize("sizes, steps", [((2, 2, 2), 4), ((2, 4), 4), ((4, 2), 4), ((16, 2), 3), ((2, 3, 2), 3)])
@pytest.mark.parametrize("goal", [Goal.ALLREDUCE, Goal.REDUCESCATTER])
def test_groupings_of_many_groups_stepped_with_numpy_follow_the_rules(sizes, steps, goal):
    """Groupings of many groups are stepped with numpy in the device frame
    (groups classed up to chunk shifts, one look-up per class): with the
    threshold lowered to 2 groups the space still follows the rules exactly,
    with and without the lookahead, and the numpy path ran."""
    # every state on the per-device path (no patterns)
    vectors = SearchTuning(vector_groups_from=2, pattern_ids_upto=0)
    space = StateSpace(sizes, goal, "device", tuning=vectors)
    stepped = []
    vector = space._vector_successors
    space._vector_successors = lambda g, *rest: stepped.append(g) or vector(g, *rest)
    assert _check_space_against_rules(space, steps) > 10
    assert stepped
    for state in _reachable(space, steps):
        for lookahead in (None, "finish", "goal"):  # the same steps in the same order either way
            by_class = space.successors(state, list(Collective), lookahead)
            space.tuning = replace(vectors, vector_groups_from=1 << 30)
            by_group = space.successors(state, list(Collective), lookahead)
            space.tuning = vectors
            assert by_class == by_group


@pytest.mark.parametrize("sizes, steps", [((2, 2, 2), 4), ((4, 4), 4), ((4, 2, 2), 4), ((2, 3, 2), 3), ((8, 4), 3)])
@pytest.mark.parametrize("goal", [Goal.ALLREDUCE, Goal.REDUCESCATTER])
def test_states_of_few_distinct_ids_stepped_per_pattern_follow_the_rules(sizes, steps, goal):
    """A device-frame state holding few distinct ids is stepped per pattern
    (which devices hold equal ids; one look-up per class of groups through
    the state's distinct ids): the space follows the rules exactly, and on
    every reachable state, with and without the lookahead, it gives the same
    steps in the same order as the per-device path; patterns are shared by
    states that differ in their ids, and states of more distinct ids than
    the threshold take the per-device path; classes found with numpy (as
    for many groups) follow the rules as well."""
    space = StateSpace(sizes, goal, "device")
    assert _check_space_against_rules(space, steps) > 10
    reachable = list(_reachable(space, steps))
    patterned, stepped = space._pattern_successors, []
    space._pattern_successors = lambda state, *rest: stepped.append(state) or patterned(state, *rest)
    default = space.tuning
    for state in reachable:
        for lookahead in (None, "finish", "goal"):  # the same space: ids mean the same on both paths
            by_pattern = space.successors(state, list(Collective), lookahead)
            space.tuning = replace(default, pattern_ids_upto=0)
            assert space.successors(state, list(Collective), lookahead) == by_pattern
            space.tuning = replace(default, pattern_ids_upto=3)  # some states on each path
            assert space.successors(state, list(Collective), lookahead) == by_pattern
            space.tuning = default
    distinct = {state: len(set(state)) for state in reachable}
    assert max(distinct.values()) <= default.pattern_ids_upto and len(space._patterns) < len(reachable)
    # with the threshold at 3, states of more distinct ids took the per-device path
    assert any(distinct[s] > 3 for s in reachable)
    assert {s for s in reachable if distinct[s] <= 3} < set(reachable)
    assert len(stepped) == 3 * len(reachable) + sum(3 for s in reachable if distinct[s] <= 3)
    # the classes of a pattern's groupings found with numpy (here every grouping's) follow the rules too
    numpy_classes = SearchTuning(numpy_classes_from=1)
    assert _check_space_against_rules(StateSpace(sizes, goal, "device", tuning=numpy_classes), steps) == len(reachable)


@pytest.mark.parametrize("sizes, steps", [((2, 2, 2), 4), ((4, 4), 4), ((4, 2, 2), 4), ((8, 4), 3), ((2, 3, 2), 3)])
@pytest.mark.parametrize("goal", [Goal.ALLREDUCE, Goal.REDUCESCATTER])
def test_large_classes_of_a_pattern_are_checked_on_their_counted_profiles(sizes, steps, goal):
    """A pattern's classes of more than getter_members_upto members (lowered
    here to 1) have their profile checks looked up on the members' distinct
    profiles and counts (root first), built from the class's distinct ids, not
    on a tuple of every member's profile: the space follows the rules exactly,
    and on every reachable state, with and without the lookahead, it gives the
    same steps in the same order as the per-member check."""
    from synth.synthesis.statespace.patterns import tallied

    counting = SearchTuning(getter_members_upto=1)
    space = StateSpace(sizes, goal, "device", tuning=counting)
    looked = []
    passes_counted = space._passes_counted
    space._passes_counted = lambda key, size: looked.append(size) or passes_counted(key, size)
    assert _check_space_against_rules(space, steps) > 10
    assert looked and min(looked) > 1
    for state in _reachable(space, steps):
        # each class's tally, through the state's distinct ids, counts its groups' members' profiles (root first)
        palette = tuple(dict.fromkeys(state))
        pattern = space._pattern(state, palette)
        distinct_profiles = [space._profile[i] for i in palette]
        for g, grouping in enumerate(space.groupings):
            _, _, group_class = pattern.classes(g)
            tallies = pattern.tallies(g)
            for group, c in zip(grouping.groups, group_class):
                profiles = [space._profile[state[d]] for d in group]
                counted = tallied(distinct_profiles, tallies[c])
                assert dict(counted) == Counter(profiles) and counted[0][0] == profiles[0]
                assert space._passes_counted(counted, len(group)) == space._check_profiles(tuple(profiles))
        for lookahead in (None, "finish", "goal"):  # the same space: ids mean the same either way
            by_count = space.successors(state, list(Collective), lookahead)
            space.tuning = replace(counting, getter_members_upto=1 << 30)
            assert space.successors(state, list(Collective), lookahead) == by_count
            space.tuning = counting


@pytest.mark.parametrize("sizes, steps", [((2, 2, 2), 4), ((4, 4), 4), ((4, 2, 2), 4), ((8, 4), 3), ((2, 3, 2), 3)])
@pytest.mark.parametrize("goal", [Goal.ALLREDUCE, Goal.REDUCESCATTER])
@pytest.mark.parametrize("ids_upto, tokens_upto", [(255, 256), (3, 256), (255, 6)])
def test_search_keys_step_as_the_states_they_stand_for(sizes, steps, goal, ids_upto, tokens_upto):
    """The search keeps a state of few distinct ids as its pattern and
    distinct ids (Packed) and steps it without a tuple of ids: on every
    reachable state, with and without the lookahead, expanding its key gives
    the keys of the same next states, with the same loads, in the same order,
    as stepping the state itself; a key names one state (its devices' ids,
    first occurrence first), states of more distinct ids than the threshold
    (lowered to 3 too) are their own keys, next states of more tokens than
    tokens_upto (lowered to 6) are keyed from their tuple of ids, and goal
    and may_finish read keys as they read states."""
    tuning = SearchTuning(pattern_ids_upto=ids_upto, tokens_upto=tokens_upto)
    space = StateSpace(sizes, goal, "device", tuning=tuning)
    tokens = space._tokens
    kinds = set()
    space._tokens = lambda *a: kinds.add(tokens(*a) is None) or tokens(*a)
    packed = shifted = unmoved = from_last = 0
    for state in _reachable(space, steps):
        key = space.key(state)
        assert space.devices(key) == state and space.key(space.devices(key)) == key
        if len(set(state)) <= ids_upto:
            packed += 1
            palette = tuple(dict.fromkeys(state))
            assert key == Packed(bytes(palette.index(i) for i in state), palette)
        else:
            want, backward = _shifted_key(space, state, ids_upto)
            assert key == want if want else key is state
            shifted += want is not None
            unmoved += want is not None and min(want.palette) < 0
            from_last += backward
        assert space.is_goal(key) == space.is_goal(state) and space.may_finish(key) == space.may_finish(state)
        for lookahead in (None, "finish", "goal"):
            by_key = space.expand(key, list(Collective), lookahead)
            by_state = space.successors(state, list(Collective), lookahead)
            assert [(g, c, space.devices(new), loads) for g, c, new, loads in by_key] == by_state
            assert all(new == space.key(space.devices(new)) for _, _, new, _ in by_key)
    assert packed > 5
    assert kinds == ({False} if tokens_upto == 256 else {False, True})
    if ids_upto == 3:  # states keyed with a shift were stepped, some with devices the shift does not move, and
        assert shifted > 5 and unmoved > 0 and from_last > 0  # some with the shift read from the last device


def _shifted_key(space, state, ids_upto):
    """The Packed key with a shift of ``state`` as Packed's docstring and
    StateSpace._shifted_key define it, computed device by device (digits from
    divmod), and whether its shift was read from the last device: None where
    the state has none (both shifts zero or leaving too many relative ids)."""
    k, stride, sizes = space.k, space.k + 1, space.sizes

    def digits(d):
        out = []
        for size in reversed(sizes):
            d, x = divmod(d, size)
            out.append(x)
        return out[::-1]

    def first(i):
        return i % stride - 1

    def apart(a, b):  # how many chunks further device a starts than device b (0 if either holds nothing)
        return first(state[a]) - first(state[b]) if first(state[a]) >= 0 and first(state[b]) >= 0 else 0

    unit = [math.prod(sizes[l + 1:]) for l in range(len(sizes))]
    forward = tuple(apart(u, 0) if size > 1 else 0 for size, u in zip(sizes, unit))
    backward = tuple(apart(k - 1, k - 1 - u) if size > 1 else 0 for size, u in zip(sizes, unit))
    for shift in dict.fromkeys((forward, backward)):
        if not any(shift):
            continue
        relative = []
        for d, i in enumerate(state):
            moved = sum(a * x for a, x in zip(shift, digits(d)))
            if first(i) < 0:
                relative.append(i)  # holds nothing: not moved
            elif 0 <= first(i) - moved < k:
                relative.append(i - moved)
            else:
                relative.append(-i - 1)  # starts before its shift or past the chunks: stored as ~id
        palette = tuple(dict.fromkeys(relative))
        if len(palette) <= ids_upto:
            return Packed(bytes(palette.index(i) for i in relative), palette, shift), shift != forward
    return None, False


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [(4, 2, 2), (2, 2, 2, 2), (4, 4)])
@pytest.mark.parametrize("goal", [Goal.ALLREDUCE, Goal.REDUCESCATTER])
def test_groupings_of_one_first_group_share_their_outcomes(sizes, goal):
    """In the device frame a group's outcome depends on its members' offsets
    from the root: groupings whose first groups are the same (parallel(j) and
    master(j) at one level) share one memo of outcomes and one of shifted
    outcomes (the others are not shared), outcomes found through one serve
    the other, and the space still follows the rules on every reachable
    state."""
    space = StateSpace(sizes, goal, "device")
    pairs = [(g, h) for g in range(len(space.groupings)) for h in range(g + 1, len(space.groupings))
             if space.groupings[g].groups[0] == space.groupings[h].groups[0]]
    assert pairs and all(space.groupings[h].form is Form.MASTER for _, h in pairs)
    for memos in (space._memos, space._shifted_memos):
        assert all(per[g] is per[h] for per in memos for g, h in pairs)
        assert all(len({id(m) for m in per}) == len(space.groupings) - len(pairs) for per in memos)
    assert _check_space_against_rules(space, 4) > 5


@pytest.mark.parametrize("by_value", [True, False])
@pytest.mark.parametrize("sizes", [(4, 2, 2), (2, 4, 2), (8, 4)])
@pytest.mark.parametrize("goal", [Goal.ALLREDUCE, Goal.REDUCESCATTER])
def test_results_in_the_roots_frame_take_the_ids_of_their_members_translations(sizes, goal, by_value):
    """A group's results computed in its root's frame get, per member, the id
    of the result translated by that member's inverse offset: the memos per
    (base state, offset) and, for states interned by mask ids, per (mask id,
    offset) give exactly the id of interning the translated state, at the
    result's position; every base state, translated ones included, has the
    profile of its own state; and the space follows the rules."""
    space = StateSpace(sizes, goal, "device", by_value=by_value)
    member_ids, checked = space._member_ids, []
    t = space.translations

    def checking(grouping, result):
        got = member_ids(grouping, result)
        members = space.groupings[grouping].groups[0]  # device 0 is its root
        want = tuple(space.intern(t.state(s, t.inverse(t.digits(d)))) for s, d in zip(result, members))
        assert got == want
        checked.append(grouping)
        return got

    space._member_ids = checking
    assert _check_space_against_rules(space, 4) > 10
    assert checked and space._translated
    assert by_value or space._moved_mask_ids
    for b, state in enumerate(space._base_states):
        assert space._base_profile[b] == space._intern_profile(profile_of(state)), state


def test_translated_masks_are_memoised_up_to_a_cap():
    """Translations.state memoises each mask's translation per offset and
    starts over past moved_masks_upto masks (lowered here to 8): a state
    translated through the memo is the state translated mask by mask, and a
    device-frame space built on it still follows the rules exactly, also
    with states interned by mask ids (their own memo, under the same cap)."""
    import random

    capped = SearchTuning(moved_masks_upto=8)
    space = StateSpace((4, 2, 2), Goal.ALLREDUCE, "device", tuning=capped)
    t = space.translations
    rng = random.Random(7)
    for _ in range(200):
        masks = tuple(rng.getrandbits(t.k) for _ in range(rng.randint(1, 4)))
        stops = tuple(sorted(rng.sample(range(1, t.k), len(masks) - 1))) + (t.k,)
        offset = t.digits(rng.randrange(t.k))
        moved = t.state((stops, masks), offset)
        assert moved == (stops, tuple(t.mask(m, offset) for m in masks))
        assert moved == t.state((stops, masks), offset)  # again, through the memo
        assert len(t._moved) <= 9
    assert _check_space_against_rules(space, 4) > 10
    # states interned by mask ids memoise each mask id's translation per offset under the same cap
    by_masks = StateSpace((4, 2, 2), Goal.ALLREDUCE, "device", by_value=False, tuning=capped)
    assert _check_space_against_rules(by_masks, 4) > 10
    most_masks = max(map(len, by_masks._base_mask_ids))
    assert by_masks._moved_mask_ids and len(by_masks._moved_mask_ids) <= 8 + most_masks


@pytest.mark.parametrize("sizes", [(8, 2), (2, 2, 4), (32,)])
@pytest.mark.parametrize("goal", [Goal.ALLREDUCE, Goal.REDUCESCATTER])
@pytest.mark.parametrize("numpy_profiles", [False, True])
def test_groups_of_every_device_are_not_memoised_on_large_systems(sizes, goal, numpy_profiles):
    """From whole_keys_from devices (lowered here to the hierarchy's) a group
    of every device is checked and stepped without being memoised (its key is
    a whole state): the space still follows the rules exactly, with and
    without the lookahead the same steps as a space that memoises them, and no
    memo holds a key of every device; per pattern, and on the per-device path
    with the profile ids taken with numpy (numpy_profiles_from lowered too)."""
    k = math.prod(sizes)
    memoising = StateSpace(sizes, goal, "device")
    tuning = SearchTuning(whole_keys_from=k, **({"numpy_profiles_from": k} if numpy_profiles else {}))
    space = StateSpace(sizes, goal, "device", tuning=tuning)
    assert _check_space_against_rules(space, 3) >= 4
    for state in _reachable(space, 3):
        for lookahead in (None, "finish", "goal"):
            assert space.successors(state, list(Collective), lookahead) == \
                memoising.successors(state, list(Collective), lookahead)
    memos = [space._passing, *space._deltas, *(m for per in space._memos for m in per)]
    assert all(len(key) < k for memo in memos for key in memo)
    assert any(len(key) == k for memo in [memoising._passing, *memoising._deltas] for key in memo)


@pytest.mark.parametrize("sizes", [(16, 2), (2, 16), (4, 2, 2), (8, 4)])
@pytest.mark.parametrize("goal", [Goal.ALLREDUCE, Goal.REDUCESCATTER])
def test_a_member_holding_every_chunk_does_not_set_the_shift_of_a_profile_check(sizes, goal):
    """The profile checks of a grouping's groups are looked up once per class
    of groups moved down by their first held chunk, where a member that holds
    one run over every chunk stays put (``_whole_members``): on every group of
    every grouping of every reachable state, the check of the class is the
    check of the group itself, and classes of that kind occur."""
    import numpy as np

    space = StateSpace(sizes, goal, "device")
    fixed_whole = 0
    for state in _reachable(space, 5):
        profiles = np.array([space._profile[i] for i in state], dtype=np.int64)
        for g in range(len(space.groupings)):
            rows = profiles[space._member_array(g)]
            classes = {tuple(row) for row in space._classes(rows, space._whole_members(rows))[1]}
            fixed_whole += len(classes) < len(space._classes(rows)[1])
            for row in rows.tolist():
                key = tuple(row)
                position = [p % space._stride for p in key]
                whole = [space._base_whole[p // space._stride] for p in key]
                shifts = [x - 1 for x, w in zip(position, whole) if x > 0 and not w]
                b = min(shifts) if shifts else 0
                moved = tuple(p - b if x > 0 and not w else p for p, x, w in zip(key, position, whole))
                assert moved in classes
                assert space._check_profiles(moved) == space._check_profiles(key), (state, g, key)
    assert fixed_whole > 0


def test_runs_at_many_positions_is_the_state_of_those_runs():
    """runs_at (an AllGather's result where members hold one run at many
    positions, built with numpy) is the canonical state from_runs builds from
    the same runs: touching runs merge, gaps hold nothing, on random layouts."""
    import random

    import numpy as np

    from synth.synthesis.semantics import from_runs
    from synth.synthesis.statespace.positions import runs_at

    rng = random.Random(3)
    for _ in range(3000):
        k = rng.randint(1, 48)
        length = rng.randint(1, max(1, k // 2))
        firsts: list[int] = []
        for f in sorted(rng.sample(range(k - length + 1), rng.randint(1, k - length + 1))):
            if not firsts or f >= firsts[-1] + length:
                firsts.append(f)
        mask = rng.randint(1, (1 << k) - 1)
        want = from_runs([(f, f + length, mask) for f in firsts], k)
        assert runs_at(np.array(firsts, dtype=np.int64), length, mask, k) == want


def test_first_occurrences_count_like_a_counter():
    from collections import Counter

    import numpy as np

    from synth.synthesis.statespace.positions import first_occurrences

    rng = np.random.default_rng(5)
    for n in (1, 2, 17, 3000):
        values = tuple(rng.integers(0, max(2, n // 3), n).tolist())
        distinct, counts = first_occurrences(values)
        assert list(zip(distinct.tolist(), counts.tolist())) == list(Counter(values).items())


def test_search_tuning_refuses_thresholds_a_byte_cannot_hold():
    """A pattern's labels and a next state's tokens are bytes: thresholds past
    what a byte holds are refused when the tuning is made, not met mid-search."""
    with pytest.raises(ValueError, match="pattern_ids_upto 256"):
        SearchTuning(pattern_ids_upto=256)
    with pytest.raises(ValueError, match="tokens_upto 257"):
        SearchTuning(tokens_upto=257)
    assert SearchTuning(pattern_ids_upto=255, tokens_upto=256).pattern_ids_upto == 255
