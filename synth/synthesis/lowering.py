"""Lower a program from the synthesis hierarchy to the whole system.

A program is traced once on the synthesis hierarchy (one reduction group) with
the semantics (:func:`trace`, memoised per hierarchy, goal and program), which
gives, per step, the synthesis groups and the ordered chunk list each group
covers. The same grouping is then applied to every reduction group at once
through ``Reduction.synthesis_groups`` (row = reduction group, column =
synthesis index): lowering is a relabelling of the one trace.

Chunks and shards. The data of a reduction group is split into ``k`` chunks.
``chunk_of_rank[r]`` is the chunk that holds the shard of reduction rank ``r``
(the user's ``r``-th 1/k of the buffer): for ReduceScatter the chunk that rank
``r`` owns at the end, for AllGather the chunk rank ``r`` starts with, identity
for AllReduce. Chunks are placeholders for byte ranges; a runtime maps chunk
``chunk_of_rank[r]`` to the byte range of shard ``r``. A group whose chunk list
is empty (an AllGather group whose members hold nothing) moves nothing: its
devices are idle in that step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..caches import memoised
from ..errors import SynthError
from .language import Collective, Instruction, Program, format_program
from .reduction import Reduction
from .semantics import (
    NO_CHANGE,
    Goal,
    Hierarchy,
    resolve,
)
from .statespace import StateSpace, state_space

Runs = tuple[tuple[int, int], ...]  # a chunk list as [first, stop) runs, in order

#: bytes the lowered steps of one program may take in memory (:func:`lowered_bytes`);
#: lowering a larger one is refused before it is built
LOWERED_LIMIT_BYTES = 1 << 30


@memoised(maxsize=8)
def _ints(k: int) -> tuple[int, ...]:
    return tuple(range(k))


def as_runs(chunks: Sequence[int]) -> Runs:
    """``(0, 1, 2, 5)`` -> ``((0, 3), (5, 6))``: a chunk list as ``[first, stop)`` runs."""
    out: list[list[int]] = []
    for c in chunks:
        if out and out[-1][1] == c:
            out[-1][1] = c + 1
        else:
            out.append([c, c + 1])
    return tuple((a, b) for a, b in out)


def expand(runs: Runs, k: int | None = None) -> tuple[int, ...]:
    """The chunk list of ``runs`` (with ``k``, made of shared int objects)."""
    if k is None:
        return tuple(c for first, stop in runs for c in range(first, stop))
    ints = _ints(k)
    return ints[runs[0][0]:runs[0][1]] if len(runs) == 1 else tuple(c for a, b in runs for c in ints[a:b])


@dataclass(frozen=True)
class TracedStep:
    instruction: Instruction
    groups: tuple[tuple[int, ...], ...]  # synthesis indices, root first
    runs: tuple[Runs, ...]  # per group, the ordered chunk list as runs

    def chunks(self, k: int) -> tuple[tuple[int, ...], ...]:
        """Per group, the ordered chunk list (``k`` chunks in all)."""
        return tuple(expand(r, k) for r in self.runs)


@dataclass(frozen=True)
class Trace:
    """A program run on the synthesis hierarchy: its steps and, per synthesis
    index, the chunk each device owns at the end (reducescatter) or starts with
    (allgather), else its own index: ``owned[s]``."""

    hierarchy: Hierarchy
    goal: Goal
    program: Program
    steps: tuple[TracedStep, ...]
    owned: tuple[int, ...]

    @property
    def k(self) -> int:
        return self.hierarchy.k


@dataclass(frozen=True)
class LoweredStep:
    """One instruction on the whole system: the groups of global device ids that
    act together (root first; devices not listed are idle) and, per group, the
    ordered chunk list it covers."""

    instruction: Instruction
    groups: tuple[tuple[int, ...], ...]
    chunks: tuple[tuple[int, ...], ...]

    @property
    def collective(self) -> Collective:
        return self.instruction.collective


@dataclass(frozen=True)
class LoweredProgram:
    program: Program
    goal: Goal
    num_devices: int
    num_chunks: int
    reduction_groups: tuple[tuple[int, ...], ...]  # rank order
    chunk_of_rank: tuple[int, ...]
    steps: tuple[LoweredStep, ...]


def _describe_state(space: StateSpace, state: tuple[int, ...]) -> str:
    parts = []
    for d, i in enumerate(state[:4]):
        runs = space.runs(i)
        held = ", ".join(
            f"chunks {a}..{b - 1} summed over {m.bit_count()} device(s)" for a, b, m in runs[:2]
        )  # contributor counts and chunks are the same in every frame of the space
        parts.append(f"device {d}: {held or 'nothing'}{' ...' if len(runs) > 2 else ''}")
    return "; ".join(parts) + ("; ..." if len(state) > 4 else "")


class _SharedRuns:
    """The chunk lists of a trace, one tuple object per distinct list.

    A group's chunk list is a function of its members' device state ids
    alone, in member order: the root's held runs, or for AllGather the
    members' held runs one after the other (a device state id names the
    chunks held, in every frame of the space). So an AllGather list is built
    once per distinct tuple of ids (``by_ids``), and every list, built or
    stored by the space, is replaced by the first equal one met in the trace
    (``by_value``, each distinct object hashed once: ``by_object``). Where
    every node of a wide step holds the same chunks (an AllGather inside the
    nodes after one across them), thousands of groups then share one list of
    thousands of runs, built once, and the numeric check (:mod:`.execute`)
    finds its columns by the object's identity, once for all of them."""

    def __init__(self, space: StateSpace) -> None:
        self.space = space
        self.by_ids: dict[tuple[int, ...], Runs] = {}
        self.by_value: dict[Runs, Runs] = {}
        self.by_object: dict[int, tuple[Runs, Runs]] = {}  # id -> (the object, kept alive; its equal first one)

    def canonical(self, runs: Runs) -> Runs:
        seen = self.by_object.get(id(runs))
        if seen is None:
            seen = self.by_object[id(runs)] = (runs, self.by_value.setdefault(runs, runs))
        return seen[1]

    def step(self, state: tuple[int, ...], grouping: int, collective: Collective,
             groups: tuple[tuple[int, ...], ...]) -> tuple[Runs, ...]:
        """Per group of a valid step, its ordered chunk list as runs
        (:meth:`~synth.synthesis.statespace.StateSpace.chunk_runs`)."""
        space = self.space
        if collective is not Collective.ALLGATHER:  # the root's held runs: one stored tuple per id
            return tuple(self.canonical(space.chunk_runs(state, grouping, collective, n)) for n in range(len(groups)))
        out = []
        for n, members in enumerate(groups):
            key = tuple([state[m] for m in members])
            runs = self.by_ids.get(key)
            if runs is None:
                runs = self.by_ids[key] = self.canonical(space.chunk_runs(state, grouping, collective, n))
            out.append(runs)
        return tuple(out)


@memoised(maxsize=4096)
def trace(program: Program, hierarchy: Hierarchy, goal: Goal) -> Trace:
    """Run the program on the synthesis hierarchy; SynthError names the first
    invalid step, or says that the end state is not the goal."""
    space = state_space(hierarchy.sizes, goal)
    shared = _SharedRuns(space)
    index = {(g.level, g.form, g.ancestor): i for i, g in enumerate(space.groupings)}
    state = space.start
    steps = []
    for number, instruction in enumerate(program.instructions, 1):
        grouping = resolve(instruction, hierarchy)
        if not grouping.groups:
            raise SynthError(
                f"step {number} {instruction}: every group has one device, the step does nothing"
            )
        g = index.get((grouping.level, grouping.form, grouping.ancestor))
        if g is None:  # a spelling merged into another one: the same groups
            g = next(i for i, other in enumerate(space.groupings) if other.groups == grouping.groups)
        nxt = space.step(state, g, instruction.collective)
        if isinstance(nxt, str):
            if nxt == NO_CHANGE:
                raise SynthError(f"step {number} {instruction} is invalid: {nxt} (a step must change some device)")
            raise SynthError(f"step {number} {instruction} is invalid: {nxt}")
        steps.append(TracedStep(instruction, grouping.groups,
                                shared.step(state, g, instruction.collective, grouping.groups)))
        state = nxt
    if not space.is_goal(state):
        raise SynthError(
            f"the program does not implement {goal.value} over the synthesis hierarchy "
            f"({hierarchy.describe()}): it ends with {_describe_state(space, state)}"
        )
    if goal is Goal.REDUCESCATTER:
        owned = tuple(space.runs(i)[0][0] for i in state)
    else:
        owned = tuple(range(hierarchy.k))
    return Trace(hierarchy, goal, program, tuple(steps), owned)


def lowered_bytes(traced: Trace, rows: int) -> int:
    """About how many bytes :func:`lower` takes for ``traced`` on ``rows``
    reduction groups: per step, a tuple per group and row (its members) and one
    per synthesis group (its chunk list, shared by the rows)."""
    total = 0
    for t in traced.steps:
        chunks = sum(b - a for runs in t.runs for a, b in runs)
        total += rows * len(t.groups) * (56 + 8 * len(t.groups[0])) + 56 * len(t.groups) + 8 * chunks
    return total


def lower(program: Program, reduction: Reduction) -> LoweredProgram:
    """The program on every reduction group at once, in global device ids;
    SynthError (from :func:`trace`) if it does not implement the reduction, or
    if its steps would not fit in memory (:data:`LOWERED_LIMIT_BYTES`, checked
    before building them)."""
    traced = trace(program, reduction.hierarchy, reduction.goal)
    size = lowered_bytes(traced, len(reduction.synthesis_groups))
    if size > LOWERED_LIMIT_BYTES:
        raise SynthError(
            f"the lowered steps of {format_program(program, ' ; ')} on {reduction.topology.num_devices} devices "
            f"would take about {size / 2**30:.1f} GiB (more than {LOWERED_LIMIT_BYTES / 2**30:.0f} GiB); the "
            f"table (no --json or --out) lists and verifies programs without lowering them")
    return _relabel(traced, reduction, reduction.synthesis_groups, reduction.reduction_groups,
                    reduction.topology.num_devices)


def group_runs(program: Program, reduction: Reduction) -> tuple[tuple[int, ...], list]:
    """What every reduction group runs, in the coordinates the goal is stated in:
    ``(chunk_of_rank, steps)`` with devices numbered by reduction rank (device
    ``r`` = the member of rank ``r``) and each step ``(collective, [(members,
    runs)])``, chunk lists left as runs (nothing of size ``k x k`` is built)."""
    traced = trace(program, reduction.hierarchy, reduction.goal)
    rank_of_index = [0] * traced.k
    for rank, index in enumerate(reduction.rank_to_synthesis_index):
        rank_of_index[index] = rank
    rank = rank_of_index.__getitem__
    steps = [(t.instruction.collective, [(tuple(map(rank, group)), runs) for group, runs in zip(t.groups, t.runs)])
             for t in traced.steps]
    return _chunk_of_rank(traced, reduction), steps


def synthesis_program(traced: Trace) -> LoweredProgram:
    """The traced program on one reduction group in synthesis coordinates
    (device ``s`` = synthesis index ``s``, ranked ``s``): every placement's
    :func:`group_runs` is this program with its devices renamed by
    ``rank_to_synthesis_index``, and the goal is stated the same way after
    the renaming, so proving this one proves it for every placement whose
    synthesis hierarchy has these sizes."""
    k = traced.k
    steps = tuple(LoweredStep(t.instruction, t.groups, t.chunks(k)) for t in traced.steps)
    owned = traced.owned if traced.goal is Goal.REDUCESCATTER else tuple(range(k))
    return LoweredProgram(traced.program, traced.goal, k, k, (tuple(range(k)),), owned, steps)


def _chunk_of_rank(traced: Trace, reduction: Reduction) -> tuple[int, ...]:
    sigma = reduction.rank_to_synthesis_index
    if traced.goal is Goal.REDUCESCATTER:
        return tuple(traced.owned[s] for s in sigma)
    if traced.goal is Goal.ALLGATHER:
        return tuple(sigma)
    return tuple(range(traced.k))


def _relabel(traced: Trace, reduction: Reduction, table: np.ndarray, rank_groups: np.ndarray,
             num_devices: int) -> LoweredProgram:
    """The trace applied through ``table`` (row = reduction group, column =
    synthesis index -> device id), groups sorted by device ids."""
    chunk_of_rank = _chunk_of_rank(traced, reduction)
    steps = []
    for t in traced.steps:
        chunks = t.chunks(traced.k)  # one tuple per synthesis group, shared by every row
        members = table[:, np.asarray(t.groups)]  # (rows, groups, size)
        pairs = sorted((tuple(row.tolist()), c) for per_row in members for row, c in zip(per_row, chunks))
        steps.append(LoweredStep(t.instruction, tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)))
    return LoweredProgram(
        program=traced.program,
        goal=traced.goal,
        num_devices=num_devices,
        num_chunks=traced.k,
        reduction_groups=tuple(tuple(row) for row in np.asarray(rank_groups).tolist()),
        chunk_of_rank=chunk_of_rank,
        steps=tuple(steps),
    )


# ---------------------------------------------------------------- structure


def check_structure(lowered: LoweredProgram) -> None:
    """SynthError unless the lowered program is well formed: the reduction
    groups partition the devices into groups of ``num_chunks``;
    ``chunk_of_rank`` is a permutation of the chunks; in every step each group
    has distinct devices, lies inside one reduction group and does not share a
    device with another group of the step; its chunk list holds distinct
    chunks, and for ReduceScatter and AllGather divides into one part per
    member. Both verifiers check this first: their models assume it."""
    n, k = lowered.num_devices, lowered.num_chunks
    rows = np.asarray(lowered.reduction_groups, dtype=np.int64).reshape(-1, k) if lowered.reduction_groups else \
        np.zeros((0, k), dtype=np.int64)
    if rows.size != n or sorted(rows.ravel().tolist()) != list(range(n)):
        raise SynthError(f"the reduction groups do not partition devices 0..{n - 1} into groups of {k}")
    if sorted(lowered.chunk_of_rank) != list(range(k)):
        raise SynthError(f"chunk_of_rank is not a permutation of chunks 0..{k - 1}")
    group_of = np.empty(n, dtype=np.int64)
    group_of[rows] = np.arange(len(rows))[:, None]
    for number, step in enumerate(lowered.steps, 1):
        where = f"step {number} ({step.instruction})"
        seen: set[int] = set()
        for group, chunks in zip(step.groups, step.chunks):
            if len(group) < 2 or len(set(group)) != len(group) or not all(0 <= d < n for d in group):
                raise SynthError(f"{where}: group {list(group)} must hold 2 or more distinct devices of 0..{n - 1}")
            if seen.intersection(group):
                raise SynthError(f"{where}: group {list(group)} shares devices with another group of the step; "
                                 "the groups of a step must be disjoint")
            seen.update(group)
            if len(set(group_of[list(group)].tolist())) != 1:
                raise SynthError(f"{where}: group {list(group)} spans reduction groups")
            if len(set(chunks)) != len(chunks) or not all(0 <= c < k for c in chunks):
                raise SynthError(f"{where}: the chunk list of group {list(group)} must hold distinct chunks of "
                                 f"0..{k - 1}")
            if step.collective in (Collective.REDUCESCATTER, Collective.ALLGATHER) and len(chunks) % len(group):
                raise SynthError(f"{where}: {len(chunks)} chunks do not divide into one part per member of group "
                                 f"{list(group)} ({len(group)} members)")


def restrict(lowered: LoweredProgram, rows: Sequence[int]) -> LoweredProgram:
    """The program on some reduction groups only, devices renumbered 0.. in the
    order of those groups. Sound because every lowered group lies inside one
    reduction group (checked here): the groups never exchange data."""
    keep = [lowered.reduction_groups[i] for i in rows]
    ids = {d: i for i, d in enumerate(d for g in keep for d in g)}
    steps = []
    for step in lowered.steps:
        pairs = []
        for group, chunks in zip(step.groups, step.chunks):
            inside = [d in ids for d in group]
            if any(inside) and not all(inside):
                raise SynthError(f"{step.instruction}: group {list(group)} spans reduction groups")
            if all(inside):
                pairs.append((tuple(ids[d] for d in group), chunks))
        steps.append(LoweredStep(step.instruction, tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)))
    return LoweredProgram(
        program=lowered.program,
        goal=lowered.goal,
        num_devices=len(ids),
        num_chunks=lowered.num_chunks,
        reduction_groups=tuple(tuple(ids[d] for d in g) for g in keep),
        chunk_of_rank=lowered.chunk_of_rank,
        steps=tuple(steps),
    )


def verification_scope(lowered: LoweredProgram, limit: int) -> tuple[LoweredProgram, str] | None:
    """What a verifier with a budget of ``limit`` (device, chunk) values checks:
    the whole system, else reduction group 0 alone, else None (too large)."""
    if lowered.num_devices * lowered.num_chunks <= limit:
        return lowered, "whole system"
    if lowered.num_chunks**2 <= limit:
        return restrict(lowered, [0]), f"reduction group 0 of {len(lowered.reduction_groups)}"
    return None
