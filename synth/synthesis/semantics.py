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
:class:`StateSpace`, which interns device states (a state is a tuple of small
ids) and computes each group once per orbit (see its docstring); the functions
here are the rules, and the tests check the space against them.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial, reduce
from itertools import chain
from operator import and_, itemgetter
from typing import NamedTuple, Union

import numpy as np

from ..errors import SynthError
from .language import ROOT, Collective, Form, Instruction

Run = tuple[int, int, int]  # (first chunk, stop chunk, contributor bitmask)
# (run stops, run masks): runs partition chunks 0..k-1; mask 0 = not held
DeviceState = tuple[tuple[int, ...], tuple[int, ...]]
State = tuple[DeviceState, ...]
Group = tuple[int, ...]
Loads = tuple[int, ...]  # chunks one step moves, per synthesis group


class Packed(NamedTuple):
    """A state of a :class:`StateSpace` holding few distinct ids, as the
    search keeps it: which devices hold equal ids (each device's index into
    the distinct ids, first occurrence first, as bytes) and the distinct ids.
    ``k / 8`` times smaller than the tuple of ids, hashed once, and stepped
    without building that tuple (:meth:`StateSpace.expand`).

    With a ``shift`` (chunks per digit, one per level) the distinct ids are
    *relative*: device ``d`` holds its palette id moved by
    ``sum(shift[l] * digit_l(d))`` chunks (an id that holds nothing does not
    move). The search keys so a state of many distinct ids whose chunk
    positions follow its devices' digits (after ReduceScatters), where the
    ids it holds relative to those positions are few
    (:meth:`StateSpace.key`)."""

    labels: bytes
    palette: tuple[int, ...]
    shift: tuple[int, ...] = ()


#: what the search keeps per state: a :class:`Packed` state, or the tuple of its devices' ids (StateSpace.key)
StateKey = Union[Packed, tuple[int, ...]]


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


def _make(stops: Sequence[int], masks: Sequence[int]) -> DeviceState:
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
        return tuple(_make((d, d + 1, k), (0, 1 << d, 0)) for d in range(k))
    return tuple(((k,), (1 << d,)) for d in range(k))


def goal_state(goal: Goal, k: int) -> State | None:
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


def _sum(states: Sequence[DeviceState]) -> DeviceState | str:
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


def _split(s: DeviceState, parts: int) -> list[DeviceState] | str:
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


def _runs_at(firsts: np.ndarray, length: int, mask: int, k: int) -> DeviceState:
    """:func:`_from_runs` of one run of ``length`` chunks with contributors
    ``mask`` (non-zero) at each of ``firsts`` (sorted, runs disjoint), with
    numpy: touching runs merge into blocks, and the state alternates between
    nothing and ``mask``."""
    ends = firsts + length
    opens = np.ones(len(firsts), dtype=bool)
    opens[1:] = firsts[1:] != ends[:-1]  # a run that does not touch the one before opens a block
    starts, stops = firsts[opens], ends[np.append(opens[1:], True)]
    gap = starts > np.append(0, stops[:-1])  # a run of nothing before the block (every block but maybe the first)
    held = np.stack((np.where(gap, starts, -1), stops), axis=1).ravel()
    out_stops = held[held >= 0].tolist()
    out_masks = [0, mask] * len(starts)
    if not gap[0]:
        del out_masks[0]
    if out_stops[-1] < k:
        out_stops.append(k)
        out_masks.append(0)
    return (tuple(out_stops), tuple(out_masks))


def _first_occurrences(values: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct ``values`` in order of first occurrence and how many times
    each occurs (what ``Counter(values).items()`` lists), with numpy. Bytes
    (a uint8 array: labels, tokens) go through a table of each value's first
    position, without a sort (18 us against 30 us for 4,096)."""
    if isinstance(values, np.ndarray) and values.dtype == np.uint8:
        first = np.full(256, len(values))
        np.minimum.at(first, values, np.arange(len(values)))
        present = np.flatnonzero(first < len(values))
        order = present[np.argsort(first[present])]
        return order, np.bincount(values, minlength=256)[order]
    array = values if isinstance(values, np.ndarray) else np.fromiter(values, np.int64, len(values))
    distinct, first, counts = np.unique(array, return_index=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    return distinct[order], counts[order]


def _first_held(s: DeviceState) -> int:
    """The first chunk ``s`` holds, or -1 if it holds none (runs are merged,
    so only the first two runs need looking at). Works on profiles too."""
    if s[1][0]:
        return 0
    return s[0][0] if len(s[0]) > 1 else -1


def _shifted(s: DeviceState, x: int, k: int) -> DeviceState:
    """``s`` with every held chunk ``c`` moved to ``c + x`` (the caller keeps
    them inside ``0..k-1``). Works on profiles too. The rules commute with such
    a move applied to every member of a group: they compare and combine
    contributors chunk by chunk and split the held chunks in order. The
    definition that :func:`_at` and :func:`_down` (what the state space uses)
    are tested against."""
    return _from_runs([(a + x, b + x, v) for a, b, v in runs_of(s)], k)


def _at(base: DeviceState, first: int, k: int) -> DeviceState:
    """A base state (held chunks starting at chunk 0, or none) moved to start
    at chunk ``first`` (-1 or 0: as it is); :func:`_shifted` without building
    runs: a run of nothing goes in front and the last run, which holds
    nothing if the move fits, ends at ``k``."""
    if first <= 0:
        return base
    stops, masks = base
    assert not masks[-1], "a state moved past the last chunk"
    moved = (first, *[x + first for x in stops[:-1]])
    if moved[-1] == k:  # the held chunks now end at the last one
        return moved, (0, *masks[:-1])
    return (*moved, k), (0, *masks)


def _moved_runs(held: HeldRuns, first: int) -> HeldRuns:
    """A base state's held runs moved to start at chunk ``first`` (-1 or 0: as they are)."""
    return tuple((a + first, b + first) for a, b in held) if first > 0 else held


def _down(s: DeviceState, first: int, k: int) -> DeviceState:
    """``s``, whose first held chunk is ``first`` > 0, moved to start at chunk
    0 (:func:`_shifted` by ``-first`` without building runs): its leading run
    of nothing goes, and the end fills with nothing up to ``k``."""
    stops, masks = s
    if masks[-1]:
        return ((*[x - first for x in stops[1:]], k), (*masks[1:], 0))
    return ((*[x - first for x in stops[1:-1]], k), masks[1:])


def _contains(big: DeviceState, small: DeviceState) -> bool:
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


_REDUCING = (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.REDUCE)


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


def _held_count(held: HeldRuns) -> int:
    return sum(b - a for a, b in held)


def _within(small: HeldRuns, big: HeldRuns) -> bool:
    """Every chunk of ``small`` is in ``big`` (runs are merged, so each run of
    ``small`` lies inside one run of ``big``)."""
    j = 0
    for a, b in small:
        while j < len(big) and big[j][1] <= a:
            j += 1
        if j == len(big) or big[j][0] > a or big[j][1] < b:
            return False
    return True


def _union_count(helds: Sequence[HeldRuns]) -> int:
    """How many chunks the union of ``helds`` holds."""
    total, reach = 0, 0
    for a, b in sorted(run for held in helds for run in held):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def _shape_bits(held: Sequence[HeldRuns], size: int) -> int:
    """The collectives (bit ``i`` = the ``i``-th of :class:`Collective`) that
    pass :func:`_shape_reason` on ``held`` and ``size``: the same checks, each
    quantity computed once for the five."""
    root = held[0]
    count = _held_count(root)
    bits = 0
    if root and all(h == root for h in held):
        bits |= _SUMMING if count % size == 0 else _SUMMING & ~(1 << _BIT[Collective.REDUCESCATTER])
    if root and all(_within(h, root) for h in held):
        bits |= _BROADCASTING
    if all(_held_count(h) == count for h in held) and _union_count(held) == count * size:
        bits |= _COUNT_FREE  # AllGather
    return bits


def _shape_reason(collective: Collective, held: Sequence[HeldRuns], size: int) -> str | None:
    """Why the collective cannot run on a group of ``size`` members holding the
    chunks ``held`` (:func:`held_runs`, root first; members that hold the same
    state may be given once), judged without their contributors, or None.
    :func:`apply_collective` checks this first, so these are its reasons too.
    Chunk sets are runs, not bitmasks: with ``k`` chunks a bitmask per member
    is ``k`` bits, and groups of ``k`` members would cost ``k**2``."""
    root = held[0]
    if collective is Collective.ALLGATHER:
        count = _held_count(root)
        if any(_held_count(h) != count for h in held):
            return "members hold different numbers of chunks"
        if _union_count(held) != count * size:  # a state given once for several members overlaps itself
            return "members hold overlapping chunks"
        return None
    if collective is Collective.BROADCAST:
        if not root:
            return "the root holds no data"
        if not all(_within(h, root) for h in held):
            return "a member holds data the root does not contain"
        return None
    if any(h != root for h in held):
        return "members hold different chunks"
    if not root:
        return "a member holds no data"
    count = _held_count(root)
    if collective is Collective.REDUCESCATTER and count % size:
        return f"{count} held chunks do not split evenly into {size} parts"
    return None


#: a device state with each contributor mask replaced by its size: which chunks
#: are held and by how many contributors, the same in every frame of a
#: :class:`StateSpace`
Profile = tuple[tuple[int, ...], tuple[int, ...]]


def profile_of(s: DeviceState) -> Profile:
    return _make(s[0], [m.bit_count() for m in s[1]])


def _profile_reason(collective: Collective, members: Sequence[tuple[Profile, int]], size: int,
                    held: Sequence[HeldRuns] | None = None) -> str | None:
    """Why the collective cannot run on a group of ``size`` members, judged on
    their profiles alone, or None. ``members`` are ``(profile, how many members
    have it)``, root first. First which chunks are held (:func:`_shape_reason`),
    then how many contributors they carry (:func:`_count_reason`).
    :func:`apply_collective` checks this before looking at any mask, so these
    are its reasons too."""
    reason = _shape_reason(collective, [held_runs(p) for p, _ in members] if held is None else held, size)
    return reason if reason is not None else _count_reason(collective, members)


def _count_reason(collective: Collective, members: Sequence[tuple[Profile, int]]) -> str | None:
    """Summing more than ``k`` contributors on a chunk is double counting, and
    a Broadcast member with more contributors on a chunk than the root is not
    contained in it (for members that hold the right chunks)."""
    if collective is Collective.ALLGATHER:
        return None
    root = members[0][0]
    if collective is Collective.BROADCAST:
        if any(_more_contributors(p, root) for p, _ in members[1:]):
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


def _more_contributors(small: Profile, big: Profile) -> bool:
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


def _profile_results(collective: Collective, members: Sequence[tuple[Profile, int]], k: int) -> list[Profile]:
    """The members' profiles after ``collective``, from their profiles alone
    (for members that pass :func:`_profile_reason`): counts add where masks
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
        return [_from_runs(sorted(run for p, _ in members for run in runs_of(p)), k)] * size
    stops = tuple(sorted(set().union(*(p[0] for p, _ in members))))
    counts = [0] * len(stops)
    for p, n in members:
        for i, count in enumerate(_refine(p, stops)):
            counts[i] += n * count
    result = _reduced(collective, _make(stops, counts), size)
    assert not isinstance(result, str)  # the profile check passed: the counts divide
    return result


def apply_collective(collective: Collective, members: Sequence[DeviceState]) -> list[DeviceState] | str:
    """New states of a group's members (root = first), or why the step is invalid."""
    reason = _profile_reason(collective, [(profile_of(s), 1) for s in members], len(members))
    return reason if reason is not None else _apply_counted(collective, members)


def _apply_counted(collective: Collective, members: Sequence[DeviceState]) -> list[DeviceState] | str:
    """:func:`apply_collective` once :func:`_profile_reason` has passed: the
    checks that need the masks, and the results."""
    if collective is Collective.ALLGATHER:
        if not any(members[0][1]):
            return list(members)  # all hold nothing: the union is nothing
        runs = sorted(run for s in members for run in runs_of(s))
        return [_from_runs(runs, members[0][0][-1])] * len(members)
    if collective is Collective.BROADCAST:
        root = members[0]
        others = {id(s): s for s in members[1:]}.values()  # members often share one state object
        if not all(s == root or _contains(root, s) for s in others):
            return "a member holds data the root does not contain"
        if all(s == root for s in others):
            return "no member gains information"
        return [root] * len(members)
    total = _sum(members)
    if isinstance(total, str):
        return total
    return _reduced(collective, total, len(members))


def _reduced(collective: Collective, total: DeviceState, size: int) -> list[DeviceState] | str:
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


NO_CHANGE = "the step changes no device's state"


def apply_step(state: State, collective: Collective, groups: Sequence[Group]) -> State | str:
    """Apply one instruction to every group at once; devices outside stay as they
    are. The reference definition of a step (the search computes the same through
    a :class:`StateSpace`)."""
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
    (the reference that :meth:`StateSpace.may_finish` computes on profiles).

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


# ---------------------------------------------------------------- the search's state space


def _repeat(pattern: int, width: int, times: int) -> int:
    """``pattern`` (``width`` bits) repeated ``times`` times, lowest copy first."""
    out, shift, copies, copies_width = 0, 0, pattern, width
    while times:
        if times & 1:
            out |= copies << shift
            shift += copies_width
        copies |= copies << copies_width
        copies_width *= 2
        times >>= 1
    return out


#: entries a memo of translations keeps before it starts over: masks in :class:`Translations` (a mask is ``k``
#: bits), mask ids and base states in :class:`StateSpace` (``_moved_mask_ids``, ``_translated``)
_MOVED_MASKS_UPTO = 1 << 20


class Translations:
    """Digitwise translations of synthesis indices and the bit permutations they
    induce on contributor masks.

    A synthesis index is a mixed-radix number over the level sizes. The
    translation by ``t`` (a digit tuple) maps ``d`` to ``d + t``, added digit by
    digit modulo each level's size (no carries); these form an abelian group that
    acts on devices and, bit by bit, on contributor masks. On a mask the
    translation of one digit is a rotation inside blocks of ``size x stride``
    bits, a handful of big-integer operations whatever ``k`` is."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.sizes = tuple(sizes)
        self.k = math.prod(self.sizes)
        self.full = (1 << self.k) - 1
        self.strides = tuple(math.prod(self.sizes[l + 1:]) for l in range(len(self.sizes)))
        self._patterns: dict[tuple[int, int], tuple[int, int]] = {}
        self._moved: dict[tuple[int, tuple[int, ...]], int] = {}  # (mask, t) -> translated mask, see state

    def digits(self, d: int) -> tuple[int, ...]:
        return tuple((d // w) % s for s, w in zip(self.sizes, self.strides))

    def index(self, digits: Sequence[int]) -> int:
        return sum(x * w for x, w in zip(digits, self.strides))

    def inverse(self, t: Sequence[int]) -> tuple[int, ...]:
        return tuple(-x % s for x, s in zip(t, self.sizes))

    def mask(self, mask: int, t: Sequence[int]) -> int:
        """The mask ``{e + t : e in mask}``."""
        if mask == self.full:
            return mask
        for level, x in enumerate(t):
            if x and mask:
                mask = self._rotate(mask, level, x)
        return mask

    def state(self, s: DeviceState, t: tuple[int, ...]) -> DeviceState:
        """A device state with every contributor mask translated by ``t``
        (chunks stay; the runs stay canonical since the map is injective).
        The masks' translations are memoised per (mask, ``t``): the same
        contributor sets meet the same offsets in many groups (five levels
        of 4: 12,927 distinct of 158,148), and hashing a mask is cheaper
        than rotating it level by level."""
        if not any(t):
            return s
        moved = self._moved
        if len(moved) > _MOVED_MASKS_UPTO:
            moved.clear()
        out = []
        for m in s[1]:
            key = (m, t)
            found = moved.get(key)
            if found is None:
                found = moved[key] = self.mask(m, t)
            out.append(found)
        return (s[0], tuple(out))

    def saturate(self, mask: int, levels: Sequence[int]) -> int:
        """The union of the mask's translations by every value of the digits of
        ``levels`` (``ceil(log2 size)`` rotations per level)."""
        for level in levels:
            covered = 1
            while covered < self.sizes[level] and mask:
                mask |= self._rotate(mask, level, covered)
                covered *= 2
        return mask

    def invariant(self, mask: int, levels: Sequence[int]) -> bool:
        """Whether the mask is its own translation by every value of the digits
        of ``levels`` (a shift by one generates them all)."""
        if mask == self.full:  # every device: a common mask, and no rotation needed to see it
            return True
        return all(self._rotate(mask, level, 1) == mask for level in levels if mask and self.sizes[level] > 1)

    def _rotate(self, mask: int, level: int, x: int) -> int:
        size, stride = self.sizes[level], self.strides[level]
        block, up = size * stride, x * stride
        if block == self.k:
            return ((mask << up) | (mask >> (block - up))) & self.full
        key = (level, x)
        if key not in self._patterns:
            times = self.k // block
            self._patterns[key] = (_repeat((1 << (block - up)) - 1, block, times),
                                   _repeat((1 << up) - 1, block, times))
        low, top = self._patterns[key]
        return ((mask & low) << up) | ((mask >> (block - up)) & top)


Outcome = Union[tuple[tuple[int, ...], int], str]  # (members' new ids, chunks moved) or why not
#: what the lookahead sums per device (StateSpace._grouping_sums): whether it holds every chunk, whether it
#: is complete, its held chunks, its mass (contributor counts summed over chunks), whether it holds nothing,
#: and its held chunks squared
_QUANTITIES = ("holds every chunk", "complete", "held", "mass", "holds nothing", "held squared")
#: a state's _QUANTITIES at device 0, summed over every device, and per grouping summed over its group 0, its
#: roots and its members
Quantities = list[int]
GroupingSums = tuple[Quantities, Quantities, list[tuple[Quantities, Quantities, Quantities]]]


#: allreduce and reducescatter spaces of at least this many devices use the
#: device frame (:class:`StateSpace`); smaller ones are many-state searches in
#: which translating costs more than the orbits save, and store absolute states
DEVICE_FRAME_FROM = 512


#: in the device frame, groupings of at least this many groups are stepped with
#: numpy (:meth:`StateSpace._vector_successors`): their groups fall into a few
#: classes up to chunk shifts, and per-group Python would cost more
VECTOR_GROUPS_FROM = 1024


#: device-frame spaces of at least this many devices compute a state's profile
#: ids with numpy in :meth:`StateSpace.successors` (a new state there often
#: holds ``k`` new ids); below, the memoised per-id table is cheaper, and it
#: keeps one int object per id, which the memo keys share (new ints per state
#: cost 1.6x the time and memory at 1,024 devices)
NUMPY_PROFILES_FROM = 8192


#: from this many devices a group of every device is checked and stepped
#: without being memoised: its key is a whole state, which the search meets
#: about once, and each entry would keep ``k`` integers (at six levels of 4,
#: 3.7 GiB instead of 3.0 GiB, in the same time)
WHOLE_KEYS_FROM = 1024


#: groups of at least this many members have their members' profiles counted
#: with numpy (:meth:`StateSpace._check_profiles`); below, a Counter is cheaper
NUMPY_COUNTS_FROM = 2048


#: an AllGather of one base at this many positions or more builds its result
#: with numpy (:func:`_runs_at`); below, the loop over runs is cheaper
NUMPY_RUNS_FROM = 64


#: device-frame states of fewer than :data:`NUMPY_PROFILES_FROM` devices that
#: hold at most this many distinct ids are stepped per *pattern*
#: (:meth:`StateSpace._pattern_successors`): which devices hold equal ids, the
#: same for many states, so each grouping's classes of groups are found once per
#: pattern and a state costs per class, not per device. States with more
#: distinct ids (after a ReduceScatter every device holds other chunks) have as
#: many classes as groups, and the per-device path shares them across chunk shifts
#: (measured at five levels of 4: with every state per pattern, 16-bit labels, the
#: search was 10% slower). A pattern is one byte per device, hence 255 at most
PATTERN_IDS_UPTO = 255


#: groups of at most this many members are shared across chunk shifts
#: (:meth:`StateSpace._compute_shifted`): larger groups are few per step, and
#: normalising them costs more than sharing saves
SHIFTED_GROUPS_UPTO = 64


#: what StateSpace._intern_base finds for a mask object it has not stored
_UNSTORED = (None, None)


class _Derived(dict):
    """A table over the device frame's encoded ids (:class:`StateSpace`,
    "Positions"): a value is computed by ``fill`` on its first look-up and kept,
    so later look-ups (``map(table.__getitem__, ...)`` too) run at dict speed."""

    __slots__ = ("fill",)

    def __init__(self, fill: Callable[[int], object]) -> None:
        super().__init__()
        self.fill = fill

    def __missing__(self, key: int):
        value = self[key] = self.fill(key)
        return value


class StateSpace:
    """The semantics as the search and the tracer use it, on one synthesis
    hierarchy (its sizes) and goal.

    **Interned states.** A device state is stored once and named by a small id; a
    state is the tuple of its devices' ids, so looking it up hashes ``k`` small
    integers, not ``k`` masks of ``k`` bits.

    **Frames.** What is stored is a device state in a *frame* that makes states
    of symmetric devices equal:

    * for allreduce and reducescatter, relative to the device: device ``d``
      stores its state with every mask translated by ``-d``
      (:class:`Translations`). Initially every device stores "every chunk, from
      device 0": one id for all ``k`` devices.
    * for allgather, relative to the chunk: the mask of chunk ``x`` is
      translated by ``-x``, so the goal ("chunk ``x`` from device ``x``", ``k``
      different masks per device in absolute terms) is one run "from device 0".
    * below :data:`DEVICE_FRAME_FROM` devices (allreduce, reducescatter), the
      absolute state itself: such searches have many states and small groups,
      where translating costs more than sharing saves.

    Each is a bijection of the absolute states, so a tuple of ids names exactly
    one absolute state (:meth:`absolute`). The rules (:func:`apply_collective`) compare and combine
    masks chunk by chunk only, so they hold in the chunk frame as they are; in
    the device frame the members of a group are first translated into the
    root's frame by their offsets from the root.

    **Orbits.** The groups of one grouping are translates of each other (by their
    fixed digits), and the rules commute with translations. So the result of a
    group depends only on the collective, the grouping and its members' stored
    ids, and is computed once for all groups with the same ids (an orbit; in a
    uniform state all groups of a grouping are one orbit) and memoised.

    **Chunk shifts.** The rules also commute with moving every held chunk of a
    group's members by the same amount (they compare contributors chunk by
    chunk and split the held chunks in order). After a ReduceScatter over many
    devices every device holds other chunks, so every group's ids differ; in
    the device frame a group of at most :data:`SHIFTED_GROUPS_UPTO` members
    that holds nothing below some chunk is computed once, moved down to chunk
    0, for every group that is a shift of it (:meth:`_compute_shifted`, and
    :meth:`_passes_shifted` for the profile checks).

    **Patterns** (device frame, fewer than :data:`NUMPY_PROFILES_FROM`
    devices). A state that holds at most :data:`PATTERN_IDS_UPTO` distinct ids
    is its *pattern* (which devices hold equal ids) and its distinct ids. At
    five levels of 4, the search's 9,891 states share 2,357 patterns of 27
    distinct ids on average. Per pattern and grouping, the groups fall into
    classes that hold equal ids (6.5 on average); the checks, the lookahead and the
    outcomes are looked up once per class through the state's distinct ids, so
    a state costs per class, not per device (:meth:`_pattern_successors`).
    A class of more than :data:`_GETTER_MEMBERS_UPTO` members is checked on
    its members' distinct profiles and counts (:meth:`_Pattern.tallies`).
    The search keeps such a state as its pattern and distinct ids
    (:class:`Packed`, :meth:`key`) and steps it without a tuple of ``k`` ids:
    each next state's pattern is found from its parent's classes with one
    bytes translation (:meth:`expand`, :meth:`_tokens`, :meth:`_packed_key`).
    A state of more distinct ids whose chunk positions follow its devices'
    digits (after ReduceScatters) is kept as the pattern of its ids moved
    back by a *shift* (:class:`Packed`, :meth:`_shifted_key`); its groups of
    one class are alike up to one chunk shift each, computed once per class
    (:meth:`_shifted_successors`).

    **Shared memos** (device frame). A group's outcome depends on its members'
    offsets from its root, the same in all groups of a grouping: groupings
    with the same first group (parallel(j) and master(j) at one level) share
    one memo of outcomes.

    **Grouping sums.** Before any group is looked at, a state's per-device
    quantities (:data:`_QUANTITIES`) are summed over fixed sets of devices:
    device 0, every device, and per grouping its group 0, its roots and its
    members (:meth:`_grouping_sums`; one small matrix product per state, the
    counts per set and distinct id kept per pattern). The sums bound each
    collective's validity, and for the AllReduce goal they decide the
    lookahead of the last two steps exactly (:meth:`_hopeful`): at five levels
    of 4, 5,590 of the 7,675 states the step before last expands are done
    with before any grouping's classes are found.

    **Positions** (device frame). An id names a device state as its shape
    moved to start at chunk 0 (a *base* state, interned once) and where it
    starts: ``id = base * (k + 1) + first + 1`` (``first`` = -1: holds
    nothing). So the ``k`` states that one ReduceScatter leaves at ``k``
    positions are one base state, not ``k`` interned ones; moving a state by
    ``x`` chunks adds ``x`` to its id; and whatever does not depend on where the
    chunks lie (masks, counts, the lookahead's flags) is read from the base.
    Tables per id are filled on first look-up (:class:`_Derived`). The chunk
    and absolute frames number their states densely.

    **Masks.** A contributor mask has ``k`` bits, so anything done per member
    of a group of ``k`` members costs ``k**2``: held chunks are runs, not
    bitmasks (:func:`held_runs`); from :data:`DEVICE_FRAME_FROM` devices, device
    states are interned by mask ids, each mask object of a stored state looked
    up by identity (hashing a mask reads all its bits), with its contributor
    count; translations are memoised per
    (state, offset), a translated state is interned through its masks' ids,
    each mask id's translation memoised per offset, with its base's profile
    (:meth:`_translated_base`), and a Broadcast's members are compared one at
    a time.
    """

    def __init__(self, sizes: Sequence[int], goal: Goal, frame: str | None = None,
                 by_value: bool | None = None) -> None:
        self.sizes = tuple(sizes)
        self.goal = goal
        self.hierarchy = Hierarchy(tuple(f"l{i}" for i in range(len(self.sizes))), self.sizes)
        self.k = self.hierarchy.k
        self.groupings = distinct_groupings(self.hierarchy)
        # the masses a state that the last step (AllReduce or AllGather) finishes can have (see may_finish)
        k = self.k
        self._finishing_masses = finishing_masses(self.groupings, k)
        # per grouping: (members per group, groups, devices in its groups), for _hopeful
        self._shapes_of = [(len(g.groups[0]), len(g.groups), len(g.groups) * len(g.groups[0])) for g in self.groupings]
        self.translations = Translations(self.sizes)
        # the frame (see the class docstring); "absolute" (no translation) where
        # few devices make orbits small and translating costs more than it saves
        if frame is None:
            frame = "chunk" if goal is Goal.ALLGATHER else "device" if self.k >= DEVICE_FRAME_FROM else "absolute"
        if frame not in ("device", "chunk", "absolute") or (frame == "chunk") != (goal is Goal.ALLGATHER):
            raise ValueError(f"frame {frame!r} for {goal.value}")
        self.frame = frame
        self._device_frame = self.frame == "device"
        t = self.translations
        # member offsets from the root, per grouping (the same in all its groups)
        # per grouping, the inverse offsets of its group 0's members as devices (built when first
        # needed: a grouping of 131,072 members takes a while) and the levels whose digits vary
        self._inverse_offsets: dict[int, tuple[int, ...]] = _Derived(
            lambda g: tuple(t.index(t.inverse(t.digits(m))) for m in self.groupings[g].groups[0]))
        strides, sizes = np.array(t.strides), np.array(self.sizes)
        digits = [(np.array(g.groups[0])[:, None] // strides) % sizes for g in self.groupings]
        self._varied = [tuple(np.flatnonzero(d.any(axis=0)).tolist()) for d in digits]
        # per grouping: the members of all its groups in one tuple (group-major),
        # the group size, and the picker that assembles the next state from
        # (members' new ids + old state)
        self._flat = [itemgetter(*chain.from_iterable(g.groups)) for g in self.groupings]
        self._size = [len(g.groups[0]) for g in self.groupings]
        self._pickers = [_picker(g.groups, self.k) for g in self.groupings]
        # whether a grouping's groups hold every device: its picker then reads the members' new ids alone
        self._covers = [len(g.groups) * len(g.groups[0]) == self.k for g in self.groupings]
        # device state ids by (stops, mask ids), or by value (_by_value); mask
        # ids by value, and by the identity of mask objects held in stored states
        self._ids: dict[tuple[tuple[int, ...], tuple[int, ...]] | DeviceState, int] = {}
        # below DEVICE_FRAME_FROM devices masks are short and hash quickly: states
        # are keyed by value (``by_value`` chooses, for tests)
        self._by_value = self.k < DEVICE_FRAME_FROM if by_value is None else by_value
        self._mask_values: dict[int, int] = {}
        self._mask_ids: dict[int, tuple[int, int]] = {}
        self._mask_counts: list[int] = []  # per mask id: its number of contributors
        self._mask_list: list[int] = []  # per mask id: the mask (the first object met with its value)
        self._base_mask_ids: list[tuple[int, ...]] = []  # per base state (by mask ids): its masks' ids
        self._moved_mask_ids: dict[int, int] = {}  # mask id * k + offset index -> id, see _translated_base
        # base states (see "Positions"; every state where ids are dense) and their profile ids
        self._base_states: list[DeviceState] = []
        self._base_profile: list[int] = []
        # profiles (profile_of) of the device states, interned likewise: base profiles,
        # their held runs, held chunk counts and lookahead flags (see _delta)
        self._profile_ids: dict[Profile, int] = {}
        self._base_profiles: list[Profile] = []
        self._base_held: list[HeldRuns] = []
        self._base_held_count: list[int] = []
        self._base_whole: list[bool] = []  # per base profile: one run over every chunk (see _whole_members)
        self._base_whole_array = np.zeros(0, dtype=bool)
        self._base_packed: list[int] = []
        # per base device state its profile's _QUANTITIES, as rows of an array grown as states are interned
        # (see _device_quantities)
        self._quantity_rows = np.zeros((0, len(_QUANTITIES)), dtype=np.int64)
        self._quantities_filled = 0
        self._set_index: tuple[np.ndarray, np.ndarray] | None = None  # see _grouping_sets
        self._exact_in_floats = self.k**3 < 2**53  # sums of quantities (at most k**3) are exact as floats
        self._encoded = self._device_frame  # ids encode positions ("Positions")
        self._stride = self.k + 1
        if self._encoded:
            stride = self._stride
            base_states, base_profile = self._base_states, self._base_profile
            base_profiles, base_held = self._base_profiles, self._base_held
            base_held_count, base_packed = self._base_held_count, self._base_packed
            self.device_states: Sequence[DeviceState] = _Derived(
                lambda i: _at(base_states[i // stride], i % stride - 1, self.k))
            self._profile: Sequence[int] = _Derived(lambda i: base_profile[i // stride] + max(i % stride - 1, 0))
            self._profiles: Sequence[Profile] = _Derived(
                lambda p: _at(base_profiles[p // stride], p % stride - 1, self.k))
            self._held: Sequence[HeldRuns] = _Derived(lambda p: _moved_runs(base_held[p // stride], p % stride - 1))
            self._held_count: Sequence[int] = _Derived(lambda p: base_held_count[p // stride])
            self._packed: Sequence[int] = _Derived(lambda p: base_packed[p // stride])
        else:
            self.device_states = self._base_states
            self._profile = self._base_profile  # device state id -> profile id
            self._profiles = self._base_profiles
            self._held = self._base_held  # profile id -> held_runs
            self._held_count = self._base_held_count  # profile id -> number of held chunks
            self._packed = self._base_packed  # per profile: holds all, complete, done, final, packed (see _delta)
        self._passing: dict[tuple[int, ...], int] = {}  # member profiles -> bit set of collectives that pass them
        # from WHOLE_KEYS_FROM devices a group of every device is not memoised (here and in _deltas and
        # _memos): its key is a whole state, met about once by the search, and k integers to keep
        self._whole_key = self.k if self.k >= WHOLE_KEYS_FROM else self.k + 1
        self._deltas: list[dict[tuple[int, ...], int]] = [{} for _ in Collective]  # per collective (see _delta)
        # per collective and grouping: group members' ids -> outcome; in the
        # device frame a group's outcome depends on its members' offsets from
        # the root, the same in all its groups: groupings whose first groups are
        # the same (parallel(j) and master(j) at one level: 15 of 36 groupings
        # at six levels of 4) share one memo; elsewhere every grouping of a
        # collective shares one
        first_of: dict[Group, int] = {}
        self._alike = [first_of.setdefault(g.groups[0], i) for i, g in enumerate(self.groupings)]
        memos = [[{} for _ in self.groupings] if self._device_frame else [{}] * len(self.groupings)
                 for _ in _COLLECTIVES]
        self._memos: list[list[dict[tuple[int, ...], Outcome]]] = [[per[g] for g in self._alike] for per in memos]
        self._contained: dict[tuple[int, int], bool] = {}  # (root id, member id) -> _contains, see _broadcast
        self._exceeds: dict[tuple[int, int], bool] = {}  # (profile, root profile) -> _more_contributors
        self._chosen: dict[tuple[Collective, ...], dict[int, tuple[Collective, ...]]] = {}  # see _choose
        self._member_arrays: dict[int, np.ndarray] = {}  # see _member_array
        self._refs: dict[tuple[int, ...], np.ndarray] = {}  # see _ref
        self._digits: np.ndarray | None = None  # see _digit_matrix
        self._shiftable: bool | None = None  # see _shifts_apply
        self._patterns: dict[bytes, _Pattern] = {}  # see _pattern_successors
        self._base_profile_array = np.zeros(0, dtype=np.int64)  # _base_profile as an array (_profile_ids_of)
        self._base_profile_store, self._base_profile_capacity = self._base_profile_array, 0  # its room to grow
        # per device state id: its held runs (first, stop), each run of one mask (chunk_runs); encoded
        # ids move their base's runs (one per base) to their first chunk
        self._base_run_bounds: dict[int, tuple[tuple[int, int], ...]] = _Derived(
            lambda b: tuple((a, e) for a, e, _ in runs_of(self._base_states[b])))
        self._held_runs: dict[int, tuple[tuple[int, int], ...]] = _Derived(self._run_bounds)
        self._shapes: dict[tuple[tuple[int, ...], int], int] = {}  # (held chunks of the distinct profiles, size) -> _shape_bits
        self._sums: dict[tuple, DeviceState | str] = {}  # a group's sum, shared by the summing collectives
        self._invariants: dict[tuple[int, int], bool] = {}
        self._moved: dict[tuple[int, int], DeviceState] = {}  # see _move
        self._translated: dict[int, int] = {}  # base * k + offset -> base id, see _member_ids
        # chunk shifts (see _compute_shifted; device frame, where ids move by adding)
        self._shifted_memos: list[list[dict[tuple, Outcome]]] = [  # shared like _memos
            [per[g] for g in self._alike] for per in [[{} for _ in self.groupings] for _ in _COLLECTIVES]]
        self._shifted_passing: dict[tuple, int] = {}
        self._counted_passing: dict[tuple[int, tuple[tuple[int, int], ...]], int] = {}  # see _passes_counted
        self._done_profile = self._intern_profile(((self.k,), (self.k,)))  # every chunk from every device
        k, full = self.k, t.full
        if goal is Goal.ALLGATHER:
            self.start = tuple(self.intern(_make((d, d + 1, k), (0, 1, 0))) for d in range(k))
            self._goal_id = self.intern(((k,), (1,)))
        elif self._device_frame:
            self.start = (self.intern(((k,), (1,))),) * k
            self._goal_id = self.intern(((k,), (full,)))
        else:
            self.start = tuple(self.intern(((k,), (1 << d,))) for d in range(k))
            self._goal_id = self.intern(((k,), (full,)))

    # ---- device states

    def intern(self, s: DeviceState) -> int:
        """The id of device state ``s`` (see "Positions")."""
        if not self._encoded:
            return self._intern_base(s)
        first = _first_held(s)
        return self._intern_base(_down(s, first, self.k) if first > 0 else s) * self._stride + first + 1

    def _intern_base(self, s: DeviceState) -> int:
        """The dense id of ``s`` among the base states."""
        states = self._base_states
        if self._by_value:
            i = self._ids.get(s)
            if i is None:
                i = self._ids[s] = len(states)
                states.append(s)
                self._base_profile.append(self._intern_profile(profile_of(s)))
            return i
        masks = self._mask_ids
        get = masks.get  # a stored mask object: one look-up by identity (a mask id is never None)
        mask_ids = tuple([found[1] if (found := get(id(m), _UNSTORED))[0] is m else self._mask_id(m) for m in s[1]])
        return self._interned_by_masks(s, mask_ids)

    def _interned_by_masks(self, s: DeviceState, mask_ids: tuple[int, ...], profile: int | None = None) -> int:
        """The id of base state ``s``, whose masks have ids ``mask_ids``,
        stored if new with its profile id: ``profile``, or found from the
        masks' contributor counts when None."""
        states = self._base_states
        i = self._ids.setdefault((s[0], mask_ids), len(states))
        if i == len(states):
            states.append(s)
            self._base_mask_ids.append(mask_ids)
            known = self._mask_ids
            for m, mask_id in zip(s[1], mask_ids):  # stored for good: later states sharing these objects skip hashing
                known[id(m)] = (m, mask_id)
            if profile is None:
                counts = self._mask_counts
                profile = self._intern_profile(_make(s[0], [counts[m] for m in mask_ids]))
            self._base_profile.append(profile)
        return i

    def _translated_base(self, base: int, offset: int) -> int:
        """The id of base state ``base`` with every mask translated by the
        digits of device ``offset`` (:meth:`Translations.state`), found through
        mask ids: each mask id's translation is memoised per offset (capped at
        :data:`_MOVED_MASKS_UPTO`), so a translated state is looked up by its
        stops and mask ids without hashing or building a mask it has met
        before. A translation permutes each mask's bits, so the contributor
        counts, hence the profile, are the base's: a new translated state
        takes its profile id. States interned by value translate their state."""
        if not offset:
            return base
        if self._by_value:
            return self._intern_base(self.translations.state(self._base_states[base],
                                                             self.translations.digits(offset)))
        moved, k = self._moved_mask_ids, self.k
        if len(moved) > _MOVED_MASKS_UPTO:
            moved.clear()
        mask_ids = []
        for mask_id in self._base_mask_ids[base]:
            found = moved.get(mask_id * k + offset)
            if found is None:
                mask = self.translations.mask(self._mask_list[mask_id], self.translations.digits(offset))
                found = moved[mask_id * k + offset] = self._mask_id(mask)
            mask_ids.append(found)
        mask_ids = tuple(mask_ids)
        stops = self._base_states[base][0]
        i = self._ids.get((stops, mask_ids))
        if i is None:
            masks = self._mask_list
            i = self._interned_by_masks((stops, tuple([masks[m] for m in mask_ids])), mask_ids,
                                        self._base_profile[base])
        return i

    def _masks(self, i: int) -> tuple[int, ...]:
        """The contributor masks of device state ``i`` (where its chunks lie
        does not change them)."""
        return self._base_states[i // self._stride][1] if self._encoded else self.device_states[i][1]

    def runs(self, i: int) -> list[Run]:
        """:func:`runs_of` device state ``i``, without building the state."""
        if not self._encoded:
            return runs_of(self.device_states[i])
        x = max(i % self._stride - 1, 0)
        return [(a + x, b + x, m) for a, b, m in runs_of(self._base_states[i // self._stride])]

    def _run_bounds(self, i: int) -> tuple[tuple[int, int], ...]:
        """The ``(first, stop)`` of each of :meth:`runs` ``(i)``."""
        if not self._encoded:
            return tuple((a, b) for a, b, _ in self.runs(i))
        bounds, x = self._base_run_bounds[i // self._stride], i % self._stride - 1
        return tuple([(a + x, b + x) for a, b in bounds]) if x > 0 else bounds

    def _mask_id(self, mask: int) -> int:
        """A small id per distinct mask value (hashing a mask of ``k`` bits
        reads all of them; :meth:`intern` looks stored mask objects up by
        identity first), and its number of contributors."""
        out = self._mask_values.setdefault(mask, len(self._mask_values))
        if out == len(self._mask_counts):
            self._mask_counts.append(mask.bit_count())
            self._mask_list.append(mask)
        return out

    def _intern_profile(self, profile: Profile) -> int:
        """The id of a profile (encoded like device states, "Positions")."""
        if not self._encoded:
            return self._intern_base_profile(profile)
        first = _first_held(profile)
        base = self._intern_base_profile(_down(profile, first, self.k) if first > 0 else profile)
        return base * self._stride + first + 1

    def _intern_base_profile(self, profile: Profile) -> int:
        p = self._profile_ids.get(profile)
        if p is None:
            k = self.k
            p = self._profile_ids[profile] = len(self._base_profiles)
            self._base_profiles.append(profile)
            held = held_runs(profile)
            self._base_held.append(held)
            self._base_held_count.append(_count(profile))
            self._base_whole.append(len(profile[0]) == 1 and profile[1][0] > 0)
            runs = runs_of(profile)
            holds_all = held == ((0, k),)
            complete = all(count in (0, k) for count in profile[1])
            done = profile == ((k,), (k,))
            if self.goal is Goal.REDUCESCATTER:
                final = len(runs) == 1 and runs[0][1] - runs[0][0] == 1 and runs[0][2] == k
            else:
                final = profile == ((k,), (1 if self.goal is Goal.ALLGATHER else k,))
            mass = sum((stop - first) * count for first, stop, count in runs)  # contributors over the chunks
            # the four flags and the mass do not depend on where the chunks lie (the same for every position)
            self._base_packed.append(sum(int(value) << (_FIELD * i)
                                         for i, value in enumerate((holds_all, complete, done, final, mass))))
        return p

    # The lookahead counts, per state, the devices whose profile holds every
    # chunk, is complete (counts 0 or k), is done, is final, and sums their
    # contributor counts over devices and chunks, the mass (:meth:`_intern_profile`):
    # five numbers packed in one integer (fields of _FIELD bits). A step changes
    # them by the sum over its groups of what each group changes, which depends
    # on the members' profiles only.

    def _delta(self, collective: Collective, profiles: tuple[int, ...]) -> int:
        """How one group changes the packed counts, plus _OFFSETS (keeps every
        field non-negative); for members that pass the profile checks."""
        deltas = self._deltas[_BIT[collective]]
        out = deltas.get(profiles)
        if out is None:
            packed = self._packed
            if collective is Collective.BROADCAST:  # every member ends with the root's profile
                gained = len(profiles) * packed[profiles[0]]
            else:  # members that end alike often share one result object: intern it once
                members = [(self._profiles[p], n) for p, n in self._counted(profiles)]
                gained, interned = 0, {}
                for result in _profile_results(collective, members, self.k):
                    flags = interned.get(id(result))
                    if flags is None:
                        flags = interned[id(result)] = packed[self._intern_profile(result)]
                    gained += flags
            out = gained - sum(map(packed.__getitem__, profiles)) + _OFFSETS
            if len(profiles) < self._whole_key:
                deltas[profiles] = out
        return out

    def absolute(self, state: tuple[int, ...]) -> State:
        """The absolute state (:func:`initial_state`'s representation) of ``state``."""
        t = self.translations
        out = []
        for d, i in enumerate(state):
            s = self.device_states[i]
            if self.frame == "absolute":
                out.append(s)
            elif self._device_frame:
                out.append(t.state(s, t.digits(d)))
            else:
                first, masks = 0, []
                for stop, mask in zip(*s):  # runs of one mask span several chunks: split them
                    masks.extend(t.mask(mask, t.digits(x)) for x in range(first, stop))
                    first = stop
                out.append(_make(range(1, self.k + 1), masks))
        return tuple(out)

    # ---- goal

    def is_goal(self, state: StateKey) -> bool:
        """:func:`is_goal` of the absolute state (masks 0 and full, and chunk
        positions, look the same in every frame); ``state`` may be a search
        key (:meth:`key`)."""
        if state.__class__ is Packed:
            if self.goal is not Goal.REDUCESCATTER:
                return state.palette == (self._goal_id,) and not state.shift
            state = self.devices(state)
        if self.goal is not Goal.REDUCESCATTER:  # device 0 first: most states are told apart there
            return state[0] == self._goal_id and state.count(self._goal_id) == self.k
        full, chunk = self.translations.full, {}
        for i in set(state):
            runs = self.runs(i)
            if len(runs) != 1 or runs[0][1] - runs[0][0] != 1 or runs[0][2] != full:
                return False
            chunk[i] = runs[0][0]
        return len({chunk[i] for i in state}) == self.k

    def may_finish(self, state: StateKey) -> bool:
        """:func:`may_finish_in_one_step`, on the state's packed profile
        counts (:meth:`_after_passes`) and device 0: the last step is an
        AllReduce (every device holds every chunk), an AllGather (every held
        sum is complete) or a Broadcast (device 0, the root of its group in
        every grouping, is done already), and a last AllReduce or AllGather on
        a grouping of ``G`` groups over ``n`` devices leaves the ``k - n``
        others as they are, so they are done, and gives each group ``k`` chunks
        of ``k`` contributors: the state's mass (its contributor counts summed
        over devices and chunks) is ``(G + k - n) * k**2`` for one of the
        groupings."""
        if self.goal is not Goal.ALLREDUCE:
            return True
        packed = self._packed
        profile = self._profile
        if (packed[profile[state[0] if state.__class__ is not Packed else state.palette[0]]]
                >> (_FIELD * 2)) & _MASK:  # device 0 is done (a Packed state's first distinct id is device 0's)
            return True
        if state.__class__ is Packed:
            counted = zip(self._palette_ids(state), self._pattern_of(state.labels).counts)
        else:
            counted = Counter(state).items()
        return self._after_passes(sum(n * packed[profile[i]] for i, n in counted), "finish")

    # ---- steps

    def chunk_runs(self, state: tuple[int, ...], grouping: int, collective: Collective,
                   group: int) -> tuple[tuple[int, int], ...]:
        """The ordered chunk list of one group of a valid step, as ``(first,
        stop)`` runs (:func:`step_chunks`; which chunks are held is the same in
        every frame)."""
        members = self.groupings[grouping].groups[group]
        if collective is not Collective.ALLGATHER:
            return self._held_runs[state[members[0]]]
        return tuple(chain.from_iterable(map(self._held_runs.__getitem__, map(state.__getitem__, members))))

    def _passes(self, profiles: tuple[int, ...]) -> int:
        """The collectives (bit ``i`` = the ``i``-th of :class:`Collective`) whose
        :func:`_profile_reason` passes members with these profile ids, memoised:
        many groups differ in contributors only. The shape check (which chunks
        are held) is memoised on the members' held chunks, and the contributor
        counts are looked at only for the collectives that pass it. A root that
        is done (every chunk from every device) passes Broadcast alone: it
        contains every member, and no other collective can run with it."""
        bits = self._passing.get(profiles)
        if bits is None:
            if profiles[0] == self._done_profile:
                bits = _BROADCASTING
            elif self._device_frame and len(profiles) <= SHIFTED_GROUPS_UPTO:
                bits = self._passes_shifted(profiles)
            else:
                bits = self._check_profiles(profiles)
            if len(profiles) < self._whole_key:
                self._passing[profiles] = bits
        return bits

    def _passes_shifted(self, profiles: tuple[int, ...]) -> int:
        """:meth:`_check_profiles`, shared by groups whose members' profiles are
        the same up to one chunk shift (device frame; see :meth:`_compute_shifted`)."""
        base, key = self._moved_down(profiles)
        if not base:
            return self._check_profiles(profiles)
        bits = self._shifted_passing.get(key)
        if bits is None:
            bits = self._shifted_passing[key] = self._check_profiles(profiles)
        return bits

    def _check_profiles(self, profiles: tuple[int, ...]) -> int:
        """See :meth:`_passes` (not memoised)."""
        arrays = None
        if self._encoded and len(profiles) >= NUMPY_COUNTS_FROM:  # counted with numpy
            arrays = _first_occurrences(profiles)
            counted = list(zip(arrays[0].tolist(), arrays[1].tolist()))
        else:
            counted = self._counted(profiles)
        return self._check_counted(counted, len(profiles), arrays)

    def _passes_counted(self, counted: tuple[tuple[int, int], ...], size: int) -> int:
        """:meth:`_passes` of a group of ``size`` members given as its distinct
        profile ids and how many members hold each (root first, the others in
        any order): the checks look at the root and the multiset of profiles
        only. Memoised on ``(size, counted)``, a key of a few pairs however
        many members the group has (a pattern's large classes, see
        :meth:`_pattern_successors`)."""
        key = (size, counted)
        bits = self._counted_passing.get(key)
        if bits is None:
            if counted[0][0] == self._done_profile:
                bits = _BROADCASTING
            else:
                bits = self._check_counted(counted, size)
            self._counted_passing[key] = bits
        return bits

    def _check_counted(self, counted: Sequence[tuple[int, int]], size: int,
                       arrays: tuple[np.ndarray, np.ndarray] | None = None) -> int:
        """:meth:`_check_profiles` of the members' distinct profile ids with
        their counts (root first; ``arrays``: the same as two arrays, for many)."""
        if self._encoded and len(counted) > 16:  # many positions: from the base states' runs
            shape = self._positions_shape(counted, size, arrays)
        elif len(counted) > 16:  # rare and large: hashing would cost more than checking
            shape = _shape_bits([self._held[p] for p, _ in counted], size)
        else:
            held = [self._held[p] for p, _ in counted]
            shape_key = (tuple(held), size)
            shape = self._shapes.get(shape_key)
            if shape is None:
                shape = self._shapes[shape_key] = _shape_bits(held, size)
        bits = shape & _COUNT_FREE
        if shape & _SUMMING:  # the same count check for the three summing collectives
            if _count_reason(Collective.ALLREDUCE, [(self._profiles[p], n) for p, n in counted]) is None:
                bits |= shape & _SUMMING
        if shape & _BROADCASTING:  # _count_reason of Broadcast, one pair of profiles at a time
            root, exceeds = counted[0][0], self._exceeds
            if not any(exceeds[p, root] if (p, root) in exceeds else self._exceeding(p, root) for p, _ in counted):
                bits |= _BROADCASTING
        return bits

    def _positions_shape(self, counted: Sequence[tuple[int, int]], size: int,
                         arrays: tuple[np.ndarray, np.ndarray] | None = None) -> int:
        """:func:`_shape_bits` of members with these encoded profile ids (each
        with how many members have it, root first; ``arrays``: the same as two
        arrays, for many members) without building their held runs: each
        distinct base's runs moved to each of its positions, with numpy
        ("Positions"; after a ReduceScatter every member's runs lie elsewhere).
        The same bits: summing when every member holds the root's runs at the
        root's position (a run set moved elsewhere is another set), Broadcast
        when every member's runs lie within the root's, AllGather when the
        counts are equal and no two members' runs overlap."""
        stride = self._stride
        root_base, root_first = divmod(counted[0][0], stride)
        root_first -= 1
        if arrays is None:  # a loop over the few distinct profiles
            by_base: dict[int, list[tuple[int, int]]] = {}
            for p, n in counted:
                by_base.setdefault(p // stride, []).append((p % stride - 1, n))
            firsts_of = {b: np.array([f for f, _ in at if f >= 0], dtype=np.int64) for b, at in by_base.items()}
            copies = sum(n - 1 for at in by_base.values() for f, n in at if f >= 0)
            at_root = all(f == root_first for at in by_base.values() for f, _ in at)
        else:  # many: grouped by base with numpy
            ids, counts = arrays
            bases, firsts = np.divmod(ids, stride)
            firsts -= 1  # the first held chunk; -1: holds none
            holding = firsts >= 0
            firsts_of = {b: firsts[holding & (bases == b)] for b in np.unique(bases).tolist()}
            copies = int((counts[holding] - 1).sum())
            at_root = bool((firsts == root_first).all())
        root_held = self._base_held[root_base]
        if root_first < 0 or not root_held:  # the root holds nothing: at most AllGather, if none holds any
            return _COUNT_FREE if all(not self._base_held[b] for b in firsts_of) else 0
        bits = 0
        if at_root and all(self._base_held[b] == root_held for b in firsts_of):
            count = self._base_held_count[root_base]
            bits |= _SUMMING if count % size == 0 else _SUMMING & ~(1 << _BIT[Collective.REDUCESCATTER])
        starts, stops = [], []
        for b, at in firsts_of.items():
            if len(at):
                held = np.array(self._base_held[b], dtype=np.int64).reshape(-1, 2)
                starts.append((at[:, None] + held[None, :, 0]).ravel())
                stops.append((at[:, None] + held[None, :, 1]).ravel())
        start, stop = np.concatenate(starts), np.concatenate(stops)
        root_runs = np.array(root_held, dtype=np.int64) + root_first
        inside = np.searchsorted(root_runs[:, 0], start, side="right") - 1  # the root run each could lie in
        if ((inside >= 0) & (stop <= root_runs[np.maximum(inside, 0), 1])).all():
            bits |= _BROADCASTING
        if len({self._base_held_count[b] for b in firsts_of}) == 1 and not copies:  # equal counts, none at one place
            order = np.argsort(start, kind="stable")
            start, stop = start[order], stop[order]
            if (start[1:] >= np.maximum.accumulate(stop)[:-1]).all():  # pairwise disjoint
                bits |= _COUNT_FREE
        return bits

    def _exceeding(self, p: int, root: int) -> bool:
        """Whether profile ``p`` carries more contributors than profile ``root``
        on some chunk (:func:`_more_contributors`), memoised in ``_exceeds``."""
        out = self._exceeds[p, root] = _more_contributors(self._profiles[p], self._profiles[root])
        return out

    def _counted(self, profiles: tuple[int, ...]) -> list[tuple[int, int]]:
        """Distinct profile ids (first occurrence first) and how many members have each."""
        counts = Counter(profiles) if len(profiles) > 16 else {p: profiles.count(p) for p in dict.fromkeys(profiles)}
        return list(counts.items())

    def _compute(self, grouping: int, collective: Collective, key: tuple[int, ...], checked: bool = False) -> Outcome:
        """The outcome of ``collective`` on one group of ``grouping`` whose
        members store ``key``; ``checked``: the members are known to pass the
        profile checks (:meth:`_passes`)."""
        if not checked:
            profiles = tuple(map(self._profile.__getitem__, key))
            if not self._passes(profiles) >> _BIT[collective] & 1:
                members = self._counted(profiles)
                return _profile_reason(collective, [(self._profiles[p], n) for p, n in members], len(profiles),
                                       [self._held[p] for p, _ in members])
        if collective is Collective.BROADCAST and key[0] == self._goal_id and self.goal is not Goal.ALLGATHER:
            # the root holds every chunk from every device: it contains every member
            if key.count(key[0]) == len(key):
                return "no member gains information"
            return (key[0],) * len(key), self.k
        if collective is Collective.BROADCAST and not self._device_frame:
            return self._broadcast(key)
        if self._device_frame and checked and len(key) <= SHIFTED_GROUPS_UPTO:
            return self._compute_shifted(grouping, collective, key)
        return self._compute_here(grouping, collective, key)

    def _compute_shifted(self, grouping: int, collective: Collective, key: tuple[int, ...]) -> Outcome:
        """:meth:`_compute_here`, shared by groups whose members are the same up
        to one chunk shift: a group whose members hold nothing below chunk
        ``base`` is computed once with every member moved down by ``base``
        (memoised per the members' states moved to start at chunk 0 and their
        shifts relative to ``base``), and the results are moved back up. After a
        ReduceScatter over many devices each device holds other chunks, so every
        group's ids differ while the groups are shifts of one another.

        A step that fails is computed again unshifted: its reason names chunks."""
        base, down = self._moved_down(key)
        if not base:
            return self._compute_here(grouping, collective, key)
        memo = self._shifted_memos[_BIT[collective]][grouping]
        out = memo.get(down)
        if out is None:
            out = memo[down] = self._compute_here(grouping, collective, down)
        if out.__class__ is str:
            return self._compute_here(grouping, collective, key)
        ids, load = out
        stride = self._stride
        return tuple(r + base if r % stride else r for r in ids), load  # back up by base

    def _moved_down(self, ids: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        """For group members ``ids`` (encoded state or profile ids, "Positions"):
        ``base``, the first chunk any of them holds (0 if none), and the members
        moved down by ``base``, which every group that is a chunk shift of this
        one shares (moving an encoded id by ``x`` chunks adds ``x``)."""
        stride = self._stride
        base = min([i % stride for i in ids if i % stride], default=1) - 1
        if base <= 0:
            return 0, ids
        return base, tuple([i - base if i % stride else i for i in ids])

    def _compute_here(self, grouping: int, collective: Collective, key: tuple[int, ...]) -> Outcome:
        """:meth:`_compute` once the profile checks have passed."""
        if collective is Collective.BROADCAST and not self._device_frame:
            return self._broadcast(key)
        states = self.device_states
        if not self._device_frame:
            result = self._rule(collective, [states[i] for i in key], key)
        else:
            # the last member first: most groups of many members that are not uniform differ there
            uniform = key[-1] == key[0] and key.count(key[0]) == len(key)
            if uniform and collective is Collective.REDUCESCATTER:
                # the AllReduce's union, split: its parts are often one shape at many positions
                total = self._uniform(grouping, Collective.ALLREDUCE, states[key[0]], len(key))
                if isinstance(total, str):
                    return total
                ids = self._split_ids(total[0], len(key))
                if ids is not None:
                    return ids, self._held_count[self._profile[key[0]]]
                result = _reduced(collective, total[0], len(key))
            elif uniform:
                result = self._uniform(grouping, collective, states[key[0]], len(key))
            elif collective is Collective.ALLGATHER and (gathered := self._gathered(grouping, key)) is not None:
                # one base at many positions: every member holds as many chunks as the first
                return (self.intern(gathered),) * len(key), len(key) * self._held_count[self._profile[key[0]]]
            else:
                result = self._general(grouping, collective, key)
        if isinstance(result, str):
            return result
        if result.__class__ is _RootFrame:
            ids = self._member_ids(grouping, result)
        elif result.count(first := result[0]) == len(result):  # often one object for every member (count: identity first)
            ids = (self.intern(first),) * len(result)
        else:
            interned: dict[int, int] = {}  # results often repeat one object: hash it once
            ids = tuple(interned[id(s)] if id(s) in interned else interned.setdefault(id(s), self.intern(s))
                        for s in result)
        if collective is Collective.ALLGATHER:
            load = sum(self._held_count[self._profile[i]] for i in key)
        else:
            load = self._held_count[self._profile[key[0]]]
        return ids, load

    def _gathered(self, grouping: int, key: tuple[int, ...]) -> DeviceState | None:
        """The state every member of an AllGather ends with, where the members
        hold one base state of one run at several positions and its masks are
        the same in every member's frame (:meth:`_invariant`; device frame,
        "Positions"): the runs at the members' positions, one mask, without
        building each member's state (the profile checks passed: they are
        disjoint). None for other members."""
        stride = self._stride
        base = key[0] // stride
        if any(i // stride != base for i in key) or not self._invariant(grouping, key[0]):
            return None
        runs = runs_of(self._base_states[base])
        if len(runs) != 1:
            return None
        first, stop, mask = runs[0]
        if len(key) < NUMPY_RUNS_FROM:
            return _from_runs([(f, f + stop - first, mask) for f in sorted(i % stride - 1 for i in key)], self.k)
        firsts = np.sort(np.fromiter(key, np.int64, len(key)) % stride - 1)
        return _runs_at(firsts, stop - first, mask, self.k)

    def _split_ids(self, total: DeviceState, parts: int) -> tuple[int, ...] | None:
        """The ids of :func:`_split` ``(total, parts)`` where ``total`` holds one
        run of chunks with one mask (device frame): every part is the same
        shape, one run of ``size`` chunks, at ``parts`` positions, so one state
        is interned and the others are its id plus their first chunk ("Positions").
        None for other totals."""
        runs = runs_of(total)
        if len(runs) != 1:
            return None
        first, stop, mask = runs[0]
        size, k = (stop - first) // parts, self.k
        at0 = self.intern(((size, k), (mask, 0)) if size < k else ((k,), (mask,)))
        return tuple(range(at0 + first, at0 + first + parts * size, size))

    def _broadcast(self, key: tuple[int, ...]) -> Outcome:
        """A Broadcast's outcome (chunk and absolute frames, where a state's
        masks are compared as they are) from which stored states contain which
        (:func:`_contains`, memoised per pair of ids): the reasons and results of
        :func:`_apply_counted`."""
        root, contains = key[0], self._contained
        others = set(key)
        others.discard(root)
        for i in others:
            inside = contains.get((root, i))
            if inside is None:
                inside = contains[root, i] = _contains(self.device_states[root], self.device_states[i])
            if not inside:
                return "a member holds data the root does not contain"
        if not others:
            return "no member gains information"
        return (root,) * len(key), self._held_count[self._profile[root]]

    def _general(self, grouping: int, collective: Collective, key: tuple[int, ...]):
        """The rule (device frame) on the members (stored ids ``key``, not all
        the same) brought into the root's frame, and the
        results taken back into each member's frame. A state whose masks
        are invariant under the group's translations (:meth:`_invariant`) is the
        same in every member's frame and is not translated; in particular a
        Broadcast from such a root is judged on the members' distinct states alone."""
        t = self.translations
        states = self.device_states
        if collective is Collective.BROADCAST and self._invariant(grouping, key[0]):
            root = states[key[0]]
            states = [self.device_states[i] for i in dict.fromkeys(key[1:])]
            if not all(_contains(root, s) for s in states):
                return "a member holds data the root does not contain"
            return [root] * len(key)  # not every member holds the root's id: some member gains
        if collective is Collective.BROADCAST:
            # members one at a time, so that the first one the root does not
            # contain ends the walk (big groups: most such Broadcasts fail early,
            # 3,646 of 4,096 members at six levels of 4), without first finding
            # the distinct ids (as long as the walk, for groups of 4,096)
            root, gains = states[key[0]], False
            for i, s, d in zip(key, map(states.__getitem__, key), self.groupings[grouping].groups[0]):
                aligned = s if self._invariant(grouping, i) else self._moved.get((i, d)) or self._move(i, d)
                if aligned != root:
                    if not _contains(root, aligned):
                        return "a member holds data the root does not contain"
                    gains = True
            if not gains:
                return "no member gains information"
            return _RootFrame([root] * len(key))
        sum_key = (self._alike[grouping], key)  # groupings of the same first group sum alike (_memos)
        members = [states[i] for i in key]
        if collective in _REDUCING and sum_key in self._sums:
            aligned = members  # the sum is memoised: the members are not looked at again
        else:
            moved, invariant = self._moved, self._invariant
            aligned = [s if invariant(grouping, i) else moved[i, d] if (i, d) in moved else self._move(i, d)
                       for i, s, d in zip(key, members, self.groupings[grouping].groups[0])]
        result = self._rule(collective, aligned, sum_key)
        if isinstance(result, str):
            return result
        varied = self._varied[grouping]
        masks = {id(m): m for s in {id(s): s for s in result}.values() for m in s[1]}
        if all(t.invariant(m, varied) for m in masks.values()):
            return result
        return _RootFrame(result)

    def _member_ids(self, grouping: int, result: _RootFrame) -> tuple[int, ...]:
        """The ids of a group's results given in its root's frame, each taken
        into its member's frame (translated by the member's inverse offset).
        A translation moves masks, not chunks, so a result's id is its base
        state's translation's id at the result's position (:meth:`_translated_base`):
        memoised per (base, offset), a result met at any position, or by
        several members, is translated and interned once (capped at
        _MOVED_MASKS_UPTO)."""
        stride, translated, k = self._stride, self._translated, self.k
        if len(translated) > _MOVED_MASKS_UPTO:
            translated.clear()
        interned: dict[int, int] = {}  # results often repeat one object: intern it once
        out = []
        for s, o in zip(result, self._inverse_offsets[grouping]):
            i = interned.get(id(s))
            if i is None:
                i = interned[id(s)] = self.intern(s)
            base, position = divmod(i, stride)
            moved = translated.get(base * k + o)
            if moved is None:
                moved = translated[base * k + o] = self._translated_base(base, o)
            out.append(moved * stride + position)
        return tuple(out)

    def _move(self, i: int, d: int) -> DeviceState:
        """Device state ``i`` with its masks translated by the digits of device
        ``d`` (a member's offset from its group's root), memoised in ``_moved``:
        the same stored states meet the same offsets in many groups and steps."""
        out = self._moved[i, d] = self.translations.state(self.device_states[i], self.translations.digits(d))
        return out

    def _rule(self, collective: Collective, members: list[DeviceState], sum_key: tuple):
        """:func:`_apply_counted`, with the sum of a group shared by AllReduce,
        ReduceScatter and Reduce (memoised under ``sum_key``)."""
        if collective not in _REDUCING:
            return _apply_counted(collective, members)
        total = self._sums.get(sum_key)
        if total is None:
            total = self._sums[sum_key] = _sum(members)
        return total if isinstance(total, str) else _reduced(collective, total, len(members))

    def _invariant(self, grouping: int, i: int) -> bool:
        """Whether every mask of device state ``i`` is invariant under the
        translations of ``grouping``'s varied digits."""
        key = (self._alike[grouping], i // self._stride if self._encoded else i)  # masks: not on chunk positions
        out = self._invariants.get(key)
        if out is None:
            varied = self._varied[grouping]
            out = self._invariants[key] = all(self.translations.invariant(m, varied) for m in self._masks(i))
        return out

    def _uniform(self, grouping: int, collective: Collective, s: DeviceState, size: int):
        """The rule for a group whose members all store ``s`` (device frame): in
        the root's frame the members hold ``s`` translated by every value of the
        varied digits, so their union is ``s`` saturated along those digits, and
        they are pairwise disjoint exactly when that union is ``size`` times as
        large. The results are saturated, hence the same in every member's frame.
        Same outcomes (and reasons) as :func:`apply_collective`."""
        t, varied = self.translations, self._varied[grouping]
        if collective is Collective.ALLGATHER:
            return [s] * size if not any(s[1]) else "members hold overlapping chunks"
        if not any(s[1]):
            return "the root holds no data" if collective is Collective.BROADCAST else "a member holds no data"
        if collective is Collective.BROADCAST:
            if all(t.invariant(m, varied) for m in s[1]):
                return "no member gains information"
            return "a member holds data the root does not contain"
        masks, first = [], 0
        for stop, mask in zip(*s):
            union = t.saturate(mask, varied)
            if mask and union.bit_count() != size * mask.bit_count():
                return f"contributors overlap on chunks {first}..{stop - 1} (double counting)"
            masks.append(union)
            first = stop
        return _reduced(collective, (s[0], tuple(masks)), size)

    def successors(
        self, state: tuple[int, ...], collectives: Sequence[Collective], lookahead: str | None = None
    ) -> list[tuple[int, Collective, tuple[int, ...], Loads]]:
        """Every valid step from ``state``: (grouping index, collective, next
        state, chunks moved per group), grouping-major, collectives in the given
        order. Steps that change nothing are not valid.

        Per grouping the members' profiles are checked first (memoised per
        group's profiles, stopping at the first group that fails), then each
        passing collective's outcome per group (memoised per members' ids). With
        ``lookahead`` (``"finish"``: the next state passes :meth:`may_finish`;
        ``"goal"``: it is the goal) only the steps whose next state does are
        kept, judged before any group is looked at: on sums of per-device
        quantities over fixed sets of devices for the AllReduce goal
        (:meth:`_hopeful`), else on the packed counts of :meth:`_delta`, from
        profiles alone."""
        out = []
        wanted = sum(1 << _BIT[c] for c in collectives)
        k = self.k
        if self._encoded and k < NUMPY_PROFILES_FROM:
            labels = dict.fromkeys(state)
            if len(labels) <= PATTERN_IDS_UPTO:
                return self._pattern_successors(state, tuple(labels), collectives, wanted, lookahead)
        counting = self._counts_decide(lookahead)
        id_array = np.fromiter(state, np.int64, k)
        if self._encoded and k >= NUMPY_PROFILES_FROM:  # profile ids with numpy: a new state often holds k new ids
            profile_ids = self._profile_ids_of(id_array)
            profiles = tuple(profile_ids.tolist())
            if counting:  # the lookahead's flags are the base profiles': count the devices per base
                bases, counts = np.unique(profile_ids // self._stride, return_counts=True)
                totals = sum(n * self._base_packed[b] for b, n in zip(bases.tolist(), counts.tolist()))
            else:
                totals = 0
        else:
            profiles = tuple(map(self._profile.__getitem__, state))
            totals = sum(n * self._packed[p] for p, n in Counter(profiles).items()) if counting else 0
            if self._encoded and any(len(g.groups) >= VECTOR_GROUPS_FROM for g in self.groupings):
                profile_ids = np.fromiter(profiles, np.int64, k)
        chosen = self._chosen.get(tuple(collectives), {})
        palette, labels = np.unique(id_array, return_inverse=True)
        sums = self._grouping_sums(self._set_counts(labels.ravel(), len(palette)), palette)
        hopeful = self._hopeful(lookahead, sums)
        for g, flat in enumerate(self._flat):
            if not wanted & hopeful[g]:
                continue
            if self._encoded and len(self.groupings[g].groups) >= VECTOR_GROUPS_FROM:
                out += self._vector_successors(g, id_array, profile_ids, collectives, wanted & hopeful[g], totals,
                                               lookahead if counting else None)
                continue
            m = self._size[g]
            members = flat(profiles)
            counted = list(zip(*[iter(members)] * m)) if m < k else [members]  # each group's members' profiles
            classes = counting and self._device_frame
            if classes:  # the groups counted once per class (they repeat there): the lookahead looks at each collective
                counted = Counter(counted)
            ok = self._passing_all(counted, wanted & hopeful[g])
            if not ok:
                continue
            keys = None  # the groups' members' ids, once a step gets past the lookahead
            for c in chosen[ok] if ok in chosen else self._choose(collectives, ok):
                if counting and not self._ahead(totals, c, counted, lookahead):
                    continue
                if keys is None:
                    ids = flat(state)
                    keys = list(zip(*[iter(ids)] * m)) if m < k else [ids]
                done = self._apply(state, g, c, keys)
                if done.__class__ is not str:
                    out.append((g, c) + done)
        return out

    def _passing_all(self, keys: Collection[tuple[int, ...]], wanted: int) -> int:
        """The collectives of ``wanted`` (bit set) that pass the profile checks
        (:meth:`_passes`) of every group in ``keys`` (members' profile ids,
        repeats allowed); when some key is new, each distinct key is checked
        until none is left."""
        try:
            return reduce(and_, map(self._passing.__getitem__, keys), wanted)
        except KeyError:
            ok = wanted
            for key in dict.fromkeys(keys):
                bits = self._passing.get(key)
                ok &= self._passes(key) if bits is None else bits
                if not ok:
                    break
            return ok

    def _pattern_successors(self, state: tuple[int, ...] | None, palette: tuple[int, ...],
                            collectives: Sequence[Collective], wanted: int, lookahead: str | None,
                            labels: bytes | None = None) -> list[tuple[int, Collective, StateKey, Loads]]:
        """:meth:`successors` of a state holding few distinct ids, ``palette``
        (first occurrence first). The state is its *pattern* (each device's
        index into the palette) and the palette; the pattern says which groups
        of a grouping hold equal ids (:class:`_Pattern`, found once per
        pattern), so the profile checks, the lookahead and the outcomes are
        looked up once per class of groups, through the palette, with the same
        memos as the per-device path, and the next state is assembled from
        the classes' outcomes.

        With ``state`` None the state is given as its pattern ``labels`` and
        ``palette`` (a :class:`Packed` key, :meth:`expand`), and so are the
        next states: each is found from this one's classes through per-pattern
        tokens and one bytes translation (:meth:`_tokens`, :meth:`_packed_key`),
        without a tuple of ``k`` ids; where a next state has more tokens than
        a byte holds, from an array of ids (:meth:`_apply_ids`)."""
        pattern = self._pattern(state, palette) if labels is None else self._pattern_of(labels)
        profiles = tuple(map(self._profile.__getitem__, palette))
        packing = state is None
        counting = self._counts_decide(lookahead)
        totals = 0
        if counting:
            packed = self._packed
            totals = sum(n * packed[p] for p, n in zip(profiles, pattern.counts))
        chosen = self._chosen.get(tuple(collectives), {})
        if pattern.set_counts is None:
            pattern.set_counts = self._set_counts(np.frombuffer(pattern.labels, np.uint8), len(palette))
        sums = self._grouping_sums(pattern.set_counts, palette)
        devices = None  # each device's id, where a next state has too many tokens (_apply_ids)
        out = []
        for g, hope in enumerate(self._hopeful(lookahead, sums)):
            if not wanted & hope:
                continue
            classes, counts, group_class = pattern.classes(g)
            if counting or self._size[g] <= _GETTER_MEMBERS_UPTO:
                keys = [take(profiles) for take in classes]  # each class's members' profile ids
                ok = self._passing_all(keys, wanted & hope)
            else:  # large groups: each class's profiles counted from its members' distinct ids (a few)
                ok, m = wanted & hope, self._size[g]
                for tally in pattern.tallies(g):
                    ok &= self._passes_counted(_tallied(profiles, tally), m)
                    if not ok:
                        break
            if not ok:
                continue
            ids = ahead = tokens = None  # each class's members' ids, once a step gets past the lookahead
            for c in chosen[ok] if ok in chosen else self._choose(collectives, ok):
                if counting:
                    if ahead is None:  # classes of ids that hold equal profiles count as one
                        ahead = {}
                        for key, n in zip(keys, counts):
                            ahead[key] = ahead.get(key, 0) + n
                    if not self._ahead_by_class(totals, c, ahead.items(), len(group_class), lookahead):
                        continue
                if ids is None:
                    ids = [take(palette) for take in classes]
                    if packing:
                        tokens = self._tokens(pattern, g, palette)
                        if tokens is None and devices is None:  # too many tokens: built from the devices' ids
                            devices = np.array(palette, dtype=np.int64)[np.frombuffer(pattern.labels, np.uint8)]
                if tokens is not None:
                    done = self._apply_packed(Packed(pattern.labels, palette), g, c, ids, group_class, tokens)
                elif packing:
                    done = self._apply_ids(devices, g, c, ids, _class_array(group_class))
                else:
                    done = self._apply_classes(state, g, c, ids, group_class)
                if done.__class__ is not str:
                    out.append((g, c) + done)
        return out

    def _shifted_successors(self, key: Packed, collectives: Sequence[Collective], wanted: int,
                            lookahead: str | None) -> list[tuple[int, Collective, StateKey, Loads]]:
        """:meth:`expand` of a :class:`Packed` key with a shift. Its pattern
        gives the lookahead's sums and, per grouping, the classes of groups
        alike in relative ids, as for :meth:`_pattern_successors`. The groups
        of one class are alike up to one chunk shift each (:meth:`_shifts_apply`),
        and the profile checks, the lookahead's counts and the outcomes do not
        change under a chunk shift of a whole group (:meth:`_compute_shifted`).
        So each class is checked and computed once, on the ids of its first
        group, and every group of the class takes that group's new ids moved
        by the chunks between the two groups' roots. A class with a member
        that the shift does not move (``~id``) is not alike up to a shift:
        each of its groups is computed on its own ids. The next states are
        keyed from their ids (:meth:`key`)."""
        palette = key.palette
        pattern = self._pattern_of(key.labels)
        counting = self._counts_decide(lookahead)
        totals = 0
        unshifted = self._palette_ids(key)  # the lookahead reads base states only, which a shift keeps
        if counting:
            packed, profile = self._packed, self._profile
            totals = sum(n * packed[profile[i]] for i, n in zip(unshifted, pattern.counts))
        chosen = self._chosen.get(tuple(collectives), {})
        if pattern.set_counts is None:
            pattern.set_counts = self._set_counts(np.frombuffer(pattern.labels, np.uint8), len(palette))
        sums = self._grouping_sums(pattern.set_counts, unshifted)
        ids = None  # each device's id, once a step gets past the lookahead
        out = []
        for g, hope in enumerate(self._hopeful(lookahead, sums)):
            if not wanted & hope:
                continue
            if ids is None:
                ids = self._absolute_ids(key)
            takes, counts, group_class = pattern.classes(g)
            firsts = pattern.representatives(g)
            group_key = _class_array(group_class)
            if min(palette) < 0 and min(min(take(palette)) for take in takes) < 0:
                firsts, group_key, counts = _split_classes(firsts, group_key, counts,
                                                           [min(take(palette)) >= 0 for take in takes])
            members = ids[self._member_array(g)[firsts]]  # the ids of each class's first group
            keys = list(map(tuple, members.tolist()))
            profiles = list(map(tuple, self._profile_ids_of(members).tolist()))
            ok = self._passing_all(profiles, wanted & hope)
            if not ok:
                continue
            ahead = None
            for c in chosen[ok] if ok in chosen else self._choose(collectives, ok):
                if counting:
                    if ahead is None:  # classes that hold equal profiles count as one
                        ahead = {}
                        for group_profiles, n in zip(profiles, counts):
                            ahead[group_profiles] = ahead.get(group_profiles, 0) + n
                    if not self._ahead_by_class(totals, c, ahead.items(), len(group_class), lookahead):
                        continue
                done = self._apply_ids(ids, g, c, keys, group_key, firsts, key.shift)
                if done.__class__ is not str:
                    out.append((g, c) + done)
        return out

    def _apply_ids(self, ids: np.ndarray, grouping: int, collective: Collective, keys: list[tuple[int, ...]],
                   classes: np.ndarray, firsts: np.ndarray | None = None, shift: tuple[int, ...] = ()
                   ) -> tuple[StateKey, Loads] | str:
        """The next state's key and loads of one step from a state of ids
        ``ids`` (an array) whose groups fall into classes: ``keys`` the ids
        of each class's first group (``firsts``), ``classes`` each group's
        class. The next state's ids are set in an array from the classes'
        outcomes and keyed with numpy (:meth:`_key_of_ids`). With the
        ``shift`` of the state's key (:meth:`_shifted_successors`) a group
        takes its class's new ids moved by the chunks between its root and
        the first group's root; without, as they are (:meth:`_pattern_successors`,
        where a next state has more tokens than a byte holds: groups of 1,024
        or 4,096 members)."""
        outcomes = self._class_outcomes(grouping, collective, keys)
        if outcomes.__class__ is str:
            return outcomes
        results, loads = outcomes
        rows = self._member_array(grouping)
        new = np.array(results, dtype=np.int64)[classes]
        if shift:
            roots = self._ref(shift)[rows[:, 0]]
            moved = roots - roots[firsts][classes]  # chunks between each group's root and its class's first group's
            new += np.where(new % self._stride != 0, moved[:, None], 0)
        nxt = ids.copy()
        nxt[rows] = new
        if np.array_equal(nxt, ids):
            return NO_CHANGE
        return self._key_of_ids(nxt), tuple(np.array(loads, dtype=np.int64)[classes].tolist())

    def _tokens(self, pattern: _Pattern, g: int, palette: tuple[int, ...]
                ) -> tuple[bytes, tuple[int, ...], tuple[int, ...]] | None:
        """Where each device of a next state on grouping ``g`` takes its id
        from, for :meth:`_packed_key`: one *token* per member position of each class
        of groups (``class * m + position``; the classes' outcomes, in order)
        and, when some device is in no group, one per distinct id of the
        state, which it keeps (after them). Returns each device's token as
        bytes, the tokens in order of their first device (kept per pattern),
        and the kept ids; None when there are more than :data:`_TOKENS_UPTO`. The
        first two depend on the pattern only and are kept with it (five
        levels of 4: 4,669 kept for 20,486 calls, 7 MB)."""
        found = pattern.tokens.get(g, False)
        if found is False:
            classes, _, group_class = pattern.classes(g)
            m, covers = self._size[g], self._covers[g]
            members = len(classes) * m
            if members + (0 if covers else len(palette)) > _TOKENS_UPTO:
                found = None
            else:  # a device in no group keeps its label, moved past the members' tokens
                labels = np.frombuffer(pattern.labels, np.uint8)
                tokens = np.empty(self.k, np.uint8) if covers else labels + np.uint8(members)
                tokens[self._member_array(g)] = _class_array(group_class).astype(np.intp)[:, None] * m + np.arange(m)
                found = tokens.tobytes(), tuple(_first_occurrences(tokens)[0].tolist())
            pattern.tokens[g] = found
        return None if found is None else found + (() if self._covers[g] else palette,)

    def _packed_key(self, tokens: tuple[bytes, tuple[int, ...], tuple[int, ...]],
                results: list[tuple[int, ...]]) -> StateKey:
        """The key of the next state built from its classes' outcomes
        ``results`` (new ids per class, by position) and its tokens
        (:meth:`_tokens`): each token's new id is its class's outcome at its
        position or the kept id; the distinct ids in order of first device
        and a table from token to label give the labels with one translation
        of the tokens. A next state of more than :data:`PATTERN_IDS_UPTO`
        distinct ids is its tuple of ids (:meth:`key`)."""
        device_tokens, order, kept = tokens
        values = tuple(chain.from_iterable(results)) + kept
        seen: dict[int, int] = {}
        table = bytearray(256)
        for token in order:
            value = values[token]
            label = seen.get(value)
            if label is None:
                label = seen[value] = len(seen)
            table[token] = label
        if len(seen) > PATTERN_IDS_UPTO:
            state = tuple(map(values.__getitem__, device_tokens))
            return self._shifted_key(np.fromiter(state, np.int64, self.k)) or state
        return Packed(device_tokens.translate(table), tuple(seen))

    def _apply_packed(self, parent: Packed, grouping: int, collective: Collective, keys: list[tuple[int, ...]],
                      group_class: Sequence[int], tokens: tuple[bytes, tuple[int, ...], tuple[int, ...]]
                      ) -> tuple[StateKey, Loads] | str:
        """:meth:`_apply_classes` of a state given as its :class:`Packed` key,
        the next state as its key too (:meth:`_packed_key`)."""
        outcomes = self._class_outcomes(grouping, collective, keys)
        if outcomes.__class__ is str:
            return outcomes
        results, loads = outcomes
        nxt = self._packed_key(tokens, results)
        if nxt == parent:
            return NO_CHANGE
        return nxt, tuple(map(loads.__getitem__, group_class))

    # ---- keys: what the search stores per state

    def key(self, state: tuple[int, ...]) -> StateKey:
        """The search's key of ``state``: its :class:`Packed` pattern and
        distinct ids where the pattern path takes it (device frame, fewer than
        :data:`NUMPY_PROFILES_FROM` devices, at most :data:`PATTERN_IDS_UPTO`
        distinct ids), else the state itself. One state has one key."""
        if self._encoded and self.k < NUMPY_PROFILES_FROM:
            palette = tuple(dict.fromkeys(state))
            if len(palette) <= PATTERN_IDS_UPTO:
                return Packed(_labels(state, palette), palette)
            return self._shifted_key(np.fromiter(state, np.int64, self.k)) or state
        return state

    def _key_of_ids(self, ids: np.ndarray) -> StateKey:
        """:meth:`key` of the state of ids ``ids`` (an array), found with numpy."""
        if self._encoded and self.k < NUMPY_PROFILES_FROM:
            # more distinct positions than a pattern holds (a count, cheaper than finding the distinct ids): no pattern
            if np.count_nonzero(np.bincount(ids % self._stride, minlength=self._stride)) <= PATTERN_IDS_UPTO:
                found = _pattern_of_array(ids)
                if found is not None:
                    return Packed(*found)
            shifted = self._shifted_key(ids)
            if shifted is not None:
                return shifted
        return tuple(ids.tolist())

    def _shifted_key(self, ids: np.ndarray) -> Packed | None:
        """The :class:`Packed` key with a shift of a state of more than
        :data:`PATTERN_IDS_UPTO` distinct ids, or None where there is none.
        The shift is read from the state: per level, how many chunks further
        the device one digit along it (``digit_l = 1``, the others 0) starts
        than device 0 (0 where either holds nothing); where that leaves more
        than :data:`PATTERN_IDS_UPTO` relative ids, how many chunks further
        the last device starts than the one a digit before it along the
        level (device 0 is the root of every grouping's first group, so a
        step on the roots of a grouping moves it and not the rest). A device
        that holds something and still starts inside the chunks once moved
        back by its shift stores the moved id; another one (it holds every
        chunk, say, where a step left it out) stores ``~id`` (negative), and
        one that holds nothing its id. The key exists when a shift is not
        zero and leaves at most :data:`PATTERN_IDS_UPTO` distinct relative
        ids. So it is a function of the state (its ids as an array), and
        :meth:`devices` takes it back."""
        if not self._shifts_apply():
            return None
        k, stride = self.k, self._stride
        first = ids % stride - 1  # the first chunk each device holds; -1: none
        tried = set()
        for ahead, behind in ((0, 1), (k - 1, -1)):  # from device 0 forward, from the last device back
            shift = []
            for size, w in zip(self.sizes, self.translations.strides):
                here, there = int(first[ahead]), int(first[ahead + behind * w]) if size > 1 else -1
                shift.append((there - here) * behind if here >= 0 and there >= 0 else 0)
            shift = tuple(shift)
            if not any(shift) or shift in tried:
                continue
            tried.add(shift)
            ref = self._ref(shift)
            moved = (first >= 0) & (first >= ref) & (first - ref < k)
            found = _pattern_of_array(np.where(moved, ids - ref, np.where(first >= 0, ~ids, ids)))
            if found is not None:
                return Packed(*found, shift)
        return None

    def _shifts_apply(self) -> bool:
        """Whether states may be keyed with a shift (:class:`Packed`): in the
        device frame with encoded positions, where in every grouping each
        member lies the same digits (as integers, without wrapping) from its
        group's root in every group, so the chunks a shift puts between a
        member and its root are the same in every group, and a class of
        groups alike in relative ids is alike up to one chunk shift per
        group (:meth:`_shifted_successors`)."""
        if self._shiftable is None:
            digits = self._digit_matrix()
            rows = map(self._member_array, range(len(self.groupings)))
            offsets = [digits[members] - digits[members[:, :1]] for members in rows]  # per group, member, level
            self._shiftable = self._encoded and all((o == o[:1]).all() for o in offsets)
        return self._shiftable

    def _digit_matrix(self) -> np.ndarray:
        """Each device's digits, a (k, levels) array, memoised."""
        if self._digits is None:
            t = self.translations
            self._digits = (np.arange(self.k)[:, None] // np.array(t.strides, dtype=np.int64)) % np.array(self.sizes)
        return self._digits

    def _ref(self, shift: tuple[int, ...]) -> np.ndarray:
        """Per device, the chunks a key's ``shift`` moves its id by
        (:class:`Packed`), memoised."""
        found = self._refs.get(shift)
        if found is None:
            found = self._refs[shift] = self._digit_matrix() @ np.array(shift, dtype=np.int64)
        return found

    def devices(self, key: StateKey) -> tuple[int, ...]:
        """The state (each device's id) of a search key (:meth:`key`)."""
        if key.__class__ is Packed:
            if key.shift:
                return tuple(self._absolute_ids(key).tolist())
            return tuple(map(key.palette.__getitem__, key.labels))
        return key

    def _absolute_ids(self, key: Packed) -> np.ndarray:
        """Each device's id of a :class:`Packed` key with a shift, as an array."""
        relative = np.array(key.palette, dtype=np.int64)[np.frombuffer(key.labels, np.uint8)]
        return np.where(relative < 0, ~relative,
                        relative + np.where(relative % self._stride != 0, self._ref(key.shift), 0))

    @staticmethod
    def _palette_ids(key: Packed) -> tuple[int, ...]:
        """Per distinct id of a :class:`Packed` key, an id of the same base
        state (a shift moves ids along their base's positions; ``~id``
        stands for ``id``): what the lookahead's sums and flags read."""
        return tuple(i if i >= 0 else ~i for i in key.palette) if key.shift else key.palette

    def expand(self, key: StateKey, collectives: Sequence[Collective], lookahead: str | None = None
               ) -> list[tuple[int, Collective, StateKey, Loads]]:
        """:meth:`successors` of the state of ``key`` with the next states as
        keys: a :class:`Packed` state is stepped per pattern without building
        a tuple of ``k`` ids (:meth:`_pattern_successors`), another one per
        device and its next states keyed."""
        if key.__class__ is Packed:
            wanted = sum(1 << _BIT[c] for c in collectives)
            if key.shift:
                return self._shifted_successors(key, collectives, wanted, lookahead)
            return self._pattern_successors(None, key.palette, collectives, wanted, lookahead, key.labels)
        return [(g, c, self.key(nxt), loads) for g, c, nxt, loads in self.successors(key, collectives, lookahead)]

    def _pattern(self, state: tuple[int, ...], palette: tuple[int, ...]) -> _Pattern:
        """The :class:`_Pattern` of ``state`` (whose distinct ids are ``palette``), memoised."""
        return self._pattern_of(_labels(state, palette))

    def _pattern_of(self, labels: bytes) -> _Pattern:
        """The :class:`_Pattern` of these labels, memoised."""
        found = self._patterns.get(labels)
        if found is None:
            found = self._patterns[labels] = _Pattern(self, labels)
        return found

    def _apply_classes(self, state: tuple[int, ...], grouping: int, collective: Collective,
                       keys: list[tuple[int, ...]], group_class: Sequence[int]) -> tuple[tuple[int, ...], Loads] | str:
        """:meth:`_apply` (the search's, without ``explain``) of a step whose
        groups fall into classes: ``keys`` the members' ids per class,
        ``group_class`` each group's class, in group order."""
        outcomes = self._class_outcomes(grouping, collective, keys)
        if outcomes.__class__ is str:
            return outcomes
        results, loads = outcomes
        result = tuple(chain.from_iterable(map(results.__getitem__, group_class)))
        nxt = self._pickers[grouping](result if self._covers[grouping] else result + state)
        return NO_CHANGE if nxt == state else (nxt, tuple(map(loads.__getitem__, group_class)))

    def _class_outcomes(self, grouping: int, collective: Collective, keys: list[tuple[int, ...]]
                        ) -> tuple[list[tuple[int, ...]], list[int]] | str:
        """Per class (members' ids ``keys``), the members' new ids and the
        chunks each group moves, memoised; or the first class's reason."""
        memo = self._memos[_BIT[collective]][grouping]
        results, loads = [], []
        for key in keys:
            outcome = memo.get(key)
            if outcome is None:
                outcome = self._compute(grouping, collective, key, True)
                if len(key) < self._whole_key:
                    memo[key] = outcome
            if outcome.__class__ is str:
                return outcome
            results.append(outcome[0])
            loads.append(outcome[1])
        return results, loads

    def _vector_successors(self, g: int, ids: np.ndarray, profiles: np.ndarray, collectives: Sequence[Collective],
                           wanted: int, totals: int,
                           lookahead: str | None) -> list[tuple[int, Collective, tuple[int, ...], Loads]]:
        """:meth:`successors` on grouping ``g`` (device frame, many groups), with
        numpy: each group's members are moved down by its first held chunk
        (:meth:`_moved_down`, one subtraction per id), so groups that are chunk
        shifts of one another fall into one class; the profile checks, the
        lookahead and the outcomes are looked up once per class (the same
        memos as the per-group path), and each group's results are moved back
        up. ``ids``, ``profiles``: the state's and its profiles' ids; ``lookahead``:
        the one the packed counts decide (None where :meth:`_hopeful` did)."""
        members = self._member_array(g)
        profile_rows = profiles[members]
        ok = self._passing_all(list(map(tuple, self._classes(profile_rows, self._whole_members(profile_rows))[1])),
                               wanted)
        if not ok:
            return []
        if lookahead is not None:  # the lookahead counts the groups per class of profiles, whole members moved too
            _, class_rows, profile_class = self._classes(profile_rows)
            profile_keys = [tuple(row) for row in class_rows]
            per_class = np.bincount(profile_class).tolist()
        out: list[tuple[int, Collective, tuple[int, ...], Loads]] = []
        id_rows = None
        chosen = self._chosen.get(tuple(collectives), {})
        for c in chosen[ok] if ok in chosen else self._choose(collectives, ok):
            if lookahead is not None and not self._ahead_by_class(totals, c, zip(profile_keys, per_class),
                                                                  len(members), lookahead):
                continue
            if id_rows is None:
                base, id_rows, id_class = self._classes(ids[members])
                id_keys = [tuple(row) for row in id_rows]
            memo = self._memos[_BIT[c]][g]
            results, loads = [], []
            for key in id_keys:
                outcome = memo.get(key)
                if outcome is None:
                    outcome = memo[key] = self._compute(g, c, key, True)
                if outcome.__class__ is str:
                    break
                results.append(outcome[0])
                loads.append(outcome[1])
            else:
                moved = np.array(results, dtype=np.int64)[id_class]
                moved += base[:, None] * (moved % self._stride > 0)  # back up by each group's first chunk
                nxt = ids.copy()
                nxt[members] = moved
                if not np.array_equal(nxt, ids):
                    out.append((g, c, tuple(nxt.tolist()), tuple(np.array(loads)[id_class].tolist())))
        return out

    def _profile_ids_of(self, ids: np.ndarray) -> np.ndarray:
        """The profile ids of encoded device state ids (``_profile``, with numpy):
        the base state's profile moved to the state's first chunk."""
        n = len(self._base_profile)
        if len(self._base_profile_array) != n:  # grown by the new entries (doubling), not rebuilt
            array = self._base_profile_array
            if self._base_profile_capacity < n:
                grown = np.zeros(max(n, 2 * self._base_profile_capacity), dtype=np.int64)
                grown[:len(array)] = array
                self._base_profile_store = grown
                self._base_profile_capacity = len(grown)
            self._base_profile_store[len(array):n] = self._base_profile[len(array):n]
            self._base_profile_array = self._base_profile_store[:n]
        return self._base_profile_array[ids // self._stride] + np.maximum(ids % self._stride - 1, 0)

    def _member_array(self, g: int) -> np.ndarray:
        """Grouping ``g``'s groups as a (groups, members) array, memoised."""
        found = self._member_arrays.get(g)
        if found is None:
            found = self._member_arrays[g] = np.array(self.groupings[g].groups, dtype=np.int64)
        return found

    def _classes(self, rows: np.ndarray, still: np.ndarray | None = None
                 ) -> tuple[np.ndarray, list[list[int]], np.ndarray]:
        """Per row (a group's members' encoded ids): its base, the first chunk
        any member holds (0 if none holds any), and its class: the distinct rows
        once moved down by their base (:meth:`_moved_down`), as lists, and each
        row's index among them. Members marked in ``still`` (same shape) are
        neither moved nor looked at for the base (:meth:`_whole_members`)."""
        position = rows % self._stride  # first held chunk + 1; 0: holds nothing
        moved = position > 0
        if still is not None:
            moved &= ~still
        first = np.where(moved, position, np.iinfo(np.int64).max).min(axis=1)
        base = np.where(moved.any(axis=1), first - 1, 0)
        down = np.ascontiguousarray(rows - base[:, None] * moved)
        flat = down.view(np.dtype((np.void, down.dtype.itemsize * down.shape[1]))).ravel()
        _, index, inverse = np.unique(flat, return_index=True, return_inverse=True)
        return base, down[index].tolist(), inverse.ravel()

    def _whole_members(self, rows: np.ndarray) -> np.ndarray:
        """Which of the encoded profile ids ``rows`` hold one run over every
        chunk. The profile checks compare members chunk by chunk and split held
        chunks in order; such a member holds every chunk with one count, the
        same at every position, so moving the other members of its group
        together keeps every comparison: the groups' checks are looked up per
        class with these members kept still (:meth:`_classes`), and a group of
        one whole member and one part at each of 8,192 positions is one check,
        not 8,192 (tests compare both on every reachable group)."""
        if len(self._base_whole_array) != len(self._base_whole):
            self._base_whole_array = np.array(self._base_whole, dtype=bool)
        return self._base_whole_array[rows // self._stride]

    def _device_quantities(self, ids: np.ndarray) -> np.ndarray:
        """Per device state id in ``ids``: its profile's :data:`_QUANTITIES`,
        one row each. The rows per base state are kept in an array that grows
        (doubling) as states are interned."""
        n = len(self._base_profile)
        if self._quantities_filled < n:
            rows = self._quantity_rows
            if len(rows) < n:
                more = np.zeros((max(n, 2 * len(rows)) - len(rows), len(_QUANTITIES)), dtype=np.int64)
                rows = self._quantity_rows = np.concatenate([rows, more])
            base = self._stride if self._encoded else 1
            packed, held = self._base_packed, self._base_held_count
            new = []
            for p in self._base_profile[self._quantities_filled:n]:
                flags, count = packed[p // base], held[p // base]
                new.append((flags & _MASK, (flags >> _FIELD) & _MASK, count, flags >> (_FIELD * 4), int(not count),
                            count * count))
            rows[self._quantities_filled:n] = new
            self._quantities_filled = n
        return self._quantity_rows[ids // self._stride if self._encoded else ids]

    def _grouping_sets(self) -> tuple[np.ndarray, np.ndarray, list[int]]:
        """The sets of devices :meth:`_grouping_sums` sums over: device 0;
        every device; then per grouping its group 0, its roots, and its
        members when some device is in no group, else none. Many are the
        same set (parallel(j) and master(j) share their group 0, the group 0
        of the grouping of every device is every device: 33 distinct of 110
        at six levels of 4), so each distinct one is listed once. Returns
        their devices, one distinct set after the other, each listed
        device's distinct set, and per set (in the order above) its distinct
        set."""
        if self._set_index is None:
            parts = [np.zeros(1, dtype=np.int64), np.arange(self.k, dtype=np.int64)]
            for g in range(len(self.groupings)):
                rows = self._member_array(g)
                parts += [rows[0], rows[:, 0], rows.ravel() if rows.size < self.k else rows[:0, 0]]
            distinct: dict[bytes, int] = {}
            which = [distinct.setdefault(part.tobytes(), len(distinct)) for part in parts]
            kept = [parts[which.index(n)] for n in range(len(distinct))]
            sets = np.repeat(np.arange(len(kept)), [len(part) for part in kept])
            self._set_index = (np.concatenate(kept), sets, which)
        return self._set_index

    def _set_counts(self, labels: np.ndarray, width: int) -> np.ndarray:
        """How many devices of each distinct set of :meth:`_grouping_sets`
        hold each of ``width`` distinct ids, where device ``d`` holds the
        ``labels[d]``-th: a (distinct sets, width) array (16-bit below 65,536
        devices), which depends on which devices hold equal ids only (a
        :class:`_Pattern` keeps it)."""
        index, sets, which = self._grouping_sets()
        count = max(which) + 1
        held = np.bincount(sets * width + labels[index], minlength=count * width).reshape(count, width)
        return held.astype(np.uint16) if self.k < 1 << 16 else held

    def _grouping_sums(self, held: np.ndarray, palette: Sequence[int]) -> GroupingSums:
        """Device 0's quantities (:meth:`_device_quantities`), every device's
        summed, and per grouping those of its group 0, its roots and its
        members (every device's when every device is in a group) summed, for
        a state of distinct ids ``palette`` held as :meth:`_set_counts` says:
        how many devices of each set hold each id, times the ids' quantities
        (a sum is at most ``k**3``)."""
        quantities = self._device_quantities(np.array(palette, dtype=np.int64))
        if self._exact_in_floats:  # a float product (BLAS) is exact and several times faster
            held, quantities = held.astype(np.float64), quantities.astype(np.float64)
        distinct = (held @ quantities).astype(np.int64).tolist()
        sums = [distinct[n] for n in self._grouping_sets()[2]]  # per set, its distinct set's (shared lists)
        everything = sums[1]
        return sums[0], everything, [(sums[i], sums[i + 1], sums[i + 2] if n < self.k else everything)
                                     for i, (_, _, n) in zip(range(2, len(sums), 3), self._shapes_of)]

    def _hopeful(self, lookahead: str | None, sums: GroupingSums) -> list[int]:
        """Per grouping, the collectives (bit sets) whose step from a state of
        grouping sums ``sums`` (:meth:`_grouping_sums`) may be valid and pass
        the lookahead, judged before any group is looked at. For the AllReduce
        goal this decides the lookahead: a
        valid step's bit is set exactly when its next state passes
        :meth:`may_finish` (``"finish"``) or is the goal (``"goal"``), so the
        packed counts (:meth:`_ahead`) need not be looked at; without a
        lookahead, and for the other goals, the bits are the validity bounds
        alone (and the packed counts decide the lookahead,
        :meth:`_counts_decide`).

        For the AllReduce goal, on a grouping of ``G`` groups of ``m`` over
        ``n`` devices (``k - n`` others keep their state), with ``H`` devices
        holding every chunk, ``C`` complete, mass ``M`` (contributor counts
        summed over devices and chunks), ``N`` the others' mass, ``S = M - N``
        the members', ``R`` the roots' held chunks and ``F`` the finishing
        masses (:func:`finishing_masses`); every device's mass is at most
        ``k**2``, exactly when it is done:

        * validity (necessary): an AllReduce, ReduceScatter or Reduce needs
          members that hold their root's chunks (members' held chunks ``m *
          R``, and squared ``m`` times the roots'), non-empty, with at most
          ``k`` contributors per chunk (``S <= k * R``); an AllGather equal
          shares (``m * R``, squared too) that fit (``m * R <= G * k``); a
          Broadcast non-empty roots containing their members (held chunks at
          most ``m * R``) and some member gaining (its mass below the root's:
          ``S < m`` times the roots' mass). Group 0 is checked on its own as
          well (its root is device 0);
        * device 0 is the root of group 0 in every grouping: after a valid step
          it is done exactly when it was done (an AllReduce, Reduce,
          ReduceScatter or AllGather with it would double count or overlap, a
          Broadcast keeps its root), or after an AllReduce or Reduce of a group
          0 whose members hold every chunk, or an AllGather of complete ones,
          with group 0's mass ``k**2``;
        * otherwise ("finish") every device must end holding every chunk or
          complete, with mass in ``F``. After a valid step: an AllReduce or
          AllGather gives each member its group's mass (``m * S + N`` after),
          a Broadcast its root's, a ReduceScatter or Reduce keeps ``M``; every
          sum is complete exactly when the others are complete and ``S = k *
          R`` (a group's mass is at most ``k`` per chunk its root holds, so the
          sum is met only with equality in every group); an AllReduce keeps
          who holds every chunk; an AllGather gives every chunk exactly when
          each group's ``m`` equal shares add to ``k``, and keeps completeness;
          a Broadcast gives its roots' state; a ReduceScatter or Reduce leaves
          members with part or nothing, so only completeness can hold;
        * "goal": the others are done (``N = (k - n) * k**2``) and the mass
          after is ``k**3`` (so every member ends with ``k**2``): an AllReduce
          needs ``H = k``, an AllGather ``C = k``; a Broadcast needs its roots
          and the others done."""
        k = self.k
        kk = k * k
        device0, (holds, complete, _, mass, _, _), per_grouping = sums
        # the lookahead's bits first where they decide (most states the step before last meets have none);
        # validity only where some bit is left
        deciding = lookahead is not None and self.goal is Goal.ALLREDUCE and not (
            lookahead == "finish" and device0[3] == kk)  # device 0 is done and stays done
        finishing = lookahead == "finish"
        masses = self._finishing_masses
        possible = []
        held0, mass0 = device0[2], device0[3]
        for (m, groups, n), (first, roots, members) in zip(self._shapes_of, per_grouping):
            grouped = members[3]
            if deciding:
                others = k - n
                others_holding, others_complete, others_mass = holds - members[0], complete - members[1], mass - grouped
                bits = 0
                if not finishing:  # "goal"
                    if others_mass == others * kk and m * grouped + others_mass == k * kk:
                        bits |= (_BIT_ALLREDUCE if holds == k else 0) | (_BIT_ALLGATHER if complete == k else 0)
                    if roots[3] + others_mass == (groups + others) * kk:
                        bits |= _BROADCASTING
                else:
                    if first[3] == kk:  # device 0 ends done
                        bits = ((_BIT_ALLREDUCE | _BIT_REDUCE if first[0] == m else 0)
                                | (_BIT_ALLGATHER if first[1] == m else 0))
                    complete_sums = others_complete == others and grouped == k * roots[2]
                    if m * grouped + others_mass in masses:
                        if holds == k or complete_sums:
                            bits |= _BIT_ALLREDUCE
                        if (others_holding == others and m * roots[2] == groups * k) or complete == k:
                            bits |= _BIT_ALLGATHER
                    if complete_sums and mass in masses:
                        bits |= _BIT_REDUCESCATTER | _BIT_REDUCE
                    if (m * roots[3] + others_mass in masses
                            and (roots[0] + others_holding == groups + others
                                 or roots[1] + others_complete == groups + others)):
                        bits |= _BROADCASTING
                if not bits:
                    possible.append(0)
                    continue
            else:
                bits = _ALL_BITS
            valid = 0
            if (members[2] == m * roots[2] and members[5] == m * roots[5]
                    and first[2] == m * held0 and first[5] == m * held0 * held0):  # equal held chunks per group
                if grouped <= k * roots[2] and first[3] <= k * held0 and not roots[4]:
                    valid |= _SUMMING
                if m * roots[2] <= groups * k and m * held0 <= k:
                    valid |= _COUNT_FREE
            if (members[2] <= m * roots[2] and grouped < m * roots[3] and first[2] <= m * held0
                    and first[3] < m * mass0 and not roots[4]):
                valid |= _BROADCASTING
            possible.append(bits & valid)
        return possible

    def _counts_decide(self, lookahead: str | None) -> bool:
        """Whether the packed counts (:meth:`_ahead`) judge the lookahead: for
        the AllReduce goal the grouping sums decide it (:meth:`_hopeful`), and
        for the others every state may finish, so only "goal" is left."""
        return lookahead == "goal" and self.goal is not Goal.ALLREDUCE

    def _after_passes(self, after: int, lookahead: str) -> bool:
        """Whether packed counts ``after`` a step make the next state the goal
        (``"goal"``) or pass :meth:`may_finish` without device 0 being done
        (``"finish"``: every device holds every chunk or is complete, and the
        mass is a finishing one), see :meth:`_ahead`."""
        if lookahead == "goal":
            return (after >> (_FIELD * 3)) & _MASK == self.k
        if self.goal is not Goal.ALLREDUCE:
            return True
        return ((after & _MASK == self.k or (after >> _FIELD) & _MASK == self.k)
                and after >> (_FIELD * 4) in self._finishing_masses)

    def _keys(self, grouping: int, flat: tuple[int, ...]) -> list[tuple[int, ...]]:
        """``flat`` (a value per member of every group of ``grouping``,
        group-major) cut into one tuple per group."""
        m = self._size[grouping]
        return list(zip(*[iter(flat)] * m)) if m < self.k else [flat]

    def _choose(self, collectives: Sequence[Collective], ok: int) -> tuple[Collective, ...]:
        """The ``collectives`` (in their order) whose bits are set in ``ok``,
        memoised per ``collectives`` (:meth:`successors`)."""
        out = self._chosen.setdefault(tuple(collectives), {})[ok] = tuple(c for c in collectives if ok >> _BIT[c] & 1)
        return out

    def _ahead(self, totals: int, collective: Collective, groups: list[tuple[int, ...]] | Counter,
               lookahead: str) -> bool:
        """Whether the state after ``collective`` on groups whose members have
        profile ids ``groups`` (one tuple per group, or a Counter of them) can
        pass :meth:`may_finish` (``"finish"``) or be the goal (``"goal"``):
        both depend on the packed counts only."""
        if isinstance(groups, Counter):
            return self._ahead_by_class(totals, collective, groups.items(), groups.total(), lookahead)
        deltas = self._deltas[_BIT[collective]]
        try:
            change = sum(map(deltas.__getitem__, groups))
        except KeyError:
            change = sum(self._delta(collective, key) for key in groups)
        return self._after_passes(totals + change - len(groups) * _OFFSETS, lookahead)

    def _ahead_by_class(self, totals: int, collective: Collective, classes: Iterable[tuple[tuple[int, ...], int]],
                        groups: int, lookahead: str) -> bool:
        """:meth:`_ahead` of ``groups`` groups given as classes: (members'
        profile ids, how many groups have them)."""
        deltas, delta = self._deltas[_BIT[collective]], self._delta
        change = sum(n * (deltas[key] if key in deltas else delta(collective, key)) for key, n in classes)
        return self._after_passes(totals + change - groups * _OFFSETS, lookahead)

    def _apply(self, state: tuple[int, ...], grouping: int, collective: Collective,
               keys: list[tuple[int, ...]], explain: bool = False) -> tuple[tuple[int, ...], Loads] | str:
        """The next state and loads of one step whose groups' members store
        ``keys`` (:meth:`_keys`), or why it is invalid. Outcomes are memoised
        per key; when every group stores the same ids (a uniform state) one
        lookup serves them all. Without ``explain`` (the search) every group is
        known to pass the profile checks, and the reason does not name the
        failing group (the search drops it)."""
        memo = self._memos[_BIT[collective]][grouping]
        if len(keys) == 1 or keys.count(keys[0]) == len(keys):  # every group stores the same ids
            uniform: list[tuple[int, ...]] = keys[:1]
        else:
            uniform = []
        result: list[int] = []
        loads = []
        for j, key in enumerate(uniform or keys):
            outcome = memo.get(key)
            if outcome is None:
                outcome = self._compute(grouping, collective, key, not explain)
                if len(key) < self._whole_key:
                    memo[key] = outcome
            if outcome.__class__ is str:
                return f"group {list(self.groupings[grouping].groups[j])}: {outcome}" if explain else outcome
            result += outcome[0]
            loads.append(outcome[1])
        if uniform:
            result, loads = result * len(keys), loads * len(keys)
        result, loads = tuple(result), tuple(loads)
        nxt = self._pickers[grouping](result if self._covers[grouping] else result + state)
        return NO_CHANGE if nxt == state else (nxt, loads)

    def step(self, state: tuple[int, ...], grouping: int, collective: Collective) -> tuple[int, ...] | str:
        """The state after one instruction, or why it is invalid (group lists name
        synthesis indices)."""
        done = self._apply(state, grouping, collective, self._keys(grouping, self._flat[grouping](state)), explain=True)
        return done if isinstance(done, str) else done[0]


_COLLECTIVES = tuple(Collective)
_BIT = {c: i for i, c in enumerate(_COLLECTIVES)}
#: collectives whose profile check is the shape check alone (AllGather), the
#: summing ones (one count check for the three), and Broadcast
_COUNT_FREE = 1 << _BIT[Collective.ALLGATHER]
_SUMMING = sum(1 << _BIT[c] for c in _REDUCING)
_BROADCASTING = 1 << _BIT[Collective.BROADCAST]
_BIT_ALLREDUCE, _BIT_REDUCESCATTER, _BIT_ALLGATHER, _BIT_REDUCE = (
    1 << _BIT[c] for c in (Collective.ALLREDUCE, Collective.REDUCESCATTER, Collective.ALLGATHER, Collective.REDUCE))
_ALL_BITS = (1 << len(_COLLECTIVES)) - 1
_FIELD = 64
_MASK = (1 << _FIELD) - 1
#: added to each group's change of the packed counts: the sum over a step's
#: groups (fewer than 2**18 of them: topology.MAX_DEVICES) stays below 2**51 per field;
#: the mass (the last field, at most k**3) has no field above it
_OFFSETS = sum((1 << 32) << (_FIELD * i) for i in range(5))


class _Pattern:
    """Which devices of a state hold equal ids: per device, the index of its id
    among the state's distinct ids (first occurrence first), as bytes. Many
    states share a pattern (they differ in what the ids are, not in where they
    repeat), and per grouping the pattern fixes which groups are alike: for
    each grouping (filled on first use) the classes of groups, each as a
    callable that takes its members' values (ids, profile ids) from the
    state's distinct ones, the number of groups in each class, and each
    group's class in group order. Classes of many members keep their indices
    as bytes (an itemgetter keeps 8 bytes per member, and thousands of
    patterns are kept). The lookahead's counts of devices per set and distinct
    id (:meth:`StateSpace._set_counts`) depend on the pattern only and are
    kept too (16-bit: six levels of 4, 6,532 patterns, +42 MiB, 9% faster)."""

    __slots__ = ("space", "labels", "counts", "set_counts", "_classes", "_tallies", "tokens", "_firsts")

    def __init__(self, space: StateSpace, labels: bytes) -> None:
        self.space = space
        self.labels = labels
        self.set_counts: np.ndarray | None = None  # see StateSpace._set_counts
        self.counts = np.bincount(np.frombuffer(labels, np.uint8)).tolist()  # devices per distinct id
        self._classes: list[tuple[list[Callable], list[int], Sequence[int]] | None] = [None] * len(space.groupings)
        self._tallies: dict[int, list[tuple[tuple[int, int], ...]]] = {}
        self.tokens: dict[int, tuple[bytes, tuple[int, ...]] | None] = {}  # see StateSpace._tokens
        self._firsts: dict[int, np.ndarray] = {}  # see representatives

    def classes(self, g: int) -> tuple[list[Callable], list[int], Sequence[int]]:
        """Grouping ``g``'s classes of groups: (one callable per class taking
        its members' values from the state's distinct ones, groups per class,
        each group's class in group order), found on first use."""
        found = self._classes[g]
        if found is None:
            space = self.space
            m = space._size[g]
            if m * len(space.groupings[g].groups) >= _NUMPY_CLASSES_FROM:  # the groups' rows told apart by np.unique
                rows = np.ascontiguousarray(np.frombuffer(self.labels, np.uint8)[space._member_array(g)])
                # a row of 1, 2, 4 or 8 bytes sorts as one unsigned integer (2x faster than as bytes)
                _, first, inverse, many = np.unique(rows.view(_ROW_TYPES.get(m, np.dtype((np.void, m)))).ravel(),
                                                    return_index=True, return_inverse=True, return_counts=True)
                keys = [rows[i].tobytes() for i in first.tolist()]
                counts = many.tolist()
                group_class = inverse.ravel().astype(np.uint8).tobytes() if len(keys) < 256 else inverse.tolist()
            else:
                members = bytes(space._flat[g](self.labels))  # the itemgetter gives a tuple of indices
                index: dict[bytes, int] = {}
                group_class = [index.setdefault(members[i:i + m], len(index)) for i in range(0, len(members), m)]
                keys = list(index)
                counts = [0] * len(keys)
                for n in group_class:
                    counts[n] += 1
                group_class = bytes(group_class) if len(keys) < 256 else group_class
            takes = [itemgetter(*key) if m <= _GETTER_MEMBERS_UPTO else partial(_take, key) for key in keys]
            found = self._classes[g] = (takes, counts, group_class)
        return found

    def representatives(self, g: int) -> np.ndarray:
        """Per class of grouping ``g`` (as :meth:`classes`), its first group's
        index; found on first use."""
        found = self._firsts.get(g)
        if found is None:
            _, _, group_class = self.classes(g)
            found = self._firsts[g] = np.unique(_class_array(group_class), return_index=True)[1]
        return found

    def tallies(self, g: int) -> list[tuple[tuple[int, int], ...]]:
        """Per class of grouping ``g`` (as :meth:`classes`), its members'
        distinct ids as indices into the state's distinct ones, each with how
        many members hold it, the root's first; found on first use."""
        found = self._tallies.get(g)
        if found is None:
            space = self.space
            rows = np.frombuffer(self.labels, np.uint8)[space._member_array(g)]
            classes, _, group_class = self.classes(g)
            first = {}
            for group, c in enumerate(group_class):
                first.setdefault(c, group)
            found = self._tallies[g] = [_tally(rows[first[c]]) for c in range(len(classes))]
        return found


#: the most tokens a next state is found from (StateSpace._tokens): a token is a byte
_TOKENS_UPTO = 256

_ROW_TYPES = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}

#: a pattern's class of at most this many members takes its values with an itemgetter (fast), a larger one
#: with :func:`_take` over its indices as bytes (small)
_GETTER_MEMBERS_UPTO = 64

#: a pattern's grouping whose groups hold at least this many members in all finds its classes with numpy (one
#: sort of the groups' rows of indices: 1.1-1.4x faster for 4,096 members); below, a dict over the rows is
#: cheaper (1,024 members: the same for 256 groups of 4, 1.1-1.3x slower for fewer, larger groups)
_NUMPY_CLASSES_FROM = 2048


def _labels(state: tuple[int, ...], palette: tuple[int, ...]) -> bytes:
    """Each device's index into ``palette`` (the state's distinct ids), as bytes."""
    index = {i: n for n, i in enumerate(palette)}
    return bytes(map(index.__getitem__, state))


def _class_array(group_class: bytes | Sequence[int]) -> np.ndarray:
    """Each group's class (:meth:`_Pattern.classes`: bytes below 256 classes) as an array."""
    return np.frombuffer(group_class, np.uint8) if group_class.__class__ is bytes else np.array(group_class)


def _split_classes(firsts: np.ndarray, classes: np.ndarray, counts: Sequence[int], alike: Sequence[bool]
                   ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Classes of groups (each one's first group ``firsts``, each group's class
    ``classes``, groups per class ``counts``) with those not ``alike`` split
    into one class per group: the alike ones first, in order, then each
    group of the others, in group order; the same three for them."""
    alike = np.array(alike, dtype=bool)
    alone = ~alike[classes]
    kept = int(alike.sum())
    new_classes = np.where(alone, kept + np.cumsum(alone) - 1, (np.cumsum(alike) - 1)[classes])
    new_firsts = np.concatenate([firsts[alike], np.flatnonzero(alone)])
    new_counts = [n for n, a in zip(counts, alike.tolist()) if a] + [1] * int(alone.sum())
    return new_firsts, new_classes, new_counts


def _pattern_of_array(values: np.ndarray) -> tuple[bytes, tuple[int, ...]] | None:
    """:func:`_labels` and the distinct values (first occurrence first) of an
    array of ids, with one sort; None for more than :data:`PATTERN_IDS_UPTO`
    distinct values (2.8x faster than a dict over 4,096 ids)."""
    distinct, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    if len(distinct) > PATTERN_IDS_UPTO:
        return None
    order = np.argsort(first)
    rank = np.empty(len(order), dtype=np.uint8)
    rank[order] = np.arange(len(order))
    return rank[inverse.ravel()].tobytes(), tuple(distinct[order].tolist())


def _tally(labels: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Each distinct label of a uint8 array with how many times it occurs, in
    order of first occurrence (``tuple(Counter(labels).items())``)."""
    distinct, counts = _first_occurrences(labels)
    return tuple(zip(distinct.tolist(), counts.tolist()))


def _tallied(values: Sequence[int], tally: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """A class's :meth:`_Pattern.tallies` entry through the state's distinct
    ``values`` (profile ids): each distinct value and how many members hold
    it, in first-occurrence order (distinct ids of equal value add up)."""
    merged: dict[int, int] = {}
    for label, n in tally:
        v = values[label]
        merged[v] = merged.get(v, 0) + n
    return tuple(merged.items())


def _take(indices: bytes, values: tuple[int, ...]) -> tuple[int, ...]:
    """``values`` at ``indices``, as a tuple of the same int objects (memo
    keys share them), through a numpy array of objects: 4x faster than a
    map for 4,096 indices."""
    table = np.empty(len(values), dtype=object)
    table[:] = values
    return tuple(table[np.frombuffer(indices, np.uint8)].tolist())


def _picker(groups: Sequence[Group], k: int):
    """A callable taking ``(new ids of the members, group-major) + state`` to
    the next state: members take their new ids, other devices keep theirs
    (when the groups hold every device, the members' new ids alone do)."""
    flat = np.fromiter(chain.from_iterable(groups), np.int64)
    where = len(flat) + np.arange(k)  # a device in no group keeps its own id (after the members' new ids)
    where[flat] = np.arange(len(flat))
    return itemgetter(*where.tolist())


class _RootFrame(list):
    """A group's results in its root's frame, for :meth:`StateSpace._member_ids`
    to take into each member's frame."""

    __slots__ = ()


@lru_cache(maxsize=32)
def state_space(sizes: tuple[int, ...], goal: Goal) -> StateSpace:
    """The (memoising) state space of a hierarchy's sizes and a goal, shared by
    searches of any length and by the tracer."""
    return StateSpace(sizes, goal)
