"""Placements ranked for a whole workload: every reduction of a training
step with its best predicted program (:func:`rank_placements`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

from ..cost import Model, Ranked
from ..errors import SynthError
from ..plan import Plan, PlannedProgram, PlannedReduction, one_chunk_layout
from ..planner.workload import PlacementCost, WorkloadItem, parse_workload, placement_costs
from ..synthesis.language import format_program
from ..synthesis.placement import Axis, Constraint, Placement
from ..synthesis.problem import AxesSpec, Problem, TopologySpec, make_problem
from ..synthesis.semantics import Goal
from ..synthesis.sparse import format_sparse
from ..topology import Topology
from ..units import format_seconds
from .reduction import ProgramResult
from .results import MATRIX, Column, Progress, RankedPlacement, RankedSolution, as_model
from .sparse import check_sparse_form


__all__ = ["ItemResult", "WorkloadPlacement", "WorkloadSolution", "rank_placements", "rank_problem_placements"]


@dataclass(frozen=True)
class ItemResult:
    """One workload item on one placement: the default's and the best program's
    predicted seconds (per repetition) and the best program."""

    item: WorkloadItem
    ranked: Ranked = field(repr=False)
    best: ProgramResult | None

    @property
    def default_s(self) -> float:
        return self.ranked.default_s

    @property
    def best_s(self) -> float | None:
        return self.ranked.best_s if self.ranked.order else None


@dataclass(frozen=True)
class WorkloadPlacement(RankedPlacement):
    """A placement ranked for a whole workload (its ``best_s`` is the
    workload's total with each reduction's best program)."""

    index: int  # enumeration order
    placement: Placement
    items: tuple[ItemResult, ...]  # aligned with the workload
    total_s: float  # sum of repetitions x best predicted time (inf if an item has no program)
    default_total_s: float

    @property
    def matrix(self) -> tuple[tuple[int, ...], ...]:
        return self.placement.matrix

    @property
    def best_s(self) -> float:
        return self.total_s

    def table_rows(self) -> list[tuple[str, ...]]:
        programs = " | ".join(
            f"{'+'.join(r.item.reduce_axes)}: " + (
                "-" if not r.best else format_sparse(r.best.program, " ; ") if r.item.sparse
                else format_program(r.best.program, " ; "))
            for r in self.items)
        return [(self.placement.matrix_text(), format_seconds(self.total_s), format_seconds(self.default_total_s),
                 programs)]


@dataclass(frozen=True)
class WorkloadSolution(RankedSolution):
    """:func:`rank_placements`'s answer: the placements ranked by the
    workload's total predicted time (``placements`` fastest first)."""

    COLUMNS: ClassVar[tuple[Column, ...]] = (
        MATRIX, Column("total", width=11), Column("with default", width=13),
        Column("best program per reduction", "<", gap="  "))

    topology: Topology
    axes: tuple[Axis, ...]
    workload: tuple[WorkloadItem, ...]
    model: Model
    placements: tuple[WorkloadPlacement, ...]  # fastest first
    elapsed_s: float
    verified: bool

    @property
    def by_speed(self) -> tuple[WorkloadPlacement, ...]:
        """The placements as ranked (already fastest first)."""
        return self.placements

    def plan(self, placement: int | None = None) -> Plan:
        """A plan of one placement (its ``index``; default: the best predicted)
        holding every reduction of the workload with the best predicted program
        of each of its items, each proved first. Items of one reduction (axes
        and goal) at several sizes become size ranges: the program of the item
        of ``s_i`` bytes covers ``[s_i, s_i+1)``, the smallest item's from 0 and
        the largest's unbounded; neighbouring ranges with the same program are
        one range."""
        chosen = self.placements[0] if placement is None else next(
            (c for c in self.placements if c.index == placement), None)
        if chosen is None:
            raise SynthError(f"--placement {placement}: choose 0..{len(self.placements) - 1}")
        items: dict[tuple[tuple[str, ...], Goal], list[ItemResult]] = {}
        for result in chosen.items:
            if result.best is None:
                raise SynthError(f"workload item {result.item}: placement {chosen.index} has no program within the "
                                 "step limit; raise --max-steps")
            items.setdefault((result.item.reduce_axes, result.item.goal), []).append(result)
        reductions = []
        for results in items.values():
            ranges: list[tuple[int, ItemResult]] = []  # (min_bytes, item)
            for result in sorted(results, key=lambda r: r.item.size_bytes):
                if not ranges or result.best.program != ranges[-1][1].best.program:
                    ranges.append((result.item.size_bytes if ranges else 0, result))
            programs = []
            for n, (start, result) in enumerate(ranges):
                proved = result.best.verified()  # never plan an unproved program
                stop = ranges[n + 1][0] if n + 1 < len(ranges) else None
                programs.append(PlannedProgram(proved.lowered, start, stop, proved.predicted_s,
                                               result.item.size_bytes))
            reductions.append(PlannedReduction(results[0].best.reduction, one_chunk_layout(programs)))
        return Plan(chosen.placement, tuple(reductions))


def rank_placements(
    topology: TopologySpec,
    axes: AxesSpec,
    workload: str | Sequence[WorkloadItem],
    model: Model | str | None = None,
    max_steps: int = 5,
    constraints: Sequence[Constraint | str] = (),
    verify: bool = True,
    progress: Progress | None = None,
) -> WorkloadSolution:
    """Placements ranked by the total predicted time of a workload, e.g.
    ``"dp:allreduce:1GiB,mp:allreduce:64MiB*48"`` (each reduction with its best
    predicted program; with ``verify`` those programs are proved)."""
    problem = make_problem(topology, axes, None, Goal.ALLREDUCE, constraints, max_steps)
    items = parse_workload(workload, problem.axes) if isinstance(workload, str) else tuple(workload)
    return rank_problem_placements(problem, items, as_model(model), verify, progress)


def rank_problem_placements(
    problem: Problem,
    workload: Sequence[WorkloadItem],
    model: Model,
    verify: bool = True,
    progress: Progress | None = None,
) -> WorkloadSolution:
    """:func:`rank_placements` on a checked problem (its reduction is ignored)."""
    model.profile_for(problem.topology)
    started = time.perf_counter()
    costs = placement_costs(problem.placements(), workload, problem.max_steps, model)
    elapsed_s = time.perf_counter() - started
    out = []
    for n, cost in enumerate(costs):
        if progress is not None:
            progress(f"{'verifying' if verify else 'listing'} placement {n + 1}/{len(costs)}")
        out.append(_workload_placement(cost, workload, verify))
    return WorkloadSolution(problem.topology, problem.axes, tuple(workload), model, tuple(out), elapsed_s, verify)


def _workload_placement(cost: PlacementCost, items: Sequence[WorkloadItem], verify: bool) -> WorkloadPlacement:
    results = []
    for item, ranked in zip(items, cost.items):
        best = None
        if ranked.order:
            best = ProgramResult(ranked.result.programs[ranked.order[0]], ranked.result.reduction,
                                 ranked.predicted_s[0])
            best = best.verified() if verify else best
            if verify and item.sparse:  # its sparse form too, exactly against the dense sum
                check_sparse_form(best.program, ranked.result.reduction)
        results.append(ItemResult(item, ranked, best))
    return WorkloadPlacement(cost.index, cost.placement, tuple(results), cost.total_s(items),
                             cost.default_total_s(items))

