"""The public Python API: what research scripts, trainers and the command line use.

    import synth
    solution = synth.solve("p2-a100", {"dp": 4, "mp": 16}, reduce="dp")
    best = solution.best                      # the placement predicted fastest
    print(best.matrix, best.programs[0].text, best.programs[0].predicted_s)
    synth.write_plan("plan.json", solution.plan())

:func:`solve` enumerates every placement, synthesizes every program of at most
``max_steps`` steps, predicts and ranks them, and (``verify=True``) proves every
program it returns with the numpy reference and z3. :func:`rank_placements`
ranks placements for a whole workload. The numbers are those the command line
prints (``synth-reduce ... --json``), which is a thin layer over these calls.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from .collector import collector_paused
from .cost import Model, Predictor, Ranked, default_program, rank
from .errors import SynthError
from .plan import Plan, PlannedProgram, PlannedReduction, one_chunk_layout
from .planner.workload import PlacementCost, WorkloadItem, parse_workload, placement_costs
from .synthesis.language import Program, format_program
from .synthesis.lowering import LoweredProgram, LoweredStep, lower
from .synthesis.placement import (
    Axis,
    AxisRange,
    Constraint,
    Placement,
    enumerate_placements,
    parse_axis_ranges,
    size_assignments,
)
from .synthesis.problem import AxesSpec, Problem, TopologySpec, make_problem, resolve_topology
from .synthesis.reduction import Reduction
from .synthesis.search import ReductionPrograms, synthesize_reduction
from .synthesis.semantics import Goal, Hierarchy
from .synthesis.verify import Verification, verify_program
from .topology import Topology
from .units import parse_size

if TYPE_CHECKING:
    from .cost.sparse import SparseRanking, SparseSpec
    from .synthesis.alltoall import AllToAllProgram

DEFAULT_SIZE_BYTES = 256 * 2**20
Progress = Callable[[str], None]

#: programs a call may list in all (``top=None``, what ``--json`` does): listing
#: more is refused before they are enumerated (the best ones are found without)
LISTING_LIMIT = 200_000


def _model(model: Model | str | None) -> Model:
    if model is None:
        return Model()
    return model if isinstance(model, Model) else Model.load(model)


def _size_bytes(size: int | str) -> int:
    if isinstance(size, str):
        return parse_size(size)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise SynthError(f"size {size!r}: give bytes per device as an integer >= 1 or text like '256MiB'")
    return size


# ---------------------------------------------------------------- results


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
class PlacementResult:
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


@dataclass(frozen=True)
class Solution:
    """Every placement of a problem (enumeration order) with its ranked programs."""

    problem: Problem
    model: Model
    size_bytes: int
    placements: tuple[PlacementResult, ...]
    synthesis_s: float
    prediction_s: float
    verified: bool

    @property
    def by_speed(self) -> tuple[PlacementResult, ...]:
        """Placements fastest predicted first (ties: enumeration order)."""
        return tuple(sorted(self.placements, key=lambda p: (p.best_s, p.index)))

    @property
    def best(self) -> PlacementResult:
        return self.by_speed[0]

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
    return solve_problem(problem, _model(model), _size_bytes(size), verify, top, progress)


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
    if top is not None and top < 0:
        raise SynthError(f"--top {top}: must be >= 0")
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


# ---------------------------------------------------------------- axes without sizes


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
    chosen = _model(model)
    size_bytes = _size_bytes(size)
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


# ---------------------------------------------------------------- workloads


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
class WorkloadPlacement:
    """A placement ranked for a whole workload."""

    index: int  # enumeration order
    placement: Placement
    items: tuple[ItemResult, ...]  # aligned with the workload
    total_s: float  # sum of repetitions x best predicted time (inf if an item has no program)
    default_total_s: float

    @property
    def matrix(self) -> tuple[tuple[int, ...], ...]:
        return self.placement.matrix


@dataclass(frozen=True)
class WorkloadSolution:
    topology: Topology
    axes: tuple[Axis, ...]
    workload: tuple[WorkloadItem, ...]
    model: Model
    placements: tuple[WorkloadPlacement, ...]  # fastest first
    elapsed_s: float
    verified: bool

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
    return rank_problem_placements(problem, items, _model(model), verify, progress)


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
                _check_sparse_form(best.program, ranked.result.reduction)
        results.append(ItemResult(item, ranked, best))
    return WorkloadPlacement(cost.index, cost.placement, tuple(results), cost.total_s(items),
                             cost.default_total_s(items))


# ---------------------------------------------------------------- sparse all-reduce


def _check_sparse_form(program: Program, reduction: Reduction, encoding: str = "coo") -> int:
    """The sparse form of ``program`` run exactly against the dense sum on
    :data:`SPARSE_CHECKS` (entries compared; SynthError on a difference)."""
    from .synthesis.hashing import Encoding
    from .synthesis.sparse import Skew, check_sparse

    lowered = lower(program, reduction)
    return sum(check_sparse(lowered, positions, d, Skew.parse(skew), seed=s, encoding=Encoding.of(encoding),
                            sizes=reduction.hierarchy.sizes)
               for s, (positions, d, skew) in enumerate(SPARSE_CHECKS))


@dataclass(frozen=True)
class SparsePlacementResult:
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


@dataclass(frozen=True)
class SparseSolution:
    """:func:`solve_sparse`'s answer: per placement, its sparse ranking."""

    problem: Problem
    model: Model
    spec: "SparseSpec"
    placements: tuple[SparsePlacementResult, ...]
    verified: bool

    @cached_property
    def by_speed(self) -> tuple[SparsePlacementResult, ...]:
        return tuple(sorted(self.placements, key=lambda p: (p.ranking.best_s, p.index)))

    @property
    def best(self) -> SparsePlacementResult:
        return self.by_speed[0]


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
    return solve_sparse_problem(problem, _model(model), _size_bytes(size), density, encoding, verify, top,
                                value_bytes, progress)


def solve_sparse_problem(problem: Problem, model: Model, size_bytes: int, density: float, encoding: str = "coo",
                         verify: bool = True, top: int | None = 3, value_bytes: int = 4,
                         progress: Progress | None = None) -> SparseSolution:
    """:func:`solve_sparse` on a checked all-reduce :class:`~synth.synthesis.problem.Problem`."""
    from .cost.sparse import SparseSpec, rank_sparse
    from .synthesis.hashing import Encoding
    from .synthesis.sparse import check_density

    check_density(density)
    spec = SparseSpec(max(size_bytes // value_bytes, 1), density, value_bytes, Encoding.of(encoding))
    if top is not None and top < 0:
        raise SynthError(f"--top {top}: must be >= 0")
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
                checked.append(_check_sparse_form(program, result.reduction, spec.encoding.value))
        out.append(SparsePlacementResult(n, ranking, tuple(listed), tuple(checked)))
    return SparseSolution(problem, model, spec, tuple(out), verify)


# ---------------------------------------------------------------- all-to-all


@dataclass(frozen=True)
class AllToAllPlacementResult:
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


@dataclass(frozen=True)
class AllToAllSolution:
    """:func:`solve_alltoall`'s answer: per placement, its ranked all-to-all programs."""

    problem: Problem
    model: Model
    size_bytes: int
    placements: tuple[AllToAllPlacementResult, ...]
    verified: bool

    @cached_property
    def by_speed(self) -> tuple[AllToAllPlacementResult, ...]:
        return tuple(sorted(self.placements, key=lambda p: (p.best_s, p.index)))

    @property
    def best(self) -> AllToAllPlacementResult:
        return self.by_speed[0]


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
    return solve_alltoall_problem(problem, _model(model), _size_bytes(size), verify, top, progress)


def solve_alltoall_problem(problem: Problem, model: Model, size_bytes: int, verify: bool = True,
                           top: int | None = 3, progress: Progress | None = None) -> AllToAllSolution:
    """:func:`solve_alltoall` on a checked :class:`~synth.synthesis.problem.Problem`
    (its reduction axes are the all-to-all's axes; its goal is not read)."""
    from .cost.alltoall import peer_seconds, program_alltoalls, program_seconds
    from .synthesis.alltoall import check_alltoall, synthesize_alltoall

    if top is not None and top < 0:
        raise SynthError(f"--top {top}: must be >= 0")
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
