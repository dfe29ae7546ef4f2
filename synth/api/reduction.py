"""Reductions (all-reduce, reduce-scatter, all-gather): every placement of a
problem with its programs, ranked by predicted time (:func:`solve`).

:func:`solve` enumerates every placement, synthesizes every program of at most
``max_steps`` steps, predicts and ranks them, and (``verify=True``) proves every
program it returns with the numpy reference and z3. A placement's programs are
known fastest first up to those listed; the others are found when asked for
(:meth:`PlacementResult.program`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Sequence

import numpy as np

from ..collector import collector_paused
from ..cost import Model, Predictor, default_program, rank
from ..errors import SynthError
from ..plan import Plan
from ..synthesis.language import Program, format_program
from ..synthesis.lowering import LoweredProgram, LoweredStep, lower
from ..synthesis.placement import Constraint, Placement
from ..synthesis.problem import AxesSpec, Problem, TopologySpec, make_problem
from ..synthesis.reduction import Reduction
from ..synthesis.search import ReductionPrograms, synthesize_reduction
from ..synthesis.semantics import Goal, Hierarchy
from ..synthesis.verify import Verification, verify_program
from ..units import format_seconds
from .results import (
    DEFAULT_SIZE_BYTES,
    MATRIX,
    Column,
    Progress,
    RankedPlacement,
    RankedSolution,
    as_model,
    as_size_bytes,
    check_top,
    speedup_text,
)

__all__ = ["LISTING_LIMIT", "PlacementResult", "ProgramResult", "Ranking", "Solution", "solve", "solve_problem"]


#: programs a call may list in all (``top=None``, what ``--json`` does): listing
#: more is refused before they are enumerated (the best ones are found without)
LISTING_LIMIT = 200_000


@dataclass(frozen=True)
class ProgramResult:
    """One program of a reduction: its text, predicted time and (lazily) its
    lowered steps. ``verification`` is set when it was proved."""

    program: Program
    reduction: Reduction
    predicted_s: float
    verification: Verification | None = None
    _lowered: LoweredProgram | None = field(default=None, repr=False, compare=False)

    @property
    def text(self) -> str:
        return format_program(self.program)

    @cached_property
    def lowered(self) -> LoweredProgram:
        """The program on every reduction group at once (global device ids)."""
        return self._lowered if self._lowered is not None else lower(self.program, self.reduction)

    @property
    def steps(self) -> tuple[LoweredStep, ...]:
        return self.lowered.steps

    @property
    def is_default(self) -> bool:
        return self.program == default_program(self.reduction.goal)

    def verified(self) -> "ProgramResult":
        """This program, proved (numpy reference + z3, shared with every
        placement of the same synthesis hierarchy: :func:`synth.synthesis.verify.verify_program`);
        SynthError if it fails. Does not lower the program onto the whole system."""
        if self.verification is not None:
            return self
        return ProgramResult(self.program, self.reduction, self.predicted_s,
                             verify_program(self.program, self.reduction), self._lowered)


@dataclass(frozen=True, eq=False)
class Ranking:
    """A reduction's programs by predicted time, fastest first (ties: the
    search's order, shortest first): the first ``len(first)`` are known, the
    others are found when asked for (:meth:`upto`), by k shortest paths over
    the search's graph (:meth:`synth.synthesis.search.ReductionPrograms.best`)."""

    result: ReductionPrograms
    count: int
    default_s: float  # the library's one-call collective (0 when there is nothing to do)
    first: tuple[tuple[float, Program], ...]
    predictor: Predictor = field(repr=False)
    size_bytes: int

    @classmethod
    def of(cls, result: ReductionPrograms, size_bytes: int, model: Model, top: int | None) -> "Ranking":
        """Every program ranked (``top`` None, as :func:`synth.cost.rank` does),
        or the ``top`` fastest only; the same order either way."""
        predictor = Predictor(result.reduction, model)
        if top is None:
            ranked = rank(result, size_bytes, model)
            first = tuple((t, result.programs[i]) for i, t in zip(ranked.order, ranked.predicted_s))
            return cls(result, len(first), ranked.default_s, first, predictor, size_bytes)
        default = default_program(result.reduction.goal)
        loads = result.loads_of(default)
        default_s = predictor.program(default, loads, size_bytes) if loads is not None else 0.0
        ranking = cls(result, result.count, default_s, (), predictor, size_bytes)
        return ranking.upto(max(top, 1))  # the fastest is the placement's best time, listed or not

    def upto(self, n: int) -> "Ranking":
        """This ranking with (at least) the ``n`` fastest programs known."""
        if n <= len(self.first) or len(self.first) == self.count:
            return self
        step = self.predictor.step
        found = self.result.best(lambda instruction, loads: step(instruction, loads, self.size_bytes)[0], n)
        return Ranking(self.result, self.count, self.default_s, tuple((c, p) for c, p, _ in found), self.predictor,
                       self.size_bytes)

    @property
    def best_s(self) -> float:
        return self.first[0][0] if self.first else math.inf

    @property
    def speedup(self) -> float:
        """Default time over best time; 1 when there is nothing to do (k = 1)."""
        if not self.count:
            return 0.0
        return self.default_s / self.best_s if self.best_s > 0 else 1.0


@dataclass(frozen=True)
class PlacementResult(RankedPlacement):
    """One placement: its reduction and programs, fastest predicted first
    (``programs`` holds the listed ones; ``num_programs`` counts them all)."""

    index: int  # enumeration order: the command line's '#'
    ranking: Ranking = field(repr=False)
    programs: tuple[ProgramResult, ...]

    @property
    def reduction(self) -> Reduction:
        return self.ranking.result.reduction

    @property
    def placement(self) -> Placement:
        return self.reduction.placement

    @property
    def matrix(self) -> tuple[tuple[int, ...], ...]:
        return self.placement.matrix

    @property
    def mesh(self) -> np.ndarray:
        return self.placement.mesh

    @property
    def hierarchy(self) -> Hierarchy:
        return self.reduction.hierarchy

    @property
    def num_programs(self) -> int:
        return self.ranking.count

    @property
    def default_s(self) -> float:
        return self.ranking.default_s

    @property
    def best_s(self) -> float:
        """Predicted seconds of the fastest program (inf if none within the step limit)."""
        return self.ranking.best_s

    @property
    def speedup(self) -> float:
        return self.ranking.speedup

    def program(self, position: int) -> ProgramResult:
        """The program of predicted rank ``position`` (0 = fastest), listed or not."""
        if not 0 <= position < self.num_programs:
            raise SynthError(f"--program {position}: placement {self.index} has programs 0..{self.num_programs - 1}")
        if position < len(self.programs):
            return self.programs[position]
        seconds, program = self.ranking.upto(position + 1).first[position]
        return ProgramResult(program, self.reduction, seconds)

    def table_rows(self) -> list[tuple[str, ...]]:
        crosses = self.hierarchy.describe() if self.hierarchy.names else "(nothing: k=1)"
        first = self.programs[0] if self.programs else None
        listed = (format_program(first.program, " ; ") if first
                  else "(none within the step limit)" if not self.num_programs else "")
        best = format_seconds(self.best_s) if self.num_programs else "-"
        rows = [(self.placement.matrix_text(), crosses, str(self.num_programs), format_seconds(self.default_s), best,
                 speedup_text(self.speedup), listed)]
        rows += [("", "", "", "", format_seconds(r.predicted_s), "", format_program(r.program, " ; "))
                 for r in self.programs[1:]]
        return rows


@dataclass(frozen=True)
class Solution(RankedSolution):
    """Every placement of a problem (enumeration order) with its ranked programs."""

    COLUMNS: ClassVar[tuple[Column, ...]] = (
        MATRIX, Column("reduction crosses", "<", 22, fit=True), Column("progs", width=5),
        Column("default", width=11), Column("best", width=11), Column("speedup", width=7),
        Column("programs, fastest first", "<", gap="  "))

    problem: Problem
    model: Model
    size_bytes: int
    placements: tuple[PlacementResult, ...]
    synthesis_s: float
    prediction_s: float
    verified: bool

    def plan(self, placement: int | None = None, program: int = 0) -> Plan:
        """A plan of one placement (its ``index``; default: the best predicted)
        and its program of predicted rank ``program``, proved first."""
        index = self.best.index if placement is None else placement
        if not 0 <= index < len(self.placements):
            raise SynthError(f"--placement {index}: choose 0..{len(self.placements) - 1}")
        chosen = self.placements[index]
        if not chosen.num_programs:
            raise SynthError(
                f"--placement {index} has no program of at most {self.problem.max_steps} steps; raise --max-steps"
            )
        result = chosen.program(program).verified()  # never plan an unproved program
        return Plan.single(result.lowered, chosen.reduction, result.predicted_s, self.size_bytes)


def solve(
    topology: TopologySpec,
    axes: AxesSpec,
    reduce: str | Sequence[str] | None = None,
    goal: Goal | str = "allreduce",
    model: Model | str | None = None,
    max_steps: int = 5,
    constraints: Sequence[Constraint | str] = (),
    verify: bool = True,
    size: int | str = DEFAULT_SIZE_BYTES,
    top: int | None = None,
    progress: Progress | None = None,
) -> Solution:
    """Placements and programs of a reduction, ranked by predicted time.

    ``topology``: a :class:`Topology`, a shipped name (``"dgx-a100"``) or a YAML
    path; ``axes``: ``{"dp": 16, "mp": 8}`` (or ``"dp=16,mp=8"``), sizes
    multiplying to the device count; ``reduce``: the reduction axes (default:
    the first axis); ``goal``: ``allreduce``, ``reducescatter`` or ``allgather``;
    ``model``: a :class:`~synth.cost.Model` or an algorithm name (default: what
    NCCL chooses, the topology's numbers); ``constraints``: e.g. ``["mp@node=1"]``;
    ``size``: bytes per device the predictions are for; ``top``: programs kept
    per placement, fastest first (default: all). With ``verify`` every kept
    program is proved (numpy reference + z3). ``progress`` receives short
    status lines. Raises :class:`~synth.errors.SynthError` on bad input.
    """
    problem = make_problem(topology, axes, reduce, goal, constraints, max_steps)
    return solve_problem(problem, as_model(model), as_size_bytes(size), verify, top, progress)


def solve_problem(
    problem: Problem,
    model: Model,
    size_bytes: int,
    verify: bool = True,
    top: int | None = None,
    progress: Progress | None = None,
) -> Solution:
    """:func:`solve` on a checked :class:`~synth.synthesis.problem.Problem`
    (the cyclic garbage collector paused throughout: see :mod:`synth.collector`)."""
    check_top(top)
    with collector_paused():
        return _solve_problem(problem, model, size_bytes, verify, top, progress)


def _solve_problem(problem: Problem, model: Model, size_bytes: int, verify: bool, top: int | None,
                   progress: Progress | None) -> Solution:
    model.profile_for(problem.topology)  # a profile of another topology fails before any work
    started = time.perf_counter()
    placements = problem.placements()
    results = []
    for n, placement in enumerate(placements):
        if progress is not None:
            progress(f"synthesizing placement {n + 1}/{len(placements)}")
        results.append(synthesize_reduction(problem.reduction(placement), problem.max_steps, progress))
    synthesis_s = time.perf_counter() - started
    if top is None:
        _check_listing(results)
    started = time.perf_counter()
    rankings = [Ranking.of(r, size_bytes, model, top) for r in results]
    prediction_s = time.perf_counter() - started
    by_speed = sorted(range(len(rankings)), key=lambda i: (rankings[i].best_s, i))
    listed: dict[int, tuple[ProgramResult, ...]] = {}
    for n, i in enumerate(by_speed):
        if progress is not None:
            progress(f"{'verifying' if verify else 'listing'} placement {n + 1}/{len(by_speed)}")
        r = rankings[i]
        programs = [ProgramResult(p, r.result.reduction, t) for t, p in r.first[:len(r.first) if top is None else top]]
        listed[i] = tuple(p.verified() for p in programs) if verify else tuple(programs)
    placements_out = tuple(PlacementResult(i, r, listed[i]) for i, r in enumerate(rankings))
    return Solution(problem, model, size_bytes, placements_out, synthesis_s, prediction_s, verify)


def _check_listing(results: Sequence[ReductionPrograms]) -> None:
    """Refuse, before enumerating them, to list more than :data:`LISTING_LIMIT`
    programs in all."""
    total = sum(r.count for r in results)
    if total > LISTING_LIMIT:
        steps = max(r.search.max_steps for r in results)
        raise SynthError(
            f"listing every program means {total} programs of up to {steps} steps here (more than {LISTING_LIMIT}; "
            f"each also lowered for --json); list the best ones with --top K (found without listing the others), "
            f"or lower --max-steps")

