"""Lower a program from the synthesis hierarchy to the whole system.

A program is traced once on the synthesis hierarchy (one reduction group) with
the semantics, which gives, per step, the synthesis groups and the ordered chunk
list each group covers. The same grouping is then applied to every reduction
group at once through ``Reduction.synthesis_groups`` (row = reduction group,
column = synthesis index).

Chunks and shards. The data of a reduction group is split into ``k`` chunks.
``chunk_of_rank[r]`` is the chunk that holds the shard of reduction rank ``r``
(the user's ``r``-th 1/k of the buffer): for ReduceScatter the chunk that rank
``r`` owns at the end, for AllGather the chunk rank ``r`` starts with, identity
for AllReduce. Chunks are placeholders for byte ranges; a runtime maps chunk
``chunk_of_rank[r]`` to the byte range of shard ``r``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .errors import SynthError
from .language import Collective, Instruction, Program
from .reduction import Reduction
from .semantics import (
    Goal,
    Hierarchy,
    State,
    apply_step,
    held_chunks,
    initial_state,
    is_goal,
    resolve,
    runs_of,
    step_chunks,
)


@dataclass(frozen=True)
class TracedStep:
    instruction: Instruction
    groups: tuple[tuple[int, ...], ...]  # synthesis indices, root first
    chunks: tuple[tuple[int, ...], ...]  # per group, the ordered chunk list


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


def _describe_state(state: State) -> str:
    parts = []
    for d, s in enumerate(state[:4]):
        runs = runs_of(s)
        held = ", ".join(
            f"chunks {a}..{b - 1} summed over {bin(m).count('1')} device(s)" for a, b, m in runs[:2]
        )
        parts.append(f"device {d}: {held or 'nothing'}{' ...' if len(runs) > 2 else ''}")
    return "; ".join(parts) + ("; ..." if len(state) > 4 else "")


def trace(program: Program, hierarchy: Hierarchy, goal: Goal) -> tuple[tuple[TracedStep, ...], State]:
    """Run the program on the synthesis hierarchy; SynthError names the first
    invalid step, or says that the end state is not the goal."""
    state = initial_state(goal, hierarchy.k)
    steps = []
    for number, instruction in enumerate(program.instructions, 1):
        grouping = resolve(instruction, hierarchy)
        if not grouping.groups:
            raise SynthError(
                f"step {number} {instruction}: every group has one device, the step does nothing"
            )
        chunks = tuple(
            tuple(step_chunks(instruction.collective, [state[d] for d in g])) for g in grouping.groups
        )
        nxt = apply_step(state, instruction.collective, grouping.groups)
        if isinstance(nxt, str):
            raise SynthError(f"step {number} {instruction} is invalid: {nxt}")
        steps.append(TracedStep(instruction, grouping.groups, chunks))
        state = nxt
    if not is_goal(state, goal):
        raise SynthError(
            f"the program does not implement {goal.value} over the synthesis hierarchy "
            f"({hierarchy.describe()}): it ends with {_describe_state(state)}"
        )
    return tuple(steps), state


def lower(program: Program, reduction: Reduction) -> LoweredProgram:
    """The program on every reduction group at once, in global device ids;
    SynthError (from :func:`trace`) if it does not implement the reduction."""
    hierarchy, goal = reduction.hierarchy, reduction.goal
    traced, final = trace(program, hierarchy, goal)
    table = reduction.synthesis_groups
    sigma = reduction.rank_to_synthesis_index
    if goal is Goal.REDUCESCATTER:
        chunk_of_rank = tuple(held_chunks(final[s])[0] for s in sigma)
    elif goal is Goal.ALLGATHER:
        chunk_of_rank = tuple(sigma)
    else:
        chunk_of_rank = tuple(range(hierarchy.k))
    steps = []
    for t in traced:
        pairs = sorted(
            (tuple(int(v) for v in row[list(g)]), c) for g, c in zip(t.groups, t.chunks) for row in table
        )
        steps.append(
            LoweredStep(t.instruction, tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))
        )
    rank_groups = reduction.reduction_groups
    return LoweredProgram(
        program=program,
        goal=goal,
        num_devices=reduction.topology.num_devices,
        num_chunks=hierarchy.k,
        reduction_groups=tuple(tuple(int(v) for v in row) for row in rank_groups),
        chunk_of_rank=chunk_of_rank,
        steps=tuple(steps),
    )


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
