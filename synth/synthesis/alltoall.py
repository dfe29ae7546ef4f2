"""All-to-all: a goal whose programs are all-to-alls on sub-groups.

Goal. In a group of ``k`` devices (synthesis indices ``0..k-1``, as in
:mod:`synth.synthesis.semantics`), device ``s`` starts with ``k`` blocks, block
``(s, e)`` addressed to device ``e``. At the end device ``e`` holds the block
``(s, e)`` of every ``s`` and nothing else: what one ``ncclAllToAll`` (or
MPI_Alltoall) over the group does, ``size / k`` bytes per block.

Language. ``AllToAll(level, form)`` with the forms ``inside`` and
``parallel(ancestor)`` of the reduction language, denoting the same groups
(:func:`~synth.synthesis.semantics.groups_of`). A group varies the digits of
some levels (``(i, inside)``: the levels below ``i``; ``(i, parallel(j))``:
levels ``j+1..i``) and fixes the others. ``master`` forms are not part of this
language: a master step leaves the blocks of every other device where they are.

Step rule. In each group, a member sends every block it holds to the member
that agrees with the block's destination on the digits the group varies, and
keeps the blocks addressed to its own digits. Precondition (an equal-split
all-to-all, the call NCCL and MPI make): every member sends the same number
``c > 0`` of blocks to every other member. A step that would send unevenly or
nothing is not valid. Each member then sends ``(m - 1) / m`` of what it holds
(the whole ``size``) in a group of ``m``, so every step of a valid program is
an all-to-all of ``size`` bytes per device over its groups.

Search (:func:`synthesize_alltoall`). From the initial state, a valid step
over the levels ``V`` leaves every device holding blocks whose destination
agrees with it on ``V`` ("``V`` is settled"), and keeps every block spread
evenly over the unsettled digits; a step is valid exactly when its levels are
disjoint from the settled ones. So a state is the set of settled levels, the
goal is "all levels settled", and the programs are the sequences of groupings
whose level sets are disjoint and cover the hierarchy, in increasing length up
to the step limit (the one-call all-to-all first). This claim is tested against
the explicit rule of :func:`execute_alltoall` over every sequence of groupings
on small hierarchies (tests/synthesis/test_alltoall.py).

Proof (:func:`check_alltoall`). A program moves blocks without reading them,
so running it once with every block distinct decides it for all data:
:func:`execute_alltoall` moves explicit ``(source, destination)`` labels with
the step rule (precondition checked per group) and the result must be the
goal exactly. Every listed program is checked this way; no z3 is needed for a
permutation checked on distinct labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..caches import memoised
from ..errors import SynthError
from .language import Form
from .semantics import Hierarchy, distinct_groupings, groups_of

#: the goal's name on the command line
ALLTOALL = "alltoall"

#: the explicit check's limit: k x k labels are moved per step (4 Mi labels at most)
CHECK_LIMIT_DEVICES = 2048


@dataclass(frozen=True)
class Exchange:
    """``AllToAll(level, inside)`` or ``AllToAll(level, parallel(ancestor))``."""

    level: str
    form: Form = Form.INSIDE
    ancestor: str | None = None

    def __post_init__(self) -> None:
        if self.form is Form.MASTER:
            raise SynthError(f"AllToAll({self.level}, master(...)): an all-to-all takes inside or parallel(LEVEL), "
                             "not master (every device has blocks to send)")
        if (self.form is Form.INSIDE) != (self.ancestor is None):
            raise SynthError(f"AllToAll({self.level}, {self.form.value}): parallel needs an ancestor level, "
                             "inside takes none")

    def __str__(self) -> str:
        form = "inside" if self.form is Form.INSIDE else f"parallel({self.ancestor})"
        return f"AllToAll({self.level}, {form})"


@dataclass(frozen=True)
class AllToAllProgram:
    """A sequence of all-to-all steps (:class:`Exchange`)."""

    steps: tuple[Exchange, ...]

    def __len__(self) -> int:
        return len(self.steps)

    def __str__(self) -> str:
        return format_alltoall(self)


def format_alltoall(program: AllToAllProgram, sep: str = "\n") -> str:
    """One step per line (or joined by ``sep``); :func:`parse_alltoall` reads it back."""
    return sep.join(str(s) for s in program.steps)


_STEP = re.compile(r"\s*AllToAll\(\s*([A-Za-z_]\w*)\s*,\s*(?:(inside)|parallel\(\s*([A-Za-z_]\w*)\s*\))\s*\)\s*")


def parse_alltoall(text: str, source: str = "<all-to-all program>") -> AllToAllProgram:
    """The program of ``AllToAll(gpu, inside) ; AllToAll(node, parallel(root))``
    (steps separated by new lines or ``;``); errors name the step."""
    steps = []
    parts = [p for p in re.split(r"[;\n]", text) if p.strip()]
    if not parts:
        raise SynthError(f"{source}: an all-to-all program needs at least one AllToAll(LEVEL, FORM) step")
    for n, part in enumerate(parts, 1):
        m = _STEP.fullmatch(part)
        if m is None:
            raise SynthError(f"{source}: step {n} {part.strip()!r}: write AllToAll(LEVEL, inside) or "
                             "AllToAll(LEVEL, parallel(ANCESTOR))")
        level, inside, ancestor = m.groups()
        steps.append(Exchange(level, Form.INSIDE if inside else Form.PARALLEL, ancestor))
    return AllToAllProgram(tuple(steps))


# ---------------------------------------------------------------- groups and levels


@dataclass(frozen=True)
class ExchangeGrouping:
    """A canonical grouping of the all-to-all language on a hierarchy: the
    step that names it, the levels (digits, 0-based) its groups vary, and the
    groups (synthesis indices, members in index order)."""

    exchange: Exchange
    levels: frozenset[int]
    groups: tuple[tuple[int, ...], ...]


@memoised(maxsize=64)
def exchange_groupings(hierarchy: Hierarchy) -> tuple[ExchangeGrouping, ...]:
    """Every grouping the all-to-all language expresses on ``hierarchy`` (the
    reduction language's :func:`~synth.synthesis.semantics.distinct_groupings`
    without master forms), shallower slices first."""
    out = []
    n = hierarchy.depth
    for g in distinct_groupings(hierarchy):
        if g.form is Form.MASTER:
            continue
        if g.form is Form.INSIDE:
            levels = frozenset(range(g.level, n))
            exchange = Exchange(hierarchy.level_name(g.level))
        else:
            assert g.ancestor is not None
            levels = frozenset(range(g.ancestor, g.level))
            exchange = Exchange(hierarchy.level_name(g.level), Form.PARALLEL, hierarchy.level_name(g.ancestor))
        out.append(ExchangeGrouping(exchange, levels, g.groups))
    return tuple(out)


def resolve_exchange(step: Exchange, hierarchy: Hierarchy) -> ExchangeGrouping:
    """The canonical grouping a step denotes on ``hierarchy``; a SynthError names
    an unknown level, an ancestor that is not above the level, or a step whose
    groups have one member (it moves nothing)."""
    level = hierarchy.level_index(step.level)
    ancestor = None
    if step.ancestor is not None:
        ancestor = hierarchy.level_index(step.ancestor)
        if ancestor >= level:
            raise SynthError(f"{step}: parallel({step.ancestor}) needs a level above '{step.level}'")
    groups = groups_of(hierarchy.sizes, level, step.form, ancestor)
    if not groups:
        raise SynthError(f"{step}: its groups have one member each on {hierarchy.describe()} (nothing moves)")
    for g in exchange_groupings(hierarchy):
        if g.groups == groups:
            return g
    raise AssertionError(f"{step}: not among the hierarchy's groupings")  # pragma: no cover


# ---------------------------------------------------------------- search


@dataclass(frozen=True)
class AllToAllSynthesis:
    """The valid programs of an all-to-all on ``hierarchy``, shortest first,
    within ``max_steps`` (module docstring)."""

    hierarchy: Hierarchy
    max_steps: int
    programs: tuple[AllToAllProgram, ...]


@memoised(maxsize=64)
def synthesize_alltoall(hierarchy: Hierarchy, max_steps: int = 5) -> AllToAllSynthesis:
    """Every program of the all-to-all language on ``hierarchy`` that reaches the
    goal in at most ``max_steps`` steps, by increasing length, then in the order
    of :func:`exchange_groupings` step by step (so the one-call all-to-all comes
    first). A hierarchy of one device has the empty program only."""
    if max_steps < 1:
        raise SynthError(f"--max-steps {max_steps}: must be at least 1")
    everything = frozenset(range(hierarchy.depth))
    if not everything:
        return AllToAllSynthesis(hierarchy, max_steps, (AllToAllProgram(()),))
    groupings = exchange_groupings(hierarchy)
    found: list[tuple[int, ...]] = []

    def extend(settled: frozenset[int], path: tuple[int, ...]) -> None:
        if settled == everything:
            found.append(path)
            return
        if len(path) == max_steps:
            return
        for i, g in enumerate(groupings):
            if not (g.levels & settled):
                extend(settled | g.levels, path + (i,))

    extend(frozenset(), ())
    found.sort(key=lambda p: (len(p), p))
    programs = tuple(AllToAllProgram(tuple(groupings[i].exchange for i in p)) for p in found)
    return AllToAllSynthesis(hierarchy, max_steps, programs)


# ---------------------------------------------------------------- the explicit rule (reference)


def initial_blocks(k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(sources, destinations)``, each ``(k, k)``: device ``s`` holds ``(s, e)`` for every ``e``."""
    index = np.arange(k)
    return np.repeat(index[:, None], k, axis=1), np.repeat(index[None, :], k, axis=0)


def receivers(hierarchy: Hierarchy, members: np.ndarray, destinations: np.ndarray) -> np.ndarray:
    """For each of ``destinations`` (synthesis indices, any shape), the position
    in ``members`` (one group, synthesis indices) of the member that agrees with
    it on the digits the group varies: where the step rule sends a block."""
    sizes = tuple(hierarchy.sizes)
    member_digits = np.array(np.unravel_index(members, sizes))  # (depth, m)
    varies = np.flatnonzero((member_digits != member_digits[:, :1]).any(axis=1))
    radices = tuple(sizes[v] for v in varies)
    member_of_key = np.full(int(np.prod(radices)), -1)
    member_of_key[np.ravel_multi_index(tuple(member_digits[varies]), radices)] = np.arange(len(members))
    destination_digits = np.array(np.unravel_index(np.asarray(destinations).ravel(), sizes))
    keys = np.ravel_multi_index(tuple(destination_digits[varies]), radices)
    return member_of_key[keys].reshape(np.shape(destinations))


def exchange_step(hierarchy: Hierarchy, sources: np.ndarray, destinations: np.ndarray,
                  groups: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, np.ndarray] | str:
    """One step of the explicit rule (module docstring) on labelled blocks
    (``(k, k)``: per device, the source and destination of each block it holds),
    or the reason it is not valid. Devices outside the groups keep their blocks."""
    new_sources, new_destinations = sources.copy(), destinations.copy()
    for group in groups:
        members = np.asarray(group)
        m = len(members)
        held_dest = destinations[members]  # (m, k)
        target = receivers(hierarchy, members, held_dest)
        counts = np.bincount((np.arange(m)[:, None] * m + target).ravel(), minlength=m * m).reshape(m, m)
        off = counts[~np.eye(m, dtype=bool)]
        where = f"group {tuple(int(d) for d in members)}"
        if off.max() == 0:
            return f"{where}: members would send nothing to one another (every block is already in place)"
        if off.min() != off.max():
            return (f"{where}: members would send between {int(off.min())} and {int(off.max())} blocks to one "
                    "another, not the same number to each (an uneven all-to-all)")
        # equal sends leave every member with k blocks: sort by (receiver, destination, source), cut in m rows
        held_src, target = sources[members].ravel(), target.ravel()
        order = np.lexsort((held_src, held_dest.ravel(), target))
        new_sources[members] = held_src[order].reshape(m, -1)
        new_destinations[members] = held_dest.ravel()[order].reshape(m, -1)
    return new_sources, new_destinations


def execute_alltoall(program: AllToAllProgram, hierarchy: Hierarchy) -> tuple[np.ndarray, np.ndarray]:
    """Run ``program`` on labelled blocks from the initial state; returns the
    final ``(sources, destinations)``. A SynthError names the first invalid step."""
    if hierarchy.k > CHECK_LIMIT_DEVICES:
        raise SynthError(f"the explicit all-to-all check moves k x k labels: {hierarchy.k} devices is over its "
                         f"limit of {CHECK_LIMIT_DEVICES}; pass --no-verify")
    sources, destinations = initial_blocks(hierarchy.k)
    for n, step in enumerate(program.steps, 1):
        outcome = exchange_step(hierarchy, sources, destinations, resolve_exchange(step, hierarchy).groups)
        if isinstance(outcome, str):
            raise SynthError(f"step {n} {step}: not valid: {outcome}")
        sources, destinations = outcome
    return sources, destinations


def is_alltoall_done(sources: np.ndarray, destinations: np.ndarray) -> bool:
    """Every device ``e`` holds exactly the blocks ``(s, e)`` for ``s = 0..k-1``, in source order."""
    k = destinations.shape[0]
    index = np.arange(k)
    return bool((destinations == index[:, None]).all() and (sources == index[None, :]).all())


def check_alltoall(program: AllToAllProgram, hierarchy: Hierarchy) -> int:
    """The proof of a program (module docstring): runs it on distinct labels and
    requires the goal; returns the blocks checked (``k x k``), raises a
    SynthError naming the first device that holds a wrong block."""
    sources, destinations = execute_alltoall(program, hierarchy)
    if not is_alltoall_done(sources, destinations):
        index = np.arange(destinations.shape[0])
        wrong = int(np.flatnonzero(((destinations != index[:, None]) | (sources != index[None, :])).any(axis=1))[0])
        raise SynthError(f"{format_alltoall(program, ' ; ')}: device {wrong} does not end with one block from "
                         f"every device addressed to it")
    return int(destinations.size)

