"""Sparse all-reduce: the dense all-reduce programs the search synthesizes,
lowered step by step to their sparse form and ranked beside the dense default
(:func:`solve_sparse`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence

from ..cost import Model, rank
from ..synthesis.language import Program
from ..synthesis.lowering import lower
from ..synthesis.placement import Constraint
from ..synthesis.problem import AxesSpec, Problem, TopologySpec, make_problem
from ..synthesis.reduction import Reduction
from ..synthesis.search import synthesize_reduction
from ..synthesis.semantics import Goal
from ..synthesis.sparse import format_sparse
from ..synthesis.verify import verify_program
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
    from ..cost.sparse import SparseRanking, SparseSpec


__all__ = ["SPARSE_CHECKS", "SparsePlacementResult", "SparseSolution", "check_sparse_form", "solve_sparse",
           "solve_sparse_problem"]


def check_sparse_form(program: Program, reduction: Reduction, encoding: str = "coo") -> int:
    """The sparse form of ``program`` run exactly against the dense sum on
    :data:`SPARSE_CHECKS` (entries compared; SynthError on a difference)."""
    from ..synthesis.hashing import Encoding
    from ..synthesis.sparse import Skew, check_sparse

    lowered = lower(program, reduction)
    return sum(check_sparse(lowered, positions, d, Skew.parse(skew), seed=s, encoding=Encoding.of(encoding),
                            sizes=reduction.hierarchy.sizes)
               for s, (positions, d, skew) in enumerate(SPARSE_CHECKS))


@dataclass(frozen=True)
class SparsePlacementResult(RankedPlacement):
    """One placement's sparse programs (:class:`~synth.cost.sparse.SparseRanking`),
    the first ``top`` of them checked exactly (``checked``: entries compared with
    the dense sum, per listed program; empty when not verified)."""

    index: int
    ranking: "SparseRanking"
    listed: tuple[Program, ...]
    checked: tuple[int, ...] = ()

    @property
    def reduction(self) -> Reduction:
        return self.ranking.reduction

    @property
    def matrix(self) -> tuple[tuple[int, ...], ...]:
        return self.reduction.placement.matrix

    @property
    def best_s(self) -> float:
        return self.ranking.best_s

    def table_rows(self) -> list[tuple[str, ...]]:
        r = self.ranking
        crossing = "> 1" if r.crossover_density is None else f"{r.crossover_density:.3g}"
        first = format_sparse(self.listed[0], " ; ") if self.listed else "(none within the step limit)"
        rows = [(self.reduction.placement.matrix_text(), format_seconds(r.dense_default_s), format_seconds(r.best_s),
                 speedup_text(r.speedup), crossing, first)]
        rows += [("", "", format_seconds(seconds), "", "", format_sparse(program, " ; "))
                 for program, seconds in zip(self.listed[1:], r.predicted_s[1:])]
        return rows


@dataclass(frozen=True)
class SparseSolution(RankedSolution):
    """:func:`solve_sparse`'s answer: per placement, its sparse ranking."""

    COLUMNS: ClassVar[tuple[Column, ...]] = (
        MATRIX, Column("dense", width=11), Column("best", width=11), Column("speedup", width=7),
        Column("crossover", width=9), Column("sparse programs, fastest first", "<", gap="  "))

    problem: Problem
    model: Model
    spec: "SparseSpec"
    placements: tuple[SparsePlacementResult, ...]
    verified: bool


#: what the sparse check runs per listed program: (positions per device, density, skew)
SPARSE_CHECKS = ((257, 0.05, "uniform"), (257, 0.3, "zipf:1.1"), (64, 1.0, "uniform"))


def solve_sparse(
    topology: TopologySpec,
    axes: AxesSpec,
    reduce: str | Sequence[str] | None = None,
    density: float = 0.01,
    size: int | str = DEFAULT_SIZE_BYTES,
    encoding: str = "coo",
    model: Model | str | None = None,
    max_steps: int = 5,
    constraints: Sequence[Constraint | str] = (),
    verify: bool = True,
    top: int | None = 3,
    value_bytes: int = 4,
    progress: Progress | None = None,
) -> SparseSolution:
    """Placements and programs of a sparse all-reduce (``density`` non-zeros per
    rank of a ``size``-byte gradient of ``value_bytes`` values), ranked by
    predicted time beside the dense default all-reduce. The programs are the
    dense all-reduce programs the search synthesizes, lowered step by step to
    their sparse form (:mod:`synth.synthesis.sparse`). With ``verify`` every
    listed program's dense form is proved (numpy + z3) and its sparse form run
    exactly against the dense sum on uniform and Zipf-skewed integer data
    (:data:`SPARSE_CHECKS`, with the chosen encoding)."""
    problem = make_problem(topology, axes, reduce, Goal.ALLREDUCE, constraints, max_steps)
    return solve_sparse_problem(problem, as_model(model), as_size_bytes(size), density, encoding, verify, top,
                                value_bytes, progress)


def solve_sparse_problem(problem: Problem, model: Model, size_bytes: int, density: float, encoding: str = "coo",
                         verify: bool = True, top: int | None = 3, value_bytes: int = 4,
                         progress: Progress | None = None) -> SparseSolution:
    """:func:`solve_sparse` on a checked all-reduce :class:`~synth.synthesis.problem.Problem`."""
    from ..cost.sparse import SparseSpec, rank_sparse
    from ..synthesis.hashing import Encoding
    from ..synthesis.sparse import check_density

    check_density(density)
    spec = SparseSpec(max(size_bytes // value_bytes, 1), density, value_bytes, Encoding.of(encoding))
    check_top(top)
    model.profile_for(problem.topology)
    out = []
    placements = problem.placements()
    for n, placement in enumerate(placements):
        if progress is not None:
            progress(f"synthesizing placement {n + 1}/{len(placements)}")
        result = synthesize_reduction(problem.reduction(placement), problem.max_steps, progress)
        dense = rank(result, spec.dense_bytes, model)
        ranking = rank_sparse(result.reduction, result.programs, spec, model, dense_best_s=dense.best_s)
        listed = ranking.programs if top is None else ranking.programs[:top]
        checked: list[int] = []
        if verify:
            for program in listed:
                verify_program(program, result.reduction)
                checked.append(check_sparse_form(program, result.reduction, spec.encoding.value))
        out.append(SparsePlacementResult(n, ranking, tuple(listed), tuple(checked)))
    return SparseSolution(problem, model, spec, tuple(out), verify)

