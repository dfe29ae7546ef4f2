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
* AllGather: members hold non-empty, pairwise disjoint chunk sets of equal size;
  all get the union.
* Reduce: AllReduce's precondition; the root (first member) gets the union,
  the others hold nothing.
* Broadcast: every member's state is contained in the root's (each held chunk is
  held by the root with a superset of contributors) and one is strictly smaller;
  all get the root's state.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

from .errors import SynthError
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
    if rows.shape[1] < 2:
        return ()
    return tuple(tuple(int(v) for v in row) for row in rows)


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
    level = hierarchy.level_index(instruction.level)
    ancestor = None
    if instruction.ancestor is not None:
        ancestor = hierarchy.level_index(instruction.ancestor)
        if ancestor >= level:
            raise SynthError(
                f"{instruction}: {instruction.form.value}({instruction.ancestor}) needs a level "
                f"above '{instruction.level}'"
            )
    return Grouping(level, instruction.form, ancestor, groups_of(hierarchy.sizes, level, instruction.form, ancestor))


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


def _make(stops: Sequence[int], masks: Sequence[int]) -> DeviceState:
    """Canonical device state from runs ending at ``stops`` (merging equal neighbours)."""
    out_stops: list[int] = []
    out_masks: list[int] = []
    for stop, mask in zip(stops, masks):
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
        return tuple(_make((d, d + 1, k), (0, 1 << d, 0)) for d in range(k))
    return tuple(((k,), (1 << d,)) for d in range(k))


def goal_state(goal: Goal, k: int) -> Union[State, None]:
    """The unique goal state, or None for ReduceScatter (any bijection of shards)."""
    full = (1 << k) - 1
    if goal is Goal.ALLREDUCE:
        return (((k,), (full,)),) * k
    if goal is Goal.ALLGATHER:
        return (_make(range(1, k + 1), [1 << c for c in range(k)]),) * k
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


def _count(s: DeviceState) -> int:
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


def _sum(states: Sequence[DeviceState]) -> Union[DeviceState, str]:
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
    return _make(stops, acc)


def _split(s: DeviceState, parts: int) -> Union[list[DeviceState], str]:
    """The held chunks of ``s`` in order, cut into ``parts`` equal parts."""
    total = _count(s)
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
    return [_from_runs(runs, k) for runs in out]


def _from_runs(runs: Sequence[Run], k: int) -> DeviceState:
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
    return _make(stops, masks)


def _contains(big: DeviceState, small: DeviceState) -> bool:
    """Every chunk of ``small`` is in ``big`` with a superset of contributors."""
    stops = tuple(sorted(set(big[0]) | set(small[0])))
    return all(b & m == m for b, m in zip(_refine(big, stops), _refine(small, stops)))


_REDUCING = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.REDUCE)


def apply_collective(collective: Collective, members: Sequence[DeviceState]) -> Union[list[DeviceState], str]:
    """New states of a group's members (root = first), or why the step is invalid."""
    if collective is Collective.ALLGATHER:
        if not any(members[0][1]):
            return "a member holds no data"
        if any(a == b for a, b in zip(members, members[1:])):
            return "members hold overlapping chunks"  # equal non-empty states overlap
        size = _count(members[0])
        if any(_count(s) != size for s in members):
            return "members hold different numbers of chunks"
        runs = sorted(run for s in members for run in runs_of(s))
        if any(runs[i][1] > runs[i + 1][0] for i in range(len(runs) - 1)):
            return "members hold overlapping chunks"
        union = _from_runs(runs, members[0][0][-1])
        return [union] * len(members)
    if collective is Collective.BROADCAST:
        root = members[0]
        if not any(root[1]):
            return "the root holds no data"
        if not all(s == root or _contains(root, s) for s in members[1:]):
            return "a member holds data the root does not contain"
        if all(s == root for s in members[1:]):
            return "no member gains information"
        return [root] * len(members)
    total = _sum(members)
    if isinstance(total, str):
        return total
    return _reduced(collective, total, len(members))


def _reduced(collective: Collective, total: DeviceState, size: int) -> Union[list[DeviceState], str]:
    if collective is Collective.ALLREDUCE:
        return [total] * size
    if collective is Collective.REDUCE:
        empty = ((total[0][-1],), (0,))
        return [total] + [empty] * (size - 1)
    return _split(total, size)  # ReduceScatter


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
        return sum(_count(s) for s in members)
    return _count(members[0])


def apply_step(state: State, collective: Collective, groups: Sequence[Group]) -> Union[State, str]:
    """Apply one instruction to every group at once; devices outside stay as they are."""
    return apply_grouping(state, groups, (collective,))[collective]


def apply_grouping(
    state: State, groups: Sequence[Group], collectives: Sequence[Collective]
) -> dict[Collective, Union[State, str]]:
    """:func:`apply_step` for several collectives on one grouping, sharing the
    group sums among AllReduce, ReduceScatter and Reduce."""
    out: dict[Collective, Union[State, str]] = {}
    reducing = [c for c in collectives if c in _REDUCING]
    if reducing:
        sums = []
        for group in groups:
            total = _sum([state[d] for d in group])
            if isinstance(total, str):
                for c in reducing:
                    out[c] = f"group {list(group)}: {total}"
                break
            sums.append(total)
        else:
            for c in reducing:
                out[c] = _assemble(state, groups, [_reduced(c, t, len(g)) for t, g in zip(sums, groups)])
    for c in collectives:
        if c not in _REDUCING:
            out[c] = _assemble(state, groups, (apply_collective(c, [state[d] for d in g]) for g in groups))
    return out


def _assemble(state: State, groups: Sequence[Group], results) -> Union[State, str]:
    new = list(state)
    for group, result in zip(groups, results):
        if isinstance(result, str):
            return f"group {list(group)}: {result}"
        for d, s in zip(group, result):
            new[d] = s
    return tuple(new)


def may_finish_in_one_step(state: State, goal: Goal) -> bool:
    """A cheap necessary condition for reaching the AllReduce goal in one step.

    The last step is an AllReduce (it keeps every device's chunks, so all devices
    hold all chunks), an AllGather (it copies sums, so every held sum is complete)
    or a Broadcast (its roots gain nothing, so some device is already done)."""
    if goal is not Goal.ALLREDUCE:
        return True
    k = len(state)
    full = (1 << k) - 1
    return (
        all(all(s[1]) for s in state)
        or all(mask in (0, full) for s in state for mask in s[1])
        or any(s == ((k,), (full,)) for s in state)
    )


def final_collectives(goal: Goal) -> tuple[Collective, ...]:
    """Collectives that can produce the goal state as the last step."""
    return {
        Goal.ALLREDUCE: (Collective.ALLREDUCE, Collective.ALLGATHER, Collective.BROADCAST),
        Goal.REDUCESCATTER: (Collective.REDUCESCATTER, Collective.ALLREDUCE, Collective.BROADCAST),
        Goal.ALLGATHER: (Collective.ALLGATHER, Collective.BROADCAST),
    }[goal]
