"""Axes given without sizes (or with bounds): every assignment of sizes,
each solved as :func:`synth.api.reduction.solve` would (:func:`solve_sizes`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

from ..cost import Model
from ..errors import SynthError
from ..synthesis.language import format_program
from ..synthesis.placement import (
    Axis,
    AxisRange,
    Constraint,
    enumerate_placements,
    parse_axis_ranges,
    size_assignments,
)
from ..synthesis.problem import TopologySpec, make_problem, resolve_topology
from ..synthesis.semantics import Goal
from ..topology import Topology
from ..units import format_seconds
from .reduction import Solution, solve_problem
from .results import DEFAULT_SIZE_BYTES, Column, Progress, as_model, as_size_bytes, speedup_text


__all__ = ["SizesSolution", "solve_sizes"]


@dataclass(frozen=True)
class SizesSolution:
    """Every assignment of sizes to axes given without sizes (or with bounds),
    each solved as :func:`solve` would (``solutions`` in assignment order)."""

    topology: Topology
    axes: tuple[AxisRange, ...]
    solutions: tuple[Solution, ...]
    skipped: tuple[tuple[Axis, ...], ...]  # assignments no placement satisfies the constraints for

    @property
    def by_speed(self) -> tuple[Solution, ...]:
        """Assignments by their best placement's best predicted time (ties:
        assignment order); those whose reduction axes have size 1 (nothing to
        reduce: no answer to the question asked) last."""
        def key(i: int) -> tuple[bool, float, int]:
            best = self.solutions[i].best
            return (best.reduction.k == 1, best.best_s, i)

        order = sorted(range(len(self.solutions)), key=key)
        return tuple(self.solutions[i] for i in order)

    #: the table: the best placement of each size assignment
    COLUMNS: ClassVar[tuple[Column, ...]] = (
        Column("rank", width=4, gap=""), Column("sizes", "<", 18, gap="  "), Column("placements", width=10),
        Column("best matrix", "<", 22, fit=True, gap="  "), Column("reduction crosses", "<", 22), Column("default", width=11),
        Column("best", width=11), Column("speedup", width=7), Column("best program", "<", gap="  "))

    def table(self) -> tuple[tuple[Column, ...], list[tuple[str, ...]]]:
        """The columns and rows of the table: size assignments fastest first,
        each with its best placement and that placement's best program."""
        rows = []
        for n, s in enumerate(self.by_speed):
            best = s.best
            sizes = " ".join(f"{a.name}={a.size}" for a in s.problem.axes)
            crosses = best.hierarchy.describe() if best.hierarchy.names else "(nothing: k=1)"
            program = (format_program(best.programs[0].program, " ; ") or "(nothing to do)") if best.programs else "-"
            rows.append((str(n + 1), sizes, str(len(s.placements)), best.placement.matrix_text(), crosses,
                         format_seconds(best.default_s), format_seconds(best.best_s) if best.num_programs else "-",
                         speedup_text(best.speedup), program))
        return self.COLUMNS, rows


def solve_sizes(
    topology: TopologySpec,
    axes: str | Sequence[AxisRange],
    reduce: str | Sequence[str] | None = None,
    goal: Goal | str = "allreduce",
    model: Model | str | None = None,
    max_steps: int = 5,
    constraints: Sequence[Constraint | str] = (),
    verify: bool = True,
    size: int | str = DEFAULT_SIZE_BYTES,
    top: int | None = 1,
    progress: Progress | None = None,
) -> SizesSolution:
    """:func:`solve` for every assignment of sizes to ``axes`` given as
    ``"dp,mp"`` or ``"tp<=8,dp,pp"`` (sizes multiplying to the device count,
    within the bounds): placements and programs of each (``top`` programs kept
    per placement, default 1, the best). Assignments that no placement
    satisfies under ``constraints`` are skipped (SynthError if all are)."""
    topo = resolve_topology(topology)
    ranges = parse_axis_ranges(axes) if isinstance(axes, str) else tuple(axes)
    chosen = as_model(model)
    size_bytes = as_size_bytes(size)
    solutions, skipped = [], []
    assignments = size_assignments(ranges, topo.num_devices)
    for n, assignment in enumerate(assignments):
        if progress is not None:
            progress(f"size assignment {n + 1}/{len(assignments)}")
        problem = make_problem(topo, assignment, reduce, goal, constraints, max_steps)
        if problem.constraints and not enumerate_placements(topo, problem.axes, problem.constraints):
            skipped.append(assignment)
            continue
        solutions.append(solve_problem(problem, chosen, size_bytes, verify, top))
    if not solutions:
        given = ", ".join(str(c) for c in constraints)
        raise SynthError(f"no size assignment of --axes '{','.join(map(str, ranges))}' has a placement satisfying "
                         f"the constraints ({given}); relax or remove a --constrain")
    return SizesSolution(topo, ranges, tuple(solutions), tuple(skipped))

