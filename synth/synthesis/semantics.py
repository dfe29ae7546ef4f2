"""Hoare-style semantics of the reduction language on a synthesis hierarchy.

The synthesis hierarchy is a root of size 1 over levels ``sizes[0..n-1]``; a
device of one reduction group is its synthesis index ``0..k-1`` (mixed radix,
outermost level most significant), the same numbering that
``Placement.synthesis_groups`` uses. Level 0 is the root, level ``i`` is
``sizes[i-1]``.

State. Data is split into ``k`` chunks. A device's state says, for each chunk it
holds, which devices' contributions are summed in it. It is stored as runs that
partition the chunks ``0..k-1``: ``(stops, masks)``, run ``i`` ending before
chunk ``stops[i]`` and carrying the contributor set ``masks[i]``, a bitmask over
devices (bit ``d`` = device ``d``; 0 = chunks not held). Equal neighbours are
merged, so the representation is canonical and a state is a hashable tuple.
Typical states (a device holding a contiguous shard summed over a subtree) take
one to three runs, not ``k x k`` bits.

Rules (a step is valid only if every group's precondition holds):

* AllReduce: members hold the same non-empty chunks, contributor sets pairwise
  disjoint per chunk; all get the union.
* ReduceScatter: the same precondition; the held chunks, in order, are split into
  ``|g|`` equal parts (else invalid); member ``i`` keeps part ``i`` of the union.
* AllGather: members hold pairwise disjoint chunk sets of equal size; all get
  the union. A group whose members all hold nothing satisfies this (the sets are
  empty, hence disjoint and of equal size) and stays as it is.
* Reduce: AllReduce's precondition; the root (first member) gets the union,
  the others hold nothing.
* Broadcast: every member's state is contained in the root's (each held chunk is
  held by the root with a superset of contributors) and one is strictly smaller;
  all get the root's state.

A step is valid only if every group's precondition holds and it changes the
state of at least one device: a step that changes nothing (an AllGather all of
whose groups hold nothing) would be a self-loop of the state graph and could be
repeated anywhere in a program (docs/model.md, "No-op steps").

The search does not use these functions on whole states directly but through a
:class:`~synth.synthesis.statespace.StateSpace`, which interns device states (a
state is a tuple of small ids) and computes each group once per orbit (see the
package :mod:`synth.synthesis.statespace`); the functions here are the rules,
and the tests check the space against them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import SynthError
from .language import ROOT, Collective, Form, Instruction

Run = tuple[int, int, int]  # (first chunk, stop chunk, contributor bitmask)
# (run stops, run masks): runs partition chunks 0..k-1; mask 0 = not held
DeviceState = tuple[tuple[int, ...], tuple[int, ...]]
State = tuple[DeviceState, ...]
Group = tuple[int, ...]
Loads = tuple[int, ...]  # chunks one step moves, per synthesis group






class Goal(enum.Enum):
    ALLREDUCE = "allreduce"
    REDUCESCATTER = "reducescatter"
    ALLGATHER = "allgather"

    @property
    def collective(self) -> Collective:
        """The library collective that implements the goal in one call."""
        return Collective.from_text(self.value)


@dataclass(frozen=True)
class Hierarchy:
    """A synthesis hierarchy: level names and sizes below the root, outermost first."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    @property
    def k(self) -> int:
        return math.prod(self.sizes)

    @property
    def depth(self) -> int:
        return len(self.sizes)

    def level_index(self, name: str) -> int:
        if name == ROOT:
            return 0
        if name in self.names:
            return self.names.index(name) + 1
        levels = ", ".join((ROOT, *self.names))
        raise SynthError(f"level '{name}' is not in the synthesis hierarchy ({levels})")

    def level_name(self, index: int) -> str:
        return ROOT if index == 0 else self.names[index - 1]

    def describe(self) -> str:
        return " > ".join(f"{n} x{s}" for n, s in zip(self.names, self.sizes)) or "(single device)"


# ---------------------------------------------------------------- groups


def groups_of(sizes: Sequence[int], level: int, form: Form, ancestor: int | None) -> tuple[Group, ...]:
    """Groups of synthesis indices acting together; members in index order (root
    first). Groups of size 1 are dropped (they are no-ops).

    * ``(i, inside)``: fix digits ``1..i``, vary the deeper ones;
    * ``(i, parallel(j))``: fix digits ``1..j`` and ``i+1..n``, vary ``j+1..i``;
    * ``(i, master(j))``: the parallel groups whose digits ``i+1..n`` are all 0.
    """
    rows = group_rows(sizes, level, form, ancestor)
    return tuple(map(tuple, rows.tolist())) if len(rows) else ()  # Python ints


def group_rows(sizes: Sequence[int], level: int, form: Form, ancestor: int | None) -> np.ndarray:
    """:func:`groups_of` as a (groups, members) array; (0, 0) when its groups
    have one member (the step is a no-op)."""
    k = math.prod(sizes)
    index = np.arange(k)
    if form is Form.INSIDE:
        rows = index.reshape(math.prod(sizes[:level]), -1)
    else:
        assert ancestor is not None and 0 <= ancestor < level
        cube = index.reshape(
            math.prod(sizes[:ancestor]), math.prod(sizes[ancestor:level]), math.prod(sizes[level:])
        )
        if form is Form.MASTER:
            cube = cube[:, :, :1]
        rows = cube.transpose(0, 2, 1).reshape(-1, cube.shape[1])
    return rows if rows.shape[1] >= 2 else np.zeros((0, 0), dtype=rows.dtype)


@dataclass(frozen=True)
class Grouping:
    """A canonical (level, form, ancestor) and the synthesis groups it denotes."""

    level: int
    form: Form
    ancestor: int | None
    groups: tuple[Group, ...]

    def instruction(self, collective: Collective, hierarchy: Hierarchy) -> Instruction:
        ancestor = None if self.ancestor is None else hierarchy.level_name(self.ancestor)
        return Instruction(collective, hierarchy.level_name(self.level), self.form, ancestor)


def resolve(instruction: Instruction, hierarchy: Hierarchy) -> Grouping:
    """The groups of an instruction on ``hierarchy``; errors name the problem."""
    level, ancestor = _slice_of(instruction, hierarchy)
    return Grouping(level, instruction.form, ancestor, groups_of(hierarchy.sizes, level, instruction.form, ancestor))


def resolve_rows(instruction: Instruction, hierarchy: Hierarchy) -> np.ndarray:
    """:func:`resolve`'s groups as a (groups, members) array (the same errors)."""
    level, ancestor = _slice_of(instruction, hierarchy)
    return group_rows(hierarchy.sizes, level, instruction.form, ancestor)


def _slice_of(instruction: Instruction, hierarchy: Hierarchy) -> tuple[int, int | None]:
    """The level index and ancestor index (or None) an instruction names."""
    level = hierarchy.level_index(instruction.level)
    ancestor = None
    if instruction.ancestor is not None:
        ancestor = hierarchy.level_index(instruction.ancestor)
        if ancestor >= level:
            raise SynthError(
                f"{instruction}: {instruction.form.value}({instruction.ancestor}) needs a level "
                f"above '{instruction.level}'"
            )
    return level, ancestor


def distinct_groupings(hierarchy: Hierarchy) -> tuple[Grouping, ...]:
    """Every grouping the language can express on ``hierarchy``, no-ops dropped and
    instructions that denote the same groups merged into the first of: shallower
    slice first; at one slice inside, then parallel(j), then master(j), j upward."""
    seen: dict[tuple[Group, ...], Grouping] = {}
    for level in range(hierarchy.depth + 1):
        candidates = [(Form.INSIDE, None)]
        candidates += [(Form.PARALLEL, j) for j in range(level)]
        candidates += [(Form.MASTER, j) for j in range(level)]
        for form, ancestor in candidates:
            groups = groups_of(hierarchy.sizes, level, form, ancestor)
            if groups and groups not in seen:
                seen[groups] = Grouping(level, form, ancestor, groups)
    return tuple(seen.values())


# ---------------------------------------------------------------- states


def make_state(stops: Sequence[int], masks: Sequence[int]) -> DeviceState:
    """Canonical device state from runs ending at ``stops`` (dropping empty runs,
    merging equal neighbours)."""
    out_stops: list[int] = []
    out_masks: list[int] = []
    for stop, mask in zip(stops, masks):
        if stop == (out_stops[-1] if out_stops else 0):
            continue
        if out_masks and out_masks[-1] == mask:
            out_stops[-1] = stop
        else:
            out_stops.append(stop)
            out_masks.append(mask)
    return (tuple(out_stops), tuple(out_masks))


def initial_state(goal: Goal, k: int) -> State:
    """AllReduce/ReduceScatter: device d holds every chunk with contributors {d}.
    AllGather: device d holds only chunk d (its shard), contributors {d}."""
    if goal is Goal.ALLGATHER:
        return tuple(make_state((d, d + 1, k), (0, 1 << d, 0)) for d in range(k))
    return tuple(((k,), (1 << d,)) for d in range(k))


def goal_state(goal: Goal, k: int) -> State | None:
    """The unique goal state, or None for ReduceScatter (any bijection of shards)."""
    full = (1 << k) - 1
    if goal is Goal.ALLREDUCE:
        return (((k,), (full,)),) * k
    if goal is Goal.ALLGATHER:
        return (make_state(range(1, k + 1), [1 << c for c in range(k)]),) * k
    return None


def is_goal(state: State, goal: Goal) -> bool:
    k = len(state)
    target = goal_state(goal, k)
    if target is not None:
        return state == target
    full = (1 << k) - 1
    owned = set()
    for s in state:
        runs = runs_of(s)
        if len(runs) != 1 or runs[0][1] - runs[0][0] != 1 or runs[0][2] != full:
            return False
        owned.add(runs[0][0])
    return len(owned) == k


def runs_of(s: DeviceState) -> list[Run]:
    """The held runs ``(first, stop, contributors)`` of a device state."""
    out, first = [], 0
    for stop, mask in zip(*s):
        if mask:
            out.append((first, stop, mask))
        first = stop
    return out


def held_chunks(s: DeviceState) -> list[int]:
    return [c for first, stop, _ in runs_of(s) for c in range(first, stop)]


def chunk_count(s: DeviceState) -> int:
    first, total = 0, 0
    for stop, mask in zip(*s):
        if mask:
            total += stop - first
        first = stop
    return total


def _coverage(s: DeviceState) -> tuple[int, ...]:
    """Where held-ness changes: the stops of the held / not-held pattern."""
    out: list[int] = []
    held = None
    for stop, mask in zip(*s):
        if (mask != 0) == held:
            out[-1] = stop
        else:
            out.append(stop)
            held = mask != 0
    return (s[1][0] != 0, *out)


def _refine(s: DeviceState, stops: Sequence[int]) -> list[int]:
    """Masks of ``s`` on the finer runs ending at ``stops``."""
    out, r = [], 0
    own_stops, masks = s
    for stop in stops:
        while own_stops[r] < stop:
            r += 1
        out.append(masks[r])
    return out


def sum_states(states: Sequence[DeviceState]) -> DeviceState | str:
    """The union of states that hold the same chunks with pairwise disjoint
    contributors, or the reason they cannot be summed."""
    stops = states[0][0]
    if all(s[0] == stops for s in states):
        per_member = [s[1] for s in states]
    else:
        cover = _coverage(states[0])
        if any(_coverage(s) != cover for s in states[1:]):
            return "members hold different chunks"
        stops = tuple(sorted(set().union(*(s[0] for s in states))))
        per_member = [_refine(s, stops) for s in states]
    acc = list(per_member[0])
    if not any(acc):
        return "a member holds no data"
    for masks in per_member[1:]:
        for i, mask in enumerate(masks):
            a = acc[i]
            if (a == 0) != (mask == 0):
                return "members hold different chunks"
            if a & mask:
                lo = stops[i - 1] if i else 0
                return f"contributors overlap on chunks {lo}..{stops[i] - 1} (double counting)"
            acc[i] = a | mask
    return make_state(stops, acc)


def split_state(s: DeviceState, parts: int) -> list[DeviceState] | str:
    """The held chunks of ``s`` in order, cut into ``parts`` equal parts."""
    total = chunk_count(s)
    if total % parts:
        return f"{total} held chunks do not split evenly into {parts} parts"
    size = total // parts
    k = s[0][-1]
    out: list[list[Run]] = [[] for _ in range(parts)]
    pos = 0
    for first, stop, mask in runs_of(s):
        c = first
        while c < stop:
            p = pos // size
            take = min(stop - c, (p + 1) * size - pos)
            out[p].append((c, c + take, mask))
            c += take
            pos += take
    return [from_runs(runs, k) for runs in out]


def from_runs(runs: Sequence[Run], k: int) -> DeviceState:
    """Device state holding ``runs`` (sorted, disjoint) and nothing else."""
    stops: list[int] = []
    masks: list[int] = []
    at = 0
    for first, stop, mask in runs:
        if first > at:
            stops.append(first)
            masks.append(0)
        stops.append(stop)
        masks.append(mask)
        at = stop
    if at < k:
        stops.append(k)
        masks.append(0)
    return make_state(stops, masks)








def shifted(s: DeviceState, x: int, k: int) -> DeviceState:
    """``s`` with every held chunk ``c`` moved to ``c + x`` (the caller keeps
    them inside ``0..k-1``). Works on profiles too. The rules commute with such
    a move applied to every member of a group: they compare and combine
    contributors chunk by chunk and split the held chunks in order. The
    definition that the state space's ``moved_to`` and ``moved_down``
    (:mod:`synth.synthesis.statespace.positions`) are tested against."""
    return from_runs([(a + x, b + x, v) for a, b, v in runs_of(s)], k)








def contains(big: DeviceState, small: DeviceState) -> bool:
    """Every chunk of ``small`` is in ``big`` with a superset of contributors
    (one walk over both run lists, comparing each pair of overlapping runs)."""
    (big_stops, big_masks), (small_stops, small_masks) = big, small
    i = j = 0
    end = len(small_stops)
    while j < end:
        mask = small_masks[j]
        if big_masks[i] & mask != mask:
            return False
        b, s = big_stops[i], small_stops[j]
        i += b <= s
        j += s <= b
    return True


#: the collectives that sum contributions
REDUCING = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.REDUCE)
#: a set of collectives as an int: bit ``BIT[c]`` for collective ``c``, in
#: :class:`Collective` order (:func:`shape_bits`; the state space's checks)
BIT = {c: i for i, c in enumerate(Collective)}
#: collectives whose profile check is the shape check alone (AllGather), the
#: summing ones (one count check for the three), and Broadcast
COUNT_FREE = 1 << BIT[Collective.ALLGATHER]
SUMMING = sum(1 << BIT[c] for c in REDUCING)
BROADCASTING = 1 << BIT[Collective.BROADCAST]


HeldRuns = tuple[tuple[int, int], ...]  # the chunks a state holds: sorted, disjoint, non-adjacent (first, stop) runs


def held_runs(s: DeviceState) -> HeldRuns:
    """The chunks ``s`` holds, as merged runs (neighbouring held runs with
    different contributors are one run here)."""
    out: list[tuple[int, int]] = []
    first = 0
    for stop, mask in zip(*s):
        if mask:
            if out and out[-1][1] == first:
                out[-1] = (out[-1][0], stop)
            else:
                out.append((first, stop))
        first = stop
    return tuple(out)


def held_count(held: HeldRuns) -> int:
    return sum(b - a for a, b in held)


def runs_within(small: HeldRuns, big: HeldRuns) -> bool:
    """Every chunk of ``small`` is in ``big`` (runs are merged, so each run of
    ``small`` lies inside one run of ``big``)."""
    j = 0
    for a, b in small:
        while j < len(big) and big[j][1] <= a:
            j += 1
        if j == len(big) or big[j][0] > a or big[j][1] < b:
            return False
    return True


def union_count(helds: Sequence[HeldRuns]) -> int:
    """How many chunks the union of ``helds`` holds."""
    total, reach = 0, 0
    for a, b in sorted(run for held in helds for run in held):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def shape_bits(held: Sequence[HeldRuns], size: int) -> int:
    """The collectives (bit ``i`` = the ``i``-th of :class:`Collective`) that
    pass :func:`shape_reason` on ``held`` and ``size``: the same checks, each
    quantity computed once for the five."""
    root = held[0]
    count = held_count(root)
    bits = 0
    if root and all(h == root for h in held):
        bits |= SUMMING if count % size == 0 else SUMMING & ~(1 << BIT[Collective.REDUCESCATTER])
    if root and all(runs_within(h, root) for h in held):
        bits |= BROADCASTING
    if all(held_count(h) == count for h in held) and union_count(held) == count * size:
        bits |= COUNT_FREE  # AllGather
    return bits


def shape_reason(collective: Collective, held: Sequence[HeldRuns], size: int) -> str | None:
    """Why the collective cannot run on a group of ``size`` members holding the
    chunks ``held`` (:func:`held_runs`, root first; members that hold the same
    state may be given once), judged without their contributors, or None.
    :func:`apply_collective` checks this first, so these are its reasons too.
    Chunk sets are runs, not bitmasks: with ``k`` chunks a bitmask per member
    is ``k`` bits, and groups of ``k`` members would cost ``k**2``."""
    root = held[0]
    if collective is Collective.ALLGATHER:
        count = held_count(root)
        if any(held_count(h) != count for h in held):
            return "members hold different numbers of chunks"
        if union_count(held) != count * size:  # a state given once for several members overlaps itself
            return "members hold overlapping chunks"
        return None
    if collective is Collective.BROADCAST:
        if not root:
            return "the root holds no data"
        if not all(runs_within(h, root) for h in held):
            return "a member holds data the root does not contain"
        return None
    if any(h != root for h in held):
        return "members hold different chunks"
    if not root:
        return "a member holds no data"
    count = held_count(root)
    if collective is Collective.REDUCESCATTER and count % size:
        return f"{count} held chunks do not split evenly into {size} parts"
    return None


#: a device state with each contributor mask replaced by its size: which chunks
#: are held and by how many contributors, the same in every frame of a
#: :class:`~synth.synthesis.statespace.StateSpace`
StateProfile = tuple[tuple[int, ...], tuple[int, ...]]


def profile_of(s: DeviceState) -> StateProfile:
    return make_state(s[0], [m.bit_count() for m in s[1]])


def profile_reason(collective: Collective, members: Sequence[tuple[StateProfile, int]], size: int,
                    held: Sequence[HeldRuns] | None = None) -> str | None:
    """Why the collective cannot run on a group of ``size`` members, judged on
    their profiles alone, or None. ``members`` are ``(profile, how many members
    have it)``, root first. First which chunks are held (:func:`shape_reason`),
    then how many contributors they carry (:func:`count_reason`).
    :func:`apply_collective` checks this before looking at any mask, so these
    are its reasons too."""
    reason = shape_reason(collective, [held_runs(p) for p, _ in members] if held is None else held, size)
    return reason if reason is not None else count_reason(collective, members)


def count_reason(collective: Collective, members: Sequence[tuple[StateProfile, int]]) -> str | None:
    """Summing more than ``k`` contributors on a chunk is double counting, and
    a Broadcast member with more contributors on a chunk than the root is not
    contained in it (for members that hold the right chunks)."""
    if collective is Collective.ALLGATHER:
        return None
    root = members[0][0]
    if collective is Collective.BROADCAST:
        if any(more_contributors(p, root) for p, _ in members[1:]):
            return "a member holds data the root does not contain"
        return None
    k, change = root[0][-1], {}
    for (stops, counts), n in members:
        first = 0
        for stop, count in zip(stops, counts):
            if count:
                change[first] = change.get(first, 0) + n * count
                change[stop] = change.get(stop, 0) - n * count
            first = stop
    total, at = 0, sorted(change)
    for x, nxt in zip(at, at[1:]):
        total += change[x]
        if total > k:
            return f"contributors overlap on chunks {x}..{nxt - 1} (double counting)"
    return None


def more_contributors(small: StateProfile, big: StateProfile) -> bool:
    """Whether ``small`` carries more contributors than ``big`` on some chunk."""
    i = j = 0
    (small_stops, small_counts), (big_stops, big_counts) = small, big
    while i < len(small_stops):
        if small_counts[i] > big_counts[j]:
            return True
        stop = min(small_stops[i], big_stops[j])
        i += small_stops[i] == stop
        j += big_stops[j] == stop
    return False


def profile_results(collective: Collective, members: Sequence[tuple[StateProfile, int]], k: int) -> list[StateProfile]:
    """The members' profiles after ``collective``, from their profiles alone
    (for members that pass :func:`profile_reason`): counts add where masks
    are united, and everything else moves as the masks do. ``members`` are
    ``(profile, how many members have it)``, root first; the result has one
    profile per member, one object for members that end alike."""
    size = sum(n for _, n in members)
    root = members[0][0]
    if collective is Collective.BROADCAST:
        return [root] * size
    if collective is Collective.ALLGATHER:
        if not any(root[1]):  # nobody holds anything (else the held chunk sets are disjoint: no profile repeats)
            return [p for p, n in members for _ in range(n)]
        return [from_runs(sorted(run for p, _ in members for run in runs_of(p)), k)] * size
    stops = tuple(sorted(set().union(*(p[0] for p, _ in members))))
    counts = [0] * len(stops)
    for p, n in members:
        for i, count in enumerate(_refine(p, stops)):
            counts[i] += n * count
    result = reduced(collective, make_state(stops, counts), size)
    assert not isinstance(result, str)  # the profile check passed: the counts divide
    return result


def apply_collective(collective: Collective, members: Sequence[DeviceState]) -> list[DeviceState] | str:
    """New states of a group's members (root = first), or why the step is invalid."""
    reason = profile_reason(collective, [(profile_of(s), 1) for s in members], len(members))
    return reason if reason is not None else apply_counted(collective, members)


def apply_counted(collective: Collective, members: Sequence[DeviceState]) -> list[DeviceState] | str:
    """:func:`apply_collective` once :func:`profile_reason` has passed: the
    checks that need the masks, and the results."""
    if collective is Collective.ALLGATHER:
        if not any(members[0][1]):
            return list(members)  # all hold nothing: the union is nothing
        runs = sorted(run for s in members for run in runs_of(s))
        return [from_runs(runs, members[0][0][-1])] * len(members)
    if collective is Collective.BROADCAST:
        root = members[0]
        others = {id(s): s for s in members[1:]}.values()  # members often share one state object
        if not all(s == root or contains(root, s) for s in others):
            return "a member holds data the root does not contain"
        if all(s == root for s in others):
            return "no member gains information"
        return [root] * len(members)
    total = sum_states(members)
    if isinstance(total, str):
        return total
    return reduced(collective, total, len(members))


def reduced(collective: Collective, total: DeviceState, size: int) -> list[DeviceState] | str:
    if collective is Collective.ALLREDUCE:
        return [total] * size
    if collective is Collective.REDUCE:
        empty = ((total[0][-1],), (0,))
        return [total] + [empty] * (size - 1)
    return split_state(total, size)  # ReduceScatter


def step_chunks(collective: Collective, members: Sequence[DeviceState]) -> list[int]:
    """The ordered chunk list a valid step covers: the held chunks (of the root for
    Broadcast); for AllGather the members' chunks concatenated in member order,
    member ``i`` contributing part ``i``. For ReduceScatter member ``i`` receives
    part ``i`` of the list."""
    if collective is Collective.ALLGATHER:
        return [c for s in members for c in held_chunks(s)]
    return held_chunks(members[0])


def step_load(collective: Collective, members: Sequence[DeviceState]) -> int:
    """Chunks a valid step moves per group: ``len(step_chunks(...))``, cheaply."""
    if collective is Collective.ALLGATHER:
        return sum(chunk_count(s) for s in members)
    return chunk_count(members[0])


NO_CHANGE = "the step changes no device's state"


def apply_step(state: State, collective: Collective, groups: Sequence[Group]) -> State | str:
    """Apply one instruction to every group at once; devices outside stay as they
    are. The reference definition of a step (the search computes the same through
    a :class:`~synth.synthesis.statespace.StateSpace`)."""
    new = list(state)
    for group in groups:
        result = apply_collective(collective, [state[d] for d in group])
        if isinstance(result, str):
            return f"group {list(group)}: {result}"
        for d, s in zip(group, result):
            new[d] = s
    out = tuple(new)
    return NO_CHANGE if out == state else out


def may_finish_in_one_step(state: State, goal: Goal, hierarchy: Hierarchy) -> bool:
    """A cheap necessary condition for reaching the AllReduce goal in one step
    (the reference that ``StateSpace.may_finish`` computes on profiles,
    :mod:`synth.synthesis.statespace.lookahead`).

    The last step is an AllReduce (it keeps every device's chunks, so all devices
    hold all chunks), an AllGather (it copies sums, so every held sum is complete)
    or a Broadcast (its roots gain nothing, and device 0 is the root of its group
    in every grouping, so device 0 is already done). A
    last AllReduce or AllGather on a grouping of ``G`` groups over ``n`` devices
    leaves the ``k - n`` others as they are (so they are done) and gives each
    group ``k`` chunks of ``k`` contributors: the contributor counts summed over
    devices and chunks are ``(G + k - n) * k**2`` for one of the groupings."""
    if goal is not Goal.ALLREDUCE:
        return True
    k = len(state)
    full = (1 << k) - 1
    if state[0] == ((k,), (full,)):
        return True
    if not (all(all(s[1]) for s in state) or all(mask in (0, full) for s in state for mask in s[1])):
        return False
    mass = sum((stop - first) * mask.bit_count() for s in state for first, stop, mask in runs_of(s))
    return mass in finishing_masses(distinct_groupings(hierarchy), k)


def finishing_masses(groupings: Sequence[Grouping], k: int) -> frozenset[int]:
    """The masses (contributor counts summed over devices and chunks) a state
    can have when a last AllReduce or AllGather on one of ``groupings``
    finishes it: ``(G + k - n) * k**2`` for ``G`` groups over ``n`` devices
    (the others are done already; each group ends with ``k`` chunks of ``k``
    contributors)."""
    return frozenset((len(g.groups) + k - len(g.groups) * len(g.groups[0])) * k * k for g in groupings)


def final_collectives(goal: Goal) -> tuple[Collective, ...]:
    """Collectives that can produce the goal state as the last step."""
    return {
        Goal.ALLREDUCE: (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.BROADCAST),
        Goal.REDUCESCATTER: (Collective.REDUCESCATTER, Collective.ALLREDUCE, Collective.BROADCAST),
        Goal.ALLGATHER: (Collective.ALLGATHER, Collective.BROADCAST),
    }[goal]
