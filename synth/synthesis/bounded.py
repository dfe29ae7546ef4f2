"""An independent z3 bounded search over the reduction language (a cross-check of
:mod:`synth.synthesis.search`).

It shares only the language with the rest of the package (which instructions
exist and their groups: :func:`synth.synthesis.semantics.distinct_groupings`); the
semantics of docs/model.md is encoded here from scratch, P2-style, as
Boolean tensors over ``k`` devices and ``k`` chunks:

* ``held[t][d][x]``: after ``t`` steps device ``d`` holds chunk ``x``;
* ``has[t][d][x][e]``: device ``e``'s contribution is summed in ``d``'s copy of
  ``x``. A chunk is held exactly when some contribution is in it.

The program is one z3 Int ``op[t]`` per step ``t < L``, an index into
:func:`instructions` (grouping-major, collectives in enum order) or ``STOP`` =
its length. ``op[0]`` is never ``STOP``, a ``STOP`` is followed by ``STOP`` and
keeps the state, so a model is a program of length ``1..L`` and every program has
exactly one model. For ``op[t] == i`` the step's precondition holds in every
group of instruction ``i``, members take the collective's result, devices
outside the groups keep their state, and some device's state changes (a step
that changes nothing is not a step of a program). Rules, per group
``m_0..m_{s-1}`` (root ``m_0``):

* AllReduce: members hold the same non-empty chunks and no contribution is in
  two members' copies of a chunk; all get the union.
* ReduceScatter: the same precondition; with ``n`` held chunks (``s`` must divide
  ``n``) and ``pos(x)`` the number of held chunks below ``x``, member ``i`` keeps
  the union on the held chunks with ``i*n/s <= pos(x) < (i+1)*n/s``.
* AllGather: members hold pairwise disjoint chunk sets of equal size (all
  empty is allowed: the union is empty); all get the union.
* Reduce: AllReduce's precondition; the root gets the union, the others nothing.
* Broadcast: the root holds something, every member's ``has`` is contained in
  the root's and some member's differs; all get the root's state.

A device's new state is stated once per distinct result, guarded by the
instructions that yield it (idle devices and ``STOP`` share "unchanged"; AllReduce
and AllGather share the union). Counts are ``Sum``s of 0/1 terms over bounded
values, so the whole unrolling is finite-domain and solved with z3's ``QF_FD``
(SAT-based) solver. All programs are enumerated with blocking clauses over ``op``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import z3

from ..interrupts import solver_check, z3_interrupts
from .language import Collective, Instruction
from .semantics import Goal, Hierarchy, distinct_groupings

Group = tuple[int, ...]


@dataclass(frozen=True)
class DevState:
    """One device's symbolic state: ``held[x]`` and ``has[x][e]``."""

    held: tuple[z3.BoolRef, ...]
    has: tuple[tuple[z3.BoolRef, ...], ...]


SymState = tuple[DevState, ...]


@dataclass(frozen=True)
class Step:
    """An instruction of the language with what the encoding needs of it."""

    instruction: Instruction
    collective: Collective
    groups: tuple[Group, ...]


def instructions(hierarchy: Hierarchy) -> tuple[Step, ...]:
    """Every distinct instruction: for each grouping of :func:`distinct_groupings`,
    each collective in enum order (the order of ``synth.synthesis.search.instruction_set``)."""
    return tuple(
        Step(grouping.instruction(c, hierarchy), c, grouping.groups)
        for grouping in distinct_groupings(hierarchy)
        for c in Collective
    )


# ---------------------------------------------------------------- states


def _fresh(name: str, k: int) -> tuple[SymState, z3.BoolRef]:
    """Fresh state variables and their well-formedness (held = some contribution)."""
    devices = []
    facts = []
    for d in range(k):
        held = tuple(z3.Bool(f"{name}_held_{d}_{x}") for x in range(k))
        has = tuple(tuple(z3.Bool(f"{name}_has_{d}_{x}_{e}") for e in range(k)) for x in range(k))
        facts += [held[x] == z3.Or(has[x]) for x in range(k)]
        devices.append(DevState(held, has))
    return tuple(devices), z3.And(facts)


def concrete(k: int, contents: dict[int, set[int]]) -> DevState:
    """A concrete device state: ``contents`` maps each held chunk to its
    (non-empty) contributor set; chunks of ``range(k)`` not in it are not held."""
    has = tuple(tuple(z3.BoolVal(e in contents.get(x, ())) for e in range(k)) for x in range(k))
    return DevState(tuple(z3.BoolVal(bool(contents.get(x))) for x in range(k)), has)


def initial(goal: Goal, k: int) -> SymState:
    """AllReduce/ReduceScatter: ``d`` holds every chunk with contributor ``{d}``;
    AllGather: ``d`` holds chunk ``d`` only, contributor ``{d}``."""
    if goal is Goal.ALLGATHER:
        return tuple(concrete(k, {d: {d}}) for d in range(k))
    return tuple(concrete(k, {x: {d} for x in range(k)}) for d in range(k))


def is_goal(goal: Goal, state: SymState) -> z3.BoolRef:
    """AllReduce: all chunks everywhere, all contributors. AllGather: all chunks
    everywhere, chunk ``x`` with contributors exactly ``{x}``. ReduceScatter: each
    device one chunk with all contributors, chunks distinct across devices."""
    k = len(state)
    if goal is Goal.ALLREDUCE:
        return z3.And([v for s in state for row in s.has for v in row])
    if goal is Goal.ALLGATHER:
        return z3.And([v if e == x else z3.Not(v) for s in state for x, row in enumerate(s.has) for e, v in enumerate(row)])
    one_each = [z3.PbEq([(h, 1) for h in s.held], 1) for s in state]
    complete = [z3.Implies(s.held[x], z3.And(s.has[x])) for s in state for x in range(k)]
    distinct = [z3.AtMost(*[s.held[x] for s in state], 1) for x in range(k)]
    return z3.And(one_each + complete + distinct)


# ---------------------------------------------------------------- collectives


def _count(bits: Iterable[z3.BoolRef]) -> z3.ArithRef:
    return z3.Sum([z3.If(b, 1, 0) for b in bits])


def _nonempty(s: DevState) -> z3.BoolRef:
    return z3.Or(s.held)


def _union(members: Sequence[DevState]) -> tuple[tuple[z3.BoolRef, ...], ...]:
    """``has`` of the sum of ``members``."""
    k = len(members[0].held)
    return tuple(tuple(z3.Or([m.has[x][e] for m in members]) for e in range(k)) for x in range(k))


def _summable(members: Sequence[DevState]) -> z3.BoolRef:
    """Same non-empty chunks, pairwise disjoint contributors per chunk."""
    k = len(members[0].held)
    root = members[0]
    same = [m.held[x] == root.held[x] for m in members[1:] for x in range(k)]
    disjoint = [z3.AtMost(*[m.has[x][e] for m in members], 1) for x in range(k) for e in range(k)]
    return z3.And([_nonempty(root)] + same + disjoint)


def _from_has(has: Sequence[Sequence[z3.BoolRef]]) -> DevState:
    return DevState(tuple(z3.Or(row) for row in has), tuple(tuple(row) for row in has))


def _empty(k: int) -> DevState:
    false = z3.BoolVal(False)
    return DevState((false,) * k, ((false,) * k,) * k)


def _scatter(held: Sequence[z3.BoolRef], parts: int) -> tuple[z3.BoolRef, list[list[z3.BoolRef]]]:
    """Whether the held chunks split into ``parts`` equal parts, and ``keep[i][x]``:
    chunk ``x`` is held and in part ``i`` of the held chunks in increasing order."""
    k = len(held)
    total = _count(held)
    totals = {n: total == n for n in range(parts, k + 1, parts)}  # the divisible counts
    pos = [_count(held[:x]) for x in range(k)]  # place of chunk x among the held ones
    keep = [
        [
            z3.And(held[x], z3.Or([z3.And(is_n, i * (n // parts) <= pos[x], pos[x] < (i + 1) * (n // parts)) for n, is_n in totals.items()]))
            for x in range(k)
        ]
        for i in range(parts)
    ]
    return z3.Or(list(totals.values())), keep


def effects(members: Sequence[DevState]) -> dict[Collective, tuple[z3.BoolRef, list[DevState]]]:
    """For every collective on a group (root first): its precondition and the
    members' new states (meaningful only where the precondition holds)."""
    k = len(members[0].held)
    size = len(members)
    root = members[0]
    union = _union(members)
    summed = _from_has(union)
    summable = _summable(members)
    divisible, keep = _scatter(root.held, size)
    parts = [_from_has([[z3.And(keep[i][x], union[x][e]) for e in range(k)] for x in range(k)]) for i in range(size)]
    gatherable = z3.And(
        [_count(m.held) == _count(root.held) for m in members[1:]]
        + [z3.AtMost(*[m.held[x] for m in members], 1) for x in range(k)]
    )
    pairs = [(m.has[x][e], root.has[x][e]) for m in members[1:] for x in range(k) for e in range(k)]
    broadcastable = z3.And([_nonempty(root), z3.Or([a != b for a, b in pairs])] + [z3.Implies(a, b) for a, b in pairs])
    return {
        Collective.ALLREDUCE: (summable, [summed] * size),
        Collective.REDUCESCATTER: (z3.And(summable, divisible), parts),
        Collective.ALLGATHER: (gatherable, [summed] * size),
        Collective.REDUCE: (summable, [summed] + [_empty(k)] * (size - 1)),
        Collective.BROADCAST: (broadcastable, [root] * size),
    }


def _key(s: DevState) -> tuple[int, ...]:
    """Identity of a symbolic device state (z3 shares equal terms)."""
    return tuple(v.get_id() for row in s.has for v in row)


def _equal(a: DevState, b: DevState) -> z3.BoolRef:
    k = len(a.held)
    return z3.And([a.has[x][e] == b.has[x][e] for x in range(k) for e in range(k)])


def transitions(steps: Sequence[Step], op: z3.ArithRef, before: SymState, after: SymState) -> list[z3.BoolRef]:
    """Constraints making ``after`` the result of instruction ``op`` (an index into
    ``steps``, or ``len(steps)`` = stop: nothing changes) on ``before``, and
    ``op``'s precondition hold. Equal results of several instructions on a
    device are stated once, guarded by the disjunction of those instructions."""
    stop = len(steps)
    # per device: result identity -> (result, instructions yielding it)
    results: list[dict[tuple[int, ...], tuple[DevState, list[int]]]] = [
        {_key(s): (s, [stop])} for s in before
    ]
    facts = []
    cache: dict[Group, dict] = {}
    for i, step in enumerate(steps):
        new = list(before)
        for group in step.groups:
            if group not in cache:
                cache[group] = effects([before[d] for d in group])
            pre, members = cache[group][step.collective]
            facts.append(z3.Implies(op == i, pre))
            for d, s in zip(group, members):
                new[d] = s
        for d, s in enumerate(new):
            results[d].setdefault(_key(s), (s, []))[1].append(i)
    for d, by_value in enumerate(results):
        for s, ops in by_value.values():
            facts.append(z3.Implies(z3.Or([op == i for i in ops]), _equal(after[d], s)))
    changed = z3.Or([z3.Not(_equal(a, b)) for a, b in zip(after, before)])
    facts.append(z3.Implies(op != stop, changed))
    return facts


# ---------------------------------------------------------------- search


@dataclass
class Encoding:
    """A solver whose models are the valid programs of length ``1..len(ops)``."""

    solver: z3.Solver
    ops: list[z3.ArithRef]
    steps: tuple[Step, ...]

    @property
    def stop(self) -> int:
        return len(self.steps)

    def program(self, model: z3.ModelRef) -> tuple[int, ...]:
        """Instruction indices chosen by ``model``, up to the first STOP."""
        chosen = [model.eval(op, model_completion=True).as_long() for op in self.ops]
        return tuple(i for i in chosen if i != self.stop)


def encode(hierarchy: Hierarchy, goal: Goal, max_steps: int) -> Encoding:
    """Unroll the language ``max_steps`` times from the initial state of ``goal``."""
    steps = instructions(hierarchy)
    stop = len(steps)
    solver = z3.SolverFor("QF_FD")
    ops = [z3.Int(f"op_{t}") for t in range(max_steps)]
    state = initial(goal, hierarchy.k)
    for t, op in enumerate(ops):
        nxt, wellformed = _fresh(f"s{t + 1}", hierarchy.k)
        solver.add(wellformed, op >= 0, op <= stop)
        if t == 0:
            solver.add(op != stop)
        else:
            solver.add(z3.Implies(ops[t - 1] == stop, op == stop))
        solver.add(transitions(steps, op, state, nxt))
        state = nxt
    solver.add(is_goal(goal, state))
    return Encoding(solver, ops, steps)


def bounded_programs(hierarchy: Hierarchy, goal: Goal, max_steps: int) -> set[tuple[str, ...]]:
    """Every valid program of length ``1..max_steps``, as tuples of instruction texts."""
    enc = encode(hierarchy, goal, max_steps)
    found: set[tuple[str, ...]] = set()
    with z3_interrupts():  # unknown (an interrupt) is not the end: solver_check raises
        while solver_check(enc.solver) == z3.sat:
            model = enc.solver.model()
            program = enc.program(model)
            found.add(tuple(str(enc.steps[i].instruction) for i in program))
            enc.solver.add(z3.Or([op != model.eval(op, model_completion=True) for op in enc.ops]))
    return found


def is_valid(hierarchy: Hierarchy, goal: Goal, program: Sequence[str]) -> bool:
    """Whether ``program`` (one or more texts of :func:`instructions`; ValueError
    for any other text) is valid for ``goal``."""
    enc = encode(hierarchy, goal, len(program))
    index = {str(s.instruction): i for i, s in enumerate(enc.steps)}
    unknown = [text for text in program if text not in index]
    if unknown:
        raise ValueError(f"not an instruction of the bounded search: {unknown[0]}")
    enc.solver.add([op == index[text] for op, text in zip(enc.ops, program)])
    return solver_check(enc.solver) == z3.sat
