"""Enumerate every valid program up to a step limit, searching over states.

Many prefixes reach the same state, so the search is a breadth-first walk of
the state graph (each distinct state is expanded once, through a
:class:`~synth.synthesis.statespace.StateSpace`) that records, per depth, the edges
reaching each state: a layered graph. The programs are the paths of length
``<= max_steps`` from the initial state to the goal state in it. A program is
valid when each of its steps is valid in the state it meets and the last state
is the goal (a program may pass through the goal and leave it again; it is
still a valid program of the language). Instructions that denote the same
groups are merged (:func:`distinct_groupings`).

The graph is small even when the programs are many (rack at 8 steps: about
20 000 states for 870 000 programs), so what callers need is taken from it
directly: the number of programs (:meth:`Search.count`, a sum over paths), all
of them in order (:meth:`Search.indices`, only when asked), or the ``top``
cheapest under an additive cost per step (:meth:`Search.best`, k shortest
paths over the layers).

Test hook: ``_search`` (one search, not memoised), which tests replace to see
how :func:`search` calls it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from ..blas import one_blas_thread
from ..caches import clear_caches, register_table
from ..collector import collector_paused
from ..errors import SynthError
from .language import Collective, Instruction, Program
from .placement import Placement
from .reduction import Reduction
from .semantics import Goal, Hierarchy, Loads, distinct_groupings, final_collectives
from .statespace import StateKey, state_space

#: (previous state, instruction index, chunks moved per group) of one edge
Edge = tuple[int, int, Loads]
#: a program as instruction indices (into :func:`instruction_set`)
Indices = tuple[int, ...]

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


@dataclass(frozen=True, eq=False)
class Search:
    """The layered state graph of one search. ``layers[t]`` maps each state
    reached after ``t`` steps on the way to a program of at most ``max_steps``
    steps to the edges reaching it (``layers[0] = {0: ()}``, the initial
    state); in the last layer only edges into a goal state are kept."""

    sizes: tuple[int, ...]
    goal: Goal
    max_steps: int
    layers: tuple[dict[int, tuple[Edge, ...]], ...]
    goal_states: frozenset[int]
    states: int
    transitions: int

    @cached_property
    def _live(self) -> tuple[dict[int, tuple[Edge, ...]], ...]:
        """:attr:`layers` without the states from which no goal state is
        reached within the remaining layers (a program passes only through
        live states): the lookahead keeps states that may finish, of which
        few do (five levels of 4: 8,009 states after step 4, 1,035 live)."""
        live: list[dict[int, tuple[Edge, ...]]] = []
        alive = set()
        for depth in range(self.max_steps, -1, -1):
            layer = self.layers[depth]
            alive = {s for s in layer if s in alive or s in self.goal_states}
            live.append({s: layer[s] for s in alive})
            alive = {p for s in alive for p, _, _ in layer[s]}
        return tuple(reversed(live))

    @cached_property
    def _ways(self) -> list[dict[int, int]]:
        """``ways[t][s]``: paths of length ``t`` from the initial state to the
        live state ``s`` (:attr:`_live`)."""
        ways = [{0: 1}]
        for layer in self._live[1:]:
            before = ways[-1]
            ways.append({s: sum(before[p] for p, _, _ in edges) for s, edges in layer.items()})
        return ways

    @property
    def count(self) -> int:
        """The number of valid programs."""
        return sum(w.get(s, 0) for w in self._ways for s in self.goal_states)

    @property
    def stats(self) -> SearchStats:
        return SearchStats(self.states, self.transitions, self.count)

    @cached_property
    def indices(self) -> tuple[tuple[Indices, tuple[Loads, ...]], ...]:
        """Every valid program with its loads, shortest first, ties in instruction order."""
        found: list[tuple[Indices, tuple[Loads, ...]]] = []

        def walk(node: int, depth: int, suffix: Indices, loads: tuple[Loads, ...]) -> None:
            if depth == 0:
                if node == 0:
                    found.append((suffix, loads))
                return
            for prev, index, step_loads in self.layers[depth].get(node, ()):
                walk(prev, depth - 1, (index,) + suffix, (step_loads,) + loads)

        for depth in range(self.max_steps + 1):
            for s in sorted(self.goal_states):
                walk(s, depth, (), ())
        found.sort(key=lambda p: (len(p[0]), p[0]))
        return tuple(found)

    def path_loads(self, indices: Indices) -> tuple[Loads, ...] | None:
        """The loads of the program ``indices`` if it is one of the programs, else None."""
        node, loads = 0, []
        for depth, index in enumerate(indices, 1):
            if depth > self.max_steps:
                return None
            step = next(((s, l) for s, edges in self.layers[depth].items() for prev, i, l in edges
                         if prev == node and i == index), None)
            if step is None:
                return None
            node = step[0]
            loads.append(step[1])
        return tuple(loads) if node in self.goal_states else None

    def best(self, cost: Callable[[int, Loads], float], top: int) -> list[tuple[float, Indices, tuple[Loads, ...]]]:
        """The ``top`` cheapest programs, cheapest first, as ``(cost, indices,
        loads)``; a program's cost is ``cost(index, loads)`` summed over its
        steps in order, as ``sum`` does, and ties go to the shorter program, then
        instruction order: exactly the first ``top`` of sorting every program by
        ``(cost, length, indices)``.

        k shortest paths over the layers: each state keeps only the partial paths
        that can still be among the ``top``. Summing is monotone, so a partial path
        that ``top`` others at the same state beat by more than rounding can ever
        make up never wins; a first pass bounds the costs that matter, a second
        keeps everything within that rounding margin of each state's
        ``top``-th."""
        if top <= 0:
            return []
        memo: dict[tuple[int, Loads], float] = {}

        def edge(index: int, loads: Loads) -> float:
            key = (index, loads)
            if key not in memo:
                memo[key] = cost(index, loads)
            return memo[key]

        costs = self._best_costs(edge, top)
        if len(costs) < top:
            return self._best(edge, top, 0.0)  # every program is there
        margin = (self.max_steps + 1) * math.ulp(costs[-1])
        return self._best(edge, top, margin)

    def _best_costs(self, edge, top: int) -> list[float]:
        """The ``top`` smallest program costs (fewer if there are fewer
        programs), ascending: per state the ``top`` smallest partial sums, which
        are the same floats as :meth:`_best` adds (same order of additions)."""
        done: list[float] = [0.0] if 0 in self.goal_states else []
        partial: dict[int, list[float]] = {0: [0.0]}
        for layer in self._live[1:]:
            nxt: dict[int, list[float]] = {}
            for s, edges in layer.items():
                candidates = [c + w for prev, index, loads in edges if prev in partial
                              for w in (edge(index, loads),) for c in partial[prev]]
                if candidates:
                    candidates.sort()
                    nxt[s] = candidates[:top]
            partial = nxt
            for s in self.goal_states:
                done.extend(partial.get(s, ()))
        done.sort()
        return done[:top]

    def _best(self, edge, top: int, margin: float) -> list[tuple[float, Indices, tuple[Loads, ...]]]:
        Partial = tuple[float, Indices, tuple[Loads, ...]]

        def keep(candidates: list[Partial]) -> list[Partial]:
            if len(candidates) <= top:
                return candidates
            cut = sorted([c[0] for c in candidates])[top - 1] + margin  # the top-th smallest cost
            return [c for c in candidates if c[0] <= cut]

        done: list[Partial] = []
        partial: dict[int, list[Partial]] = {0: [(0.0, (), ())]}
        if 0 in self.goal_states:
            done.append((0, (), ()))  # k = 1: the empty program, cost sum(()) = 0
        for layer in self._live[1:]:
            nxt: dict[int, list[Partial]] = {}
            for s, edges in layer.items():
                candidates = [
                    (c + w, p + (index,), l + (loads,))
                    for prev, index, loads in edges if prev in partial
                    for w in (edge(index, loads),)  # once per edge, not per partial path
                    for c, p, l in partial[prev]
                ]
                if candidates:
                    nxt[s] = keep(candidates)
            partial = nxt
            for s in self.goal_states:
                done.extend(partial.get(s, ()))
        done.sort(key=lambda c: (c[0], len(c[1]), c[1]))
        return done[:top]


#: device-state ids the searched states may hold in all (8 bytes each): a search
#: that would hold more stops with an error instead of exhausting memory
STATE_BUDGET = 1 << 27

#: the last searches, by (sizes, goal, max steps)
_SEARCHES: OrderedDict[tuple[tuple[int, ...], Goal, int], Search] = register_table(
    OrderedDict(), __name__, "_SEARCHES")


def search(sizes: tuple[int, ...], goal: Goal, max_steps: int,
           progress: Callable[[str], None] | None = None) -> Search:
    """The layered state graph of every program of at most ``max_steps`` steps
    on a hierarchy of ``sizes`` toward ``goal``; memoised (the last 256), since
    level names do not change which programs are valid. ``progress`` receives a
    status line every few hundred expanded states."""
    key = (tuple(sizes), goal, max_steps)
    if key in _SEARCHES:
        _SEARCHES.move_to_end(key)
        return _SEARCHES[key]
    with collector_paused(), one_blas_thread():  # see synth.blas
        found = _SEARCHES[key] = _search(*key, progress)
    if len(_SEARCHES) > 256:
        _SEARCHES.popitem(last=False)
    return found


def _search(sizes: tuple[int, ...], goal: Goal, max_steps: int, progress: Callable[[str], None] | None) -> Search:
    space = state_space(sizes, goal)
    collectives = tuple(Collective)
    finals = final_collectives(goal)
    start = space.key(space.start)  # states are kept as keys: few distinct ids as a pattern (StateSpace.key)
    ids: dict[StateKey, int] = {start: 0}
    states: list[StateKey] = [start]
    goal_states: set[int] = {0} if space.is_goal(start) else set()
    layers: list[dict[int, tuple[Edge, ...]]] = [{0: ()}]
    expanded: dict[int, list[tuple[int, int, Loads]]] = {}  # state -> (instruction, next state, loads)
    transitions = 0
    shape = "x".join(map(str, sizes)) or "1"
    vetted: set[int] = set()  # the states the step before last reached through its lookahead: they may finish

    for depth in range(1, max_steps + 1):
        last = depth == max_steps
        # the last step must reach the goal; the one before, a state that may finish
        lookahead = "goal" if last else "finish" if depth == max_steps - 1 else None
        todo = [n for n in layers[-1]
                if n not in expanded and (not last or n in vetted or space.may_finish(states[n]))]
        found: dict[int, list[tuple[int, int, Loads]]] = {}
        for count, node in enumerate(todo, 1):
            edges = found[node] = []
            for g, collective, child, loads in space.expand(states[node], finals if last else collectives, lookahead):
                transitions += 1
                nid = ids.get(child)
                if nid is None:
                    reached = space.is_goal(child)
                    if last and not reached:
                        continue  # cannot end a program and is never needed again
                    nid = ids[child] = len(states)
                    states.append(child)
                    if reached:
                        goal_states.add(nid)
                edges.append((g * len(collectives) + collectives.index(collective), nid, loads))
            if len(states) * space.k > STATE_BUDGET:
                raise SynthError(
                    f"the search on the synthesis hierarchy {shape} holds {len(states)} states of {space.k} "
                    f"devices (about {len(states) * space.k * 8 / 2**30:.1f} GiB) at step {depth} of "
                    f"--max-steps {max_steps}; lower --max-steps")
            if progress is not None and count % 256 == 0:
                progress(f"searching {shape}: step {depth} of {max_steps}, {len(states)} states")
        if not last:
            expanded.update(found)
        if lookahead == "finish":
            vetted = {nid for edges in found.values() for _, nid, _ in edges}
        layer: dict[int, list[Edge]] = {}
        for node in layers[-1]:
            for index, nid, loads in expanded.get(node, found.get(node, ())):
                if not last or nid in goal_states:
                    layer.setdefault(nid, []).append((node, index, loads))
        layers.append({s: tuple(e) for s, e in layer.items()})
    return Search(tuple(sizes), goal, max_steps, tuple(layers), frozenset(goal_states), len(states), transitions)


def synthesize(hierarchy: Hierarchy, goal: Goal, max_steps: int = 5) -> tuple[tuple[Program, ...], SearchStats]:
    """All valid programs of at most ``max_steps`` steps, shortest first (ties in
    instruction order), with search statistics."""
    found = search(hierarchy.sizes, goal, max_steps)
    instructions = instruction_set(hierarchy)
    return tuple(Program(tuple(instructions[i] for i in p)) for p, _ in found.indices), found.stats


def program_loads(hierarchy: Hierarchy, goal: Goal, max_steps: int = 5) -> tuple[tuple[Loads, ...], ...]:
    """For each program of :func:`synthesize` (same order), per step the number of
    chunks each synthesis group moves (what the cost model needs)."""
    return tuple(loads for _, loads in search(hierarchy.sizes, goal, max_steps).indices)


@dataclass(frozen=True)
class ReductionPrograms:
    """A reduction and every valid program on its synthesis hierarchy. The
    programs are taken from the search's graph when first asked for;
    :attr:`count` and :meth:`best` do not list them."""

    reduction: Reduction
    search: Search

    @property
    def placement(self) -> Placement:
        return self.reduction.placement

    @property
    def hierarchy(self) -> Hierarchy:
        return self.reduction.hierarchy

    @cached_property
    def instructions(self) -> tuple[Instruction, ...]:
        """:func:`instruction_set` of the hierarchy (what program indices name)."""
        return instruction_set(self.hierarchy)

    def program(self, indices: Indices) -> Program:
        return Program(tuple(self.instructions[i] for i in indices))

    @cached_property
    def programs(self) -> tuple[Program, ...]:
        """Every program, shortest first, ties in instruction order."""
        return tuple(self.program(p) for p, _ in self.search.indices)

    @property
    def loads(self) -> tuple[tuple[Loads, ...], ...]:
        """Per program (same order), per step, per synthesis group: chunks moved."""
        return tuple(loads for _, loads in self.search.indices)

    @property
    def count(self) -> int:
        return self.search.count

    @property
    def stats(self) -> SearchStats:
        return self.search.stats

    def loads_of(self, program: Program) -> tuple[Loads, ...] | None:
        """The loads of ``program`` if it is one of the programs, else None."""
        position = {instruction: i for i, instruction in enumerate(self.instructions)}
        indices = tuple(position.get(i, -1) for i in program.instructions)
        return None if -1 in indices else self.search.path_loads(indices)

    def best(self, cost: Callable[[Instruction, Loads], float], top: int) -> list[tuple[float, Program, tuple[Loads, ...]]]:
        """:meth:`Search.best` with the cost of each step given per instruction."""
        found = self.search.best(lambda i, loads: cost(self.instructions[i], loads), top)
        return [(c, self.program(p), loads) for c, p, loads in found]


def synthesize_reduction(reduction: Reduction, max_steps: int = 5,
                         progress: Callable[[str], None] | None = None) -> ReductionPrograms:
    """Every valid program of at most ``max_steps`` steps for ``reduction``.
    Reductions whose synthesis hierarchies have the same sizes share one search
    (level names are substituted; the programs are the same)."""
    return ReductionPrograms(reduction, search(reduction.hierarchy.sizes, reduction.goal, max_steps, progress))


def clear_cache() -> None:
    """Forget the memoised searches and state spaces (for benchmarks that time
    cold searches): the memos :mod:`synth.caches` holds for this module and
    the state space package."""
    clear_caches(__name__, "synth.synthesis.statespace")
