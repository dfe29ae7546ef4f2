"""All-to-all: the one-call all-to-all and its hierarchical decompositions
on every placement, ranked by predicted time (:func:`solve_alltoall`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

from ..cost import Model
from ..synthesis.alltoall import format_alltoall
from ..synthesis.placement import Constraint
from ..synthesis.problem import AxesSpec, Problem, TopologySpec, make_problem
from ..synthesis.reduction import Reduction
from ..synthesis.semantics import Goal
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

if TYPE_CHECKING:
    from ..synthesis.alltoall import AllToAllProgram


__all__ = ["AllToAllPlacementResult", "AllToAllSolution", "solve_alltoall", "solve_alltoall_problem"]


@dataclass(frozen=True)
class AllToAllPlacementResult(RankedPlacement):
    """One placement's all-to-all programs over the problem's axes, fastest
    predicted first (``listed``: the first ``top`` of them), the one-call
    all-to-all's time (``direct_s``), and per listed program the blocks its
    proof checked (:func:`~synth.synthesis.alltoall.check_alltoall`; empty when
    not verified)."""

    index: int
    groups: Reduction  # the all-to-all's groups, as a reduction over its axes (tables only)
    listed: tuple["AllToAllProgram", ...]
    predicted_s: tuple[float, ...]
    direct_s: float
    programs_found: int
    checked: tuple[int, ...] = ()

    @property
    def best_s(self) -> float:
        return self.predicted_s[0] if self.predicted_s else self.direct_s

    @property
    def speedup(self) -> float:
        """The one-call all-to-all's time over the best program's (1 when both are 0)."""
        return self.direct_s / self.best_s if self.best_s > 0 else 1.0

    @property
    def matrix(self) -> tuple[tuple[int, ...], ...]:
        return self.groups.placement.matrix

    def table_rows(self) -> list[tuple[str, ...]]:
        first = format_alltoall(self.listed[0], " ; ") if self.listed else "-"
        rows = [(self.groups.placement.matrix_text(), format_seconds(self.direct_s), format_seconds(self.best_s),
                 speedup_text(self.speedup), first)]
        rows += [("", "", format_seconds(seconds), "", format_alltoall(program, " ; "))
                 for program, seconds in zip(self.listed[1:], self.predicted_s[1:])]
        return rows


@dataclass(frozen=True)
class AllToAllSolution(RankedSolution):
    """:func:`solve_alltoall`'s answer: per placement, its ranked all-to-all programs."""

    COLUMNS: ClassVar[tuple[Column, ...]] = (
        MATRIX, Column("direct", width=11), Column("best", width=11), Column("speedup", width=7),
        Column("programs, fastest first", "<", gap="  "))

    problem: Problem
    model: Model
    size_bytes: int
    placements: tuple[AllToAllPlacementResult, ...]
    verified: bool


def solve_alltoall(
    topology: TopologySpec,
    axes: AxesSpec,
    over: str | Sequence[str] | None = None,
    size: int | str = DEFAULT_SIZE_BYTES,
    model: Model | str | None = None,
    max_steps: int = 5,
    constraints: Sequence[Constraint | str] = (),
    verify: bool = True,
    top: int | None = 3,
    progress: Progress | None = None,
) -> AllToAllSolution:
    """Placements and programs of an all-to-all of ``size`` bytes per device
    over the axes ``over`` (default: the first axis), ranked by predicted time
    beside the one-call all-to-all: the one call first, then the hierarchical
    decompositions (inside the node, then across, ...) of
    :mod:`synth.synthesis.alltoall`, priced by :mod:`synth.cost.alltoall`.
    With ``verify`` every listed program is proved by running it on distinct
    block labels."""
    problem = make_problem(topology, axes, over, Goal.ALLREDUCE, constraints, max_steps)
    return solve_alltoall_problem(problem, as_model(model), as_size_bytes(size), verify, top, progress)


def solve_alltoall_problem(problem: Problem, model: Model, size_bytes: int, verify: bool = True,
                           top: int | None = 3, progress: Progress | None = None) -> AllToAllSolution:
    """:func:`solve_alltoall` on a checked :class:`~synth.synthesis.problem.Problem`
    (its reduction axes are the all-to-all's axes; its goal is not read)."""
    from ..cost.alltoall import peer_seconds, program_alltoalls, program_seconds
    from ..synthesis.alltoall import check_alltoall, synthesize_alltoall

    check_top(top)
    profile = model.profile_for(problem.topology)
    peer_s = peer_seconds(model.algorithm)
    out = []
    placements = problem.placements()
    for n, placement in enumerate(placements):
        if progress is not None:
            progress(f"pricing all-to-all programs of placement {n + 1}/{len(placements)}")
        groups = problem.reduction(placement)
        programs = synthesize_alltoall(groups.hierarchy, problem.max_steps).programs
        seconds = [program_seconds(program_alltoalls(problem.topology, profile, groups, p, peer_s), size_bytes)
                   for p in programs]
        order = sorted(range(len(programs)), key=lambda i: (seconds[i], i))
        listed = order if top is None else order[:top]
        checked = tuple(check_alltoall(programs[i], groups.hierarchy) for i in listed) if verify else ()
        out.append(AllToAllPlacementResult(n, groups, tuple(programs[i] for i in listed),
                                           tuple(seconds[i] for i in listed), seconds[0], len(programs), checked))
    return AllToAllSolution(problem, model, size_bytes, tuple(out), verify)

