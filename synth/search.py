"""Enumerate every valid program up to a step limit, searching over states.

Many prefixes reach the same state, so the search is a breadth-first walk of
the state graph (each distinct state is expanded once) followed by an
enumeration of all paths of length <= ``max_steps`` from the initial state to
the goal state. A program is valid when each of its steps is valid in the state
it meets and the last state is the goal (a program may pass through the goal
and leave it again; it is still a valid program of the language). Instructions
that denote the same groups are merged (:func:`distinct_groupings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .language import Collective, Instruction, Program
from .placement import Placement
from .reduction import Reduction
from .semantics import (
    Goal,
    Hierarchy,
    Loads,
    State,
    apply_grouping,
    distinct_groupings,
    final_collectives,
    initial_state,
    is_goal,
    may_finish_in_one_step,
    step_load,
)


@dataclass(frozen=True)
class SearchStats:
    states: int
    transitions: int
    programs: int


def instruction_set(hierarchy: Hierarchy) -> tuple[Instruction, ...]:
    """Every distinct non-no-op instruction, grouping-major, in collective order."""
    return tuple(
        grouping.instruction(collective, hierarchy)
        for grouping in distinct_groupings(hierarchy)
        for collective in Collective
    )


def synthesize(hierarchy: Hierarchy, goal: Goal, max_steps: int = 5) -> tuple[tuple[Program, ...], SearchStats]:
    """All valid programs of at most ``max_steps`` steps, shortest first (ties in
    instruction order), with search statistics. Cached on the hierarchy's sizes,
    since level names do not change which programs are valid."""
    programs, _, stats = _synthesize_indices(hierarchy.sizes, goal, max_steps)
    instructions = instruction_set(hierarchy)
    return tuple(Program(tuple(instructions[i] for i in p)) for p in programs), stats


def program_loads(hierarchy: Hierarchy, goal: Goal, max_steps: int = 5) -> tuple[tuple[Loads, ...], ...]:
    """For each program of :func:`synthesize` (same order), per step the number of
    chunks each synthesis group moves (what the cost model needs)."""
    return _synthesize_indices(hierarchy.sizes, goal, max_steps)[1]


@lru_cache(maxsize=256)
def _synthesize_indices(
    sizes: tuple[int, ...], goal: Goal, max_steps: int
) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[Loads, ...], ...], SearchStats]:
    hierarchy = Hierarchy(tuple(f"l{i}" for i in range(len(sizes))), sizes)
    groupings = distinct_groupings(hierarchy)
    collectives = tuple(Collective)
    start = initial_state(goal, hierarchy.k)
    ids: dict[State, int] = {start: 0}
    states: list[State] = [start]
    goal_ids: set[int] = {0} if is_goal(start, goal) else set()
    # preds[t][node] = [(prev, instruction index, loads)]: edges reaching node at depth t
    preds: list[dict[int, list[tuple[int, int, Loads]]]] = [{0: []}]
    expanded: dict[int, list[tuple[int, int, Loads]]] = {}
    transitions = 0

    def successors(node: int, last: bool) -> list[tuple[int, int, Loads]]:
        nonlocal transitions
        state = states[node]
        wanted = final_collectives(goal) if last else collectives
        edges = []
        for g, grouping in enumerate(groupings):
            results = apply_grouping(state, grouping.groups, wanted)
            for collective, nxt in results.items():
                if isinstance(nxt, str):
                    continue
                transitions += 1
                nid = ids.get(nxt)
                if nid is None:
                    if last and not is_goal(nxt, goal):
                        continue  # cannot end a program and is never needed again
                    nid = len(states)
                    ids[nxt] = nid
                    states.append(nxt)
                    if is_goal(nxt, goal):
                        goal_ids.add(nid)
                loads = tuple(step_load(collective, [state[d] for d in group]) for group in grouping.groups)
                edges.append((g * len(collectives) + collectives.index(collective), nid, loads))
        return edges

    for depth in range(1, max_steps + 1):
        last = depth == max_steps
        layer: dict[int, list[tuple[int, int, Loads]]] = {}
        for node in preds[depth - 1]:
            if node in expanded:
                edges = expanded[node]
            elif last:
                if not may_finish_in_one_step(states[node], goal):
                    continue
                edges = successors(node, last=True)
            else:
                edges = expanded[node] = successors(node, last=False)
            for index, nid, loads in edges:
                if not last or nid in goal_ids:
                    layer.setdefault(nid, []).append((node, index, loads))
        preds.append(layer)

    found: list[tuple[tuple[int, ...], tuple[Loads, ...]]] = []

    def walk(node: int, depth: int, suffix: tuple[int, ...], loads: tuple[Loads, ...]) -> None:
        if depth == 0:
            if node == 0:
                found.append((suffix, loads))
            return
        for prev, index, step_loads in preds[depth].get(node, ()):
            walk(prev, depth - 1, (index,) + suffix, (step_loads,) + loads)

    for depth in range(0, max_steps + 1):
        for g in sorted(goal_ids):
            walk(g, depth, (), ())
    found.sort(key=lambda p: (len(p[0]), p[0]))
    return (
        tuple(p for p, _ in found),
        tuple(loads for _, loads in found),
        SearchStats(states=len(states), transitions=transitions, programs=len(found)),
    )


@dataclass(frozen=True)
class ReductionPrograms:
    """A reduction and every valid program on its synthesis hierarchy."""

    reduction: Reduction
    programs: tuple[Program, ...]  # shortest first, ties in instruction order
    loads: tuple[tuple[Loads, ...], ...]  # per program, per step, per synthesis group
    stats: SearchStats

    @property
    def placement(self) -> Placement:
        return self.reduction.placement

    @property
    def hierarchy(self) -> Hierarchy:
        return self.reduction.hierarchy


def synthesize_reduction(reduction: Reduction, max_steps: int = 5) -> ReductionPrograms:
    """Every valid program of at most ``max_steps`` steps for ``reduction``.
    Reductions whose synthesis hierarchies have the same sizes share one search
    (level names are substituted; the programs are the same)."""
    hierarchy = reduction.hierarchy
    programs, stats = synthesize(hierarchy, reduction.goal, max_steps)
    return ReductionPrograms(reduction, programs, program_loads(hierarchy, reduction.goal, max_steps), stats)


def clear_cache() -> None:
    """Forget the memoised searches (for benchmarks that time cold searches)."""
    _synthesize_indices.cache_clear()
