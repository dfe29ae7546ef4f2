"""Prove lowered programs and plans: two independent checks, shared.

* the numpy reference (:func:`synth.synthesis.execute.check_numerically`): run the program
  on random integer data and compare every output with the direct reduction;
* z3 (:func:`synth.synthesis.prove.prove`): the outputs equal the reduction for all
  integer inputs.

Reduction groups never exchange data (every group of a step lies inside one
of them, checked by :func:`~synth.synthesis.lowering.check_structure`), so a lowered
program is correct exactly when the program each reduction group runs, in its
own rank coordinates, is. Those programs are normally one and the same, so
each distinct one is verified once, and the results are memoised:

* :func:`verify_lowered` (plans, ``check``, ``bench``): the structure of the
  whole lowered program, then both checks on each distinct reduction-group
  program;
* :func:`verify_program` (what :func:`synth.solve` uses for the programs it
  lists): the z3 proof once per (synthesis hierarchy sizes, goal, program) on
  the synthesis-level program (:func:`~synth.synthesis.lowering.synthesis_program`),
  shared by every placement, workload item and planner configuration with that
  hierarchy; per placement, the structure of its group tables (the relabelling
  that lowering applies: :func:`check_tables`) and the numpy check of its
  reduction group 0 (:func:`~synth.synthesis.lowering.group_runs`).

Where a check does not fit its budget the scope it covered is reported (a
sample of the chunks for numpy, skipped for z3 beyond ``k = 128``), never an
error after the work.

A plan's stored steps are already checked against the derivation of its
programs when it is loaded (:func:`synth.plan.load_plan`);
:func:`synth.plan.verify_plan`, beside the plan, proves every program of it
with :func:`verify_lowered` (this stage knows nothing of plans).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ..errors import SynthError
from . import execute
from . import prove as prove_module
from .execute import check_numerically, check_runs, numeric_scope
from .language import Program
from .lowering import (
    LoweredProgram,
    LoweredStep,
    check_structure,
    group_runs,
    synthesis_program,
    trace,
)
from .prove import Proof, prove
from .reduction import Reduction

@dataclass(frozen=True)
class Verification:
    """What was checked: ``elements_checked`` output elements by the numpy
    reference over ``numpy_scope``, and the z3 ``proof`` (its ``scope`` says
    what it covered)."""

    elements_checked: int
    proof: Proof
    numpy_scope: str = "whole system"


# ---------------------------------------------------------------- memo

T = TypeVar("T")


class _Memo:
    """A bounded memo (least recently used out) of verification results."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[Hashable, object] = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        if key in self._data:
            self._data.move_to_end(key)
            return self._data[key]  # type: ignore[return-value]
        value = self._data[key] = compute()
        if len(self._data) > self.size:
            self._data.popitem(last=False)
        return value

    def clear(self) -> None:
        self._data.clear()


_GROUP_PROGRAMS = _Memo(4096)  # reduction-group program -> (elements, proof, numpy scope)
_PROOFS = _Memo(4096)  # (sizes, goal, program structure) -> Proof
_NUMERIC = _Memo(4096)  # (sizes, goal, program structure, sigma) -> (elements, numpy scope)
_TABLES = _Memo(1024)  # (placement, axes) -> None: the tables were checked


def clear_cache() -> None:
    """Forget every memoised verification (for benchmarks that time cold runs)."""
    for memo in (_GROUP_PROGRAMS, _PROOFS, _NUMERIC, _TABLES):
        memo.clear()


def _budgets() -> tuple[int, int]:
    """The verifiers' budgets, part of every memo key (what fits decides the scope)."""
    return execute.LIMIT, prove_module.LIMIT


def _refuted(proof: Proof) -> None:
    if not proof.proved and not proof.skipped:
        raise SynthError(f"z3 refutes the program: {proof.counterexample}")


def _shared(scope: str, groups: int, distinct: int = 1) -> str:
    """The scope of a check made on a reduction group's program (``scope`` as
    :func:`~synth.synthesis.prove.prove` or :func:`~synth.synthesis.execute.numeric_scope` gives it
    for that one group), for a program on ``groups`` groups running
    ``distinct`` different programs."""
    if groups == 1 or scope.startswith("skipped"):
        return scope
    one = f"reduction group 0 of {groups}"
    if "," in scope:  # a sample of the group's chunks: "the reduction group, 128 of its 32768 chunks ..."
        one += scope[scope.index(","):]
    if distinct == 1:
        return f"{one}; the others run the same program (checked)"
    return f"one reduction group per different program ({distinct} of {groups} groups)"


# ---------------------------------------------------------------- any lowered program


def group_programs(lowered: LoweredProgram) -> dict[LoweredProgram, list[int]]:
    """The program each reduction group runs, its devices renumbered by rank
    (device ``r`` = the member of rank ``r``), mapped to the reduction groups
    that run it. Needs :func:`~synth.synthesis.lowering.check_structure` to have passed."""
    k = lowered.num_chunks
    rows = np.asarray(lowered.reduction_groups, dtype=np.int64).reshape(-1, k)
    group_of = np.empty(lowered.num_devices, dtype=np.int64)
    group_of[rows] = np.arange(len(rows))[:, None]
    rank_of = np.empty(lowered.num_devices, dtype=np.int64)
    rank_of[rows] = np.arange(k)[None, :]
    per_row: list[list[list[tuple[tuple[int, ...], tuple[int, ...]]]]] = [
        [[] for _ in lowered.steps] for _ in range(len(rows))]
    for s, step in enumerate(lowered.steps):
        if not step.groups:
            continue
        heads = group_of[[g[0] for g in step.groups]].tolist()
        for head, group, chunks in zip(heads, step.groups, step.chunks):
            per_row[head][s].append((tuple(rank_of[list(group)].tolist()), chunks))
    out: dict[LoweredProgram, list[int]] = {}
    for g, steps in enumerate(per_row):
        relabelled = tuple(
            LoweredStep(step.instruction, tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))
            for step, pairs in zip(lowered.steps, (sorted(x) for x in steps)))
        program = LoweredProgram(lowered.program, lowered.goal, k, k, (tuple(range(k)),), lowered.chunk_of_rank,
                                 relabelled)
        out.setdefault(program, []).append(g)
    return out


def _verify_group(program: LoweredProgram) -> tuple[int, Proof, str]:
    elements = check_numerically(program)
    proof = prove(program)
    _refuted(proof)
    return elements, proof, numeric_scope(program.num_devices, program.num_chunks, 1)[0]


def verify_lowered(lowered: LoweredProgram) -> Verification:
    """Both independent checks; SynthError if either fails or the program is
    malformed. A z3 proof skipped for size (``proof.skipped``) is not a
    failure; callers report its scope."""
    check_structure(lowered)
    programs = group_programs(lowered)
    groups, distinct = len(lowered.reduction_groups), len(programs)
    results = [_GROUP_PROGRAMS.get((p, _budgets()), lambda p=p: _verify_group(p)) for p in programs]
    elements = sum(r[0] for r in results)
    proof = results[0][1]
    proof = Proof(proof.proved, _shared(proof.scope, groups, distinct), sum(r[1].obligations for r in results))
    return Verification(elements, proof, _shared(results[0][2], groups, distinct))


# ---------------------------------------------------------------- synthesized programs


def check_tables(reduction: Reduction) -> None:
    """SynthError unless the tables that :func:`~synth.synthesis.lowering.lower` relabels
    through are consistent: ``synthesis_groups`` and ``reduction_groups`` hold
    every device once, row ``g`` of both holds the same devices, and
    ``synthesis_groups[:, sigma[r]] == reduction_groups[:, r]``. Then the
    lowered program is the traced program on every reduction group, disjoint
    groups inside each."""
    def check() -> None:
        by_index, by_rank = reduction.synthesis_groups, reduction.reduction_groups
        n, k = reduction.topology.num_devices, reduction.k
        sigma = np.asarray(reduction.rank_to_synthesis_index)
        if by_index.shape != (n // k, k) or by_rank.shape != by_index.shape:
            raise SynthError(f"{reduction.describe()}: group tables of the wrong shape")
        if not (np.bincount(by_index.ravel(), minlength=n) == 1).all():
            raise SynthError(f"{reduction.describe()}: the synthesis groups do not hold every device once")
        if sorted(sigma.tolist()) != list(range(k)) or not (by_index[:, sigma] == by_rank).all():
            raise SynthError(f"{reduction.describe()}: the rank and synthesis tables disagree")
    _TABLES.get((reduction.placement, reduction.axes), check)


def _structure(program: Program, reduction: Reduction) -> tuple:
    """What makes two programs on hierarchies of the same sizes the same
    program, whatever the level names: per instruction the collective and the
    level indices."""
    h = reduction.hierarchy
    return tuple((i.collective, h.level_index(i.level), i.form,
                  None if i.ancestor is None else h.level_index(i.ancestor)) for i in program.instructions)


def verify_program(program: Program, reduction: Reduction) -> Verification:
    """Verify ``program`` on ``reduction`` (a program the search found, or any
    valid one) without lowering it onto the whole system: the z3 proof of the
    synthesis-level program (memoised per hierarchy sizes, goal and program),
    the relabelling tables of the placement (:func:`check_tables`), and the
    numpy reference on the placement's reduction group 0 in rank coordinates
    (memoised per program and rank-to-synthesis-index map). SynthError if the
    program is not valid or a check fails."""
    hierarchy, goal = reduction.hierarchy, reduction.goal
    structure = _structure(program, reduction)
    key = (hierarchy.sizes, goal, structure, _budgets())

    def proof() -> Proof:
        too_large = prove_module.skipped(hierarchy.k)
        if too_large is not None:
            trace(program, hierarchy, goal)  # still valid on the hierarchy (SynthError if not)
            return too_large
        canonical = synthesis_program(trace(program, hierarchy, goal))
        check_structure(canonical)
        result = prove(canonical)
        _refuted(result)
        return result

    def numeric() -> tuple[int, str]:
        chunk_of_rank, steps = group_runs(program, reduction)
        k = reduction.k
        scope, chunks = numeric_scope(k, k, 1)
        return check_runs(goal, np.arange(k)[None, :], chunk_of_rank, steps, chunks), scope

    check_tables(reduction)
    groups = len(reduction.synthesis_groups)
    found = _PROOFS.get(key, proof)
    elements, scope = _NUMERIC.get(key + (reduction.rank_to_synthesis_index,), numeric)
    shared = Proof(found.proved, _shared(found.scope, groups), found.obligations, found.counterexample)
    return Verification(elements, shared, _shared(scope, groups))
