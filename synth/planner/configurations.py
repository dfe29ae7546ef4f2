"""The job planner: axis sizes, placement and reduction programs for a whole
training step of a transformer, ranked by predicted step time.

:func:`plan_job` enumerates every assignment of sizes to the axes tp, cp, ep,
dp and pp (within the user's bounds, product = the device count) that can split
the model, every micro-batch that divides the batch, the stage layouts,
schedules and recomputation the request asks to search, and every placement of
the axes on the hierarchy; it predicts each with the step model
(:mod:`synth.planner.stepmodel`) and keeps, per (sizes, micro-batch), the
variant and placement with the shortest predicted step (that fits, first). Memory decides feasibility; configurations
that do not fit stay in the result, marked with the reason.

Every collective of a step is costed by the project's cost model
(:mod:`synth.cost`) with the best synthesized program for its axis, placement
and size (:class:`CollectiveCosts`): placement and programs change the step
time. A reduction is synthesized once per (axis rows of the matrix, goal) and
ranked once per size, and reused across micro-batches, size assignments and
placements. On a topology whose levels are all switched, the predicted cost of
a reduction over an axis depends on the matrix only through that axis's row:
two placements with the same row have reduction groups that map onto each
other by permuting siblings inside their parents, which keeps every link's
load and every group's device-id order (within a level an axis's digits are
laid out with positive strides), and the cost model sees the topology only
through those (tests check the equality). Pipeline sends are costed as a
Broadcast over each pair of adjacent stages, all pairs at once.

:meth:`JobSolution.plan` writes a configuration as a job plan (a
:class:`~synth.plan.Plan` with one reduction per reduced axis, programs by
size range, every one proved) that the runtime and the trainers accept.

Test hooks: ``_variants``, ``_schedules``, ``_placements`` and ``_evaluate``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import numpy as np

from ..cost import AllToAll, Model, Predictor, default_program, step_cost
from ..cost.alltoall import peer_seconds, program_alltoalls, program_seconds
from ..errors import SynthError
from ..plan import Plan, PlannedProgram, PlannedReduction, one_chunk_layout
from ..synthesis.alltoall import ALLTOALL, AllToAllProgram, format_alltoall, synthesize_alltoall
from ..synthesis.language import Collective, Program, format_program
from ..synthesis.lowering import LoweredProgram, lower
from ..synthesis.placement import (
    Axis,
    AxisRange,
    Placement,
    enumerate_matrices,
    parse_constraint,
    size_assignments,
    split_at_innermost_level,
)
from ..synthesis.reduction import Reduction
from ..synthesis.search import ReductionPrograms, synthesize_reduction
from ..synthesis.semantics import Goal
from ..synthesis.verify import verify_lowered
from ..topology import Device, Topology
from ..units import format_size
from .compute import ComputeModel, default_compute
from .schedules import SCHEDULE_CHOICES, Schedule, schedule_layouts, virtual_stage_choices, wanted_schedules
from .pruning import LayoutEstimates, Skipped, variant_beaten
from .stages import STAGE_CHOICES, balanced_layers
from .stepmodel import (
    HSDP_REPLICATE,
    HSDP_SHARD,
    ComputeEstimate,
    Configuration,
    Memory,
    Sharding,
    StepShape,
    StepTime,
    Training,
    bucket_sizes,
    compute_estimate,
    configuration_problem,
    memory_per_device,
    sequence_parallel,
    stage_costs,
    step_lower_bound_s,
    step_shape,
    step_time,
)
from .transformer import Recompute, Transformer

PLANNER_AXES = ("tp", "cp", "ep", "dp", "pp")
# The memory a configuration may not count on by default, as a fraction of the device's: what the model does
# not count (the CUDA context and NCCL's buffers, about a GiB or two per process; the caching allocator's
# fragmentation, a few percent of what it holds). A policy, not a fit: 4 GiB of an 80 GiB device.
DEFAULT_MARGIN_FRACTION = 0.05
Progress = Callable[[str], None]


# ---------------------------------------------------------------- collective costs


@dataclass(frozen=True)
class BestProgram:
    """The fastest predicted program of a reduction at one size."""

    seconds: float
    program: Program | None  # None: no program within the step limit
    sm_share: float = 0.0  # of each device's SMs its kernels hold while it runs (Predictor.sm_share)


class CollectiveCosts:
    """Predicted seconds of reductions and pipeline sends on placements of one
    topology under one cost model, each computed once (module docstring)."""

    def __init__(self, topology: Topology, model: Model | None = None, max_steps: int = 5) -> None:
        self.topology = topology
        self.model = model or Model()
        self.profile = self.model.profile_for(topology)
        self.max_steps = max_steps
        self.symmetric = all(level.fabric == "switch" for level in topology.levels)
        self._reductions: dict[tuple, tuple[ReductionPrograms, Predictor]] = {}
        self._best: dict[tuple, BestProgram] = {}
        self._sends: dict[tuple, float] = {}
        self._alltoalls: dict[tuple, tuple[tuple[AllToAllProgram, tuple[AllToAll, ...]], ...]] = {}
        self._best_alltoalls: dict[tuple, tuple[float, AllToAllProgram]] = {}
        self._on: dict[tuple[int, bool], PlacementCollectives] = {}  # by (placement's id, default only)
        self._defaults: dict[tuple, Predictor] = {}
        self._default_best: dict[tuple, BestProgram] = {}
        self._hsdp: dict[tuple, Placement] = {}
        self._proved: dict[tuple, LoweredProgram] = {}
        self._reduction_keys: dict[tuple[int, str], tuple] = {}  # by (placement's id, axis): _reduction_key's

    def _key(self, placement: Placement, axes: tuple[str, ...]) -> tuple:
        rows = tuple(placement.matrix[placement.axis_names.index(a)] for a in axes)
        return rows if self.symmetric else (placement.matrix, placement.axis_names, axes)

    def _reduction_key(self, placement: Placement, axis: str) -> tuple[Placement, tuple[str, ...], tuple]:
        """The placement a collective over ``axis`` runs on (:meth:`placement_for`), its axes
        (:func:`reduce_axes`) and their :meth:`_key`, each once per (placement, axis)."""
        found = self._reduction_keys.get((id(placement), axis))
        if found is None or found[0] is not placement:  # the placement is kept: its id is not reused
            on = self.placement_for(placement, axis)
            axes = reduce_axes(on, axis)
            found = self._reduction_keys[(id(placement), axis)] = (placement, on, axes, self._key(on, axes))
        return found[1:]

    @property
    def reductions_synthesized(self) -> int:
        return len(self._reductions)

    @property
    def rankings(self) -> int:
        return len(self._best)

    def hsdp(self, placement: Placement) -> Placement:
        """``placement`` with dp split into HSDP's replicate and shard axes
        (:func:`~synth.synthesis.placement.split_at_innermost_level`), the
        same devices in the same positions; each once."""
        key = ("hsdp", placement.matrix, placement.axis_names)
        found = self._hsdp.get(key)
        if found is None:
            found = self._hsdp[key] = split_at_innermost_level(placement, "dp", HSDP_REPLICATE, HSDP_SHARD)
        return found

    def placement_for(self, placement: Placement, axis: str) -> Placement:
        """The placement a reduction over ``axis`` is synthesized on: HSDP's
        sub-axes of dp live on :meth:`hsdp`'s."""
        return self.hsdp(placement) if axis in (HSDP_SHARD, HSDP_REPLICATE) else placement

    def best(self, placement: Placement, axis: str, goal: Goal, size_bytes: int) -> BestProgram:
        """The fastest program of a reduction over ``axis`` (``dp+ep``: over
        both; ``dp_shard``, ``dp_replicate``: HSDP's sub-axes of dp) on
        ``placement``."""
        placement, axes, rows = self._reduction_key(placement, axis)
        key = (rows, goal)
        found = self._reductions.get(key)
        if found is None:
            programs = synthesize_reduction(Reduction(placement, axes, goal), self.max_steps)
            found = self._reductions[key] = (programs, Predictor(programs.reduction, self.model))
        programs, predictor = found
        at = (key, size_bytes)
        best = self._best.get(at)
        if best is None:
            best = self._best[at] = _fastest(programs, predictor, size_bytes)
        return best

    def default(self, placement: Placement, axis: str, goal: Goal, size_bytes: int) -> BestProgram:
        """The library's one-call collective for the reduction over ``axis``
        (:func:`~synth.cost.predict.default_program`), priced without any
        program search: what a configuration that does not fit is priced with."""
        placement, axes, rows = self._reduction_key(placement, axis)
        key = (rows, goal)
        at = (key, size_bytes)
        found = self._default_best.get(at)  # placements of the same reduction shape share it
        if found is None:
            predictor = self._defaults.get(key)
            if predictor is None:
                predictor = self._defaults[key] = Predictor(Reduction(placement, axes, goal), self.model)
            program, loads = default_program(goal), ((predictor.reduction.k,),)
            found = self._default_best[at] = BestProgram(predictor.default(goal, size_bytes), program,
                                                         predictor.sm_share(program, loads, size_bytes))
        return found

    def send(self, placement: Placement, axis: str, size_bytes: int) -> float:
        """Every device sends ``size_bytes`` to the device of the next ``axis``
        rank (same other coordinates), all pairs at once: a Broadcast over each
        pair."""
        key = (self._reduction_key(placement, axis)[2], size_bytes)  # the rows of (axis,)
        if key not in self._sends:
            mesh = np.moveaxis(placement.mesh, placement.axis_names.index(axis), -1)
            pairs = np.stack([mesh[..., :-1], mesh[..., 1:]], axis=-1).reshape(-1, 2)
            nbytes = np.full(len(pairs), float(size_bytes))
            self._sends[key] = step_cost(self.topology, self.profile, self.model.algorithm, Collective.BROADCAST,
                                         pairs, nbytes)[0]
        return self._sends[key]

    def alltoall_programs(self, placement: Placement, axis: str) -> tuple[tuple[AllToAllProgram, tuple[AllToAll, ...]], ...]:
        """The all-to-all programs of the ``axis`` groups of ``placement``
        (:func:`~synth.synthesis.alltoall.synthesize_alltoall` on their
        hierarchy: the one-call all-to-all first, then the hierarchical ones),
        each with its priced steps (:func:`synth.cost.alltoall.program_alltoalls`)."""
        key = self._key(placement, (axis,))
        found = self._alltoalls.get(key)
        if found is None:
            groups = Reduction.of(placement, (axis,))
            peer_s = peer_seconds(self.model.algorithm)
            found = self._alltoalls[key] = tuple(
                (program, program_alltoalls(self.topology, self.profile, groups, program, peer_s))
                for program in synthesize_alltoall(groups.hierarchy, self.max_steps).programs)
        return found

    def best_alltoall(self, placement: Placement, axis: str, size_bytes: int) -> tuple[float, AllToAllProgram]:
        """The fastest predicted all-to-all program of ``size_bytes`` per device
        in every ``axis`` group at once, and its seconds (ties: the earlier,
        shorter program)."""
        key = (self._key(placement, (axis,)), size_bytes)
        found = self._best_alltoalls.get(key)
        if found is None:
            found = self._best_alltoalls[key] = min(
                ((program_seconds(steps, size_bytes), program) for program, steps in
                 self.alltoall_programs(placement, axis)), key=lambda sp: sp[0])
        return found

    def alltoall(self, placement: Placement, axis: str, size_bytes: int) -> float:
        """Seconds of :meth:`best_alltoall`."""
        return self.best_alltoall(placement, axis, size_bytes)[0]

    def default_alltoall(self, placement: Placement, axis: str, size_bytes: int) -> tuple[float, AllToAllProgram]:
        """The library's one-call all-to-all over the ``axis`` groups (the first
        synthesized program), and its seconds: what a configuration that fits on
        no placement is priced with, like its reductions (:meth:`default`)."""
        program, steps = self.alltoall_programs(placement, axis)[0]
        return program_seconds(steps, size_bytes), program

    def on(self, placement: Placement, default_only: bool = False) -> "PlacementCollectives":
        """The collectives of ``placement``, one object per placement (it
        memoises the step model's many calls at the same sizes); with
        ``default_only`` its reductions are the library's default collectives
        (:meth:`default`), not the best synthesized programs."""
        key = (id(placement), default_only)
        found = self._on.get(key)
        if found is None or found.placement is not placement:
            found = self._on[key] = PlacementCollectives(self, placement, default_only=default_only)
        return found

    def proved(self, placement: Placement, axis: str, goal: Goal, program: Program) -> LoweredProgram:
        """``program`` lowered on ``placement``'s reduction over ``axis``, proved
        (numpy reference + z3; SynthError if it fails), each once."""
        placement = self.placement_for(placement, axis)
        key = (placement.matrix, placement.axis_names, axis, goal, program)
        if key not in self._proved:
            lowered = lower(program, Reduction(placement, reduce_axes(placement, axis), goal))
            verify_lowered(lowered)
            self._proved[key] = lowered
        return self._proved[key]

    def is_proved(self, placement: Placement, axis: str, goal: Goal, program: Program) -> bool:
        placement = self.placement_for(placement, axis)
        return (placement.matrix, placement.axis_names, axis, goal, program) in self._proved


def reduce_axes(placement: Placement, axis: str) -> tuple[str, ...]:
    """The axes of a step's reduction text (``dp``, ``dp+ep``) in the
    placement's order."""
    named = axis.split("+")
    return tuple(a for a in placement.axis_names if a in named)


def _fastest(programs: ReductionPrograms, predictor: Predictor, size_bytes: int) -> BestProgram:
    """The first of the fastest programs (as :func:`synth.cost.rank` orders them:
    ties to the shorter program, then instruction order), found by a shortest
    path over the search's graph without listing the programs."""
    found = programs.best(lambda instruction, loads: predictor.step(instruction, loads, size_bytes)[0], 1)
    if not found:
        return BestProgram(math.inf, None)
    seconds, program, loads = found[0]
    return BestProgram(seconds, program, predictor.sm_share(program, loads, size_bytes))


@dataclass(frozen=True)
class PlacementCollectives:
    """:class:`~synth.planner.stepmodel.Collectives` of one placement."""

    costs: CollectiveCosts
    placement: Placement
    default_only: bool = False  # reductions priced as the library's default collective (CollectiveCosts.default)
    _seconds: dict[tuple, float] = field(default_factory=dict, compare=False, repr=False)  # reductions, sends
    step_memo: dict = field(default_factory=dict, compare=False, repr=False)  # step_time's memo for this placement

    def reduce(self, axis: str, goal: Goal, size_bytes: int) -> float:
        key = (axis, goal, size_bytes)
        seconds = self._seconds.get(key)
        if seconds is None:
            price = self.costs.default if self.default_only else self.costs.best
            seconds = self._seconds[key] = price(self.placement, axis, goal, size_bytes).seconds
        return seconds

    def sm_share(self, axis: str, goal: Goal, size_bytes: int) -> float:
        """The share of each device's SMs :meth:`reduce`'s program holds while it runs (BestProgram.sm_share)."""
        key = ("share", axis, goal, size_bytes)
        if key not in self._seconds:
            price = self.costs.default if self.default_only else self.costs.best
            self._seconds[key] = price(self.placement, axis, goal, size_bytes).sm_share
        return self._seconds[key]

    def send(self, axis: str, size_bytes: int) -> float:
        key = ("send", axis, size_bytes)
        if key not in self._seconds:
            self._seconds[key] = self.costs.send(self.placement, axis, size_bytes)
        return self._seconds[key]

    def alltoall(self, axis: str, size_bytes: int) -> float:
        price = self.costs.default_alltoall if self.default_only else self.costs.best_alltoall
        return price(self.placement, axis, size_bytes)[0]

    def size(self, axis: str) -> int:
        """The size of ``axis`` (HSDP's sub-axes of dp included)."""
        placement = self.costs.placement_for(self.placement, axis)
        return placement.axes[placement.axis_names.index(axis)].size


# ---------------------------------------------------------------- request


@dataclass(frozen=True)
class JobRequest:
    """What to plan: a topology with its device, a model, how it trains, the
    axes (names among tp, dp, pp with sizes or bounds; an axis not named has size
    1), the micro-batches to try (None: the powers of two that divide the batch),
    placement constraints, the communication and compute models, the memory
    kept free, how the layers are split over pipeline stages, the pipeline
    schedule (``search``: each of them, interleaved with every number of
    virtual stages that divides a stage's layers unless ``virtual_stages``
    fixes it) and whether to search the recomputation (``recompute_search``:
    per configuration the least recomputation that fits in memory, which is
    also the fastest; else the training's)."""

    topology: Topology
    device: Device
    model: Transformer
    training: Training
    axes: tuple[AxisRange, ...]
    micro_batches: tuple[int, ...] | None = None
    constraints: tuple[str, ...] = ()
    max_steps: int = 5
    comm: Model = field(default_factory=Model)
    compute: ComputeModel | None = None  # None: the device's shipped per-operation profile, else the curve
    memory_margin_GiB: float | None = None  # kept free on every device; None: DEFAULT_MARGIN_FRACTION of it
    stages: str = "even"  # layers per pipeline stage: even, uneven (balanced) or search (both)
    schedule: str = "1f1b"  # a Schedule's value or "search"
    virtual_stages: int | None = None  # interleaved: the virtual stages per device (None: every divisor tried)
    recompute_search: bool = False

    def __post_init__(self) -> None:
        if self.stages not in STAGE_CHOICES:
            raise SynthError(f"--stages {self.stages}: choose one of {', '.join(STAGE_CHOICES)}")
        if self.schedule not in SCHEDULE_CHOICES:
            raise SynthError(f"--schedule {self.schedule}: choose one of {', '.join(SCHEDULE_CHOICES)}")
        v = self.virtual_stages
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 2:
                raise SynthError(f"--virtual-stages {v!r}: virtual stages per device, an integer >= 2")
            if self.schedule not in ("interleaved", "search"):
                raise SynthError(f"--virtual-stages {v}: only the interleaved schedule runs virtual stages; add "
                                 "--schedule interleaved (or search)")
        if self.memory_margin_GiB is None:
            object.__setattr__(self, "memory_margin_GiB", round(DEFAULT_MARGIN_FRACTION * self.device.memory_GiB, 3))
        margin = self.memory_margin_GiB
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0 <= margin < self.device.memory_GiB:
            shown = f"{margin:g}" if isinstance(margin, (int, float)) and not isinstance(margin, bool) else repr(margin)
            raise SynthError(f"--memory-margin {shown}: GiB kept free per device, >= 0 and below the device's "
                             f"{self.device.memory_GiB:g} GiB")
        if self.compute is None:
            object.__setattr__(self, "compute", default_compute(self.device.name))
        capability = self.topology.levels[-1].compute_capability
        if self.training.fp8 and capability is not None and capability < 8.9:
            raise SynthError(f"--dtype fp8: topology '{self.topology.name}' has GPUs of compute capability "
                             f"{capability:.1f}, without FP8 tensor cores (Ada 8.9, Hopper 9.0 and newer have them); "
                             "plan with --dtype bf16")
        for a in self.axes:
            if a.name not in PLANNER_AXES:
                raise SynthError(f"--axes: unknown axis '{a.name}'; the planner's axes are tp, cp, ep, dp and pp")
        if self.micro_batches is not None:
            for b in self.micro_batches:
                if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                    raise SynthError(f"--micro-batch {b!r}: micro-batch sizes must be integers >= 1")
        # constraints name declared axes and known levels
        dummy = tuple(Axis(a.name, 1) for a in self.axes)
        for c in self.constraints:
            parse_constraint(str(c), dummy, self.topology)

    @property
    def usable_bytes(self) -> float:
        """Bytes per device a configuration may use: the device's less the margin."""
        return self.device.memory_bytes - (self.memory_margin_GiB or 0.0) * 2**30

    @property
    def recompute_text(self) -> str:
        """``--recompute`` as asked: a mode or ``search``."""
        return "search" if self.recompute_search else self.training.recompute.value

    def micro_batches_for(self, replicas: int) -> tuple[int, ...]:
        """The micro-batches to try with ``replicas`` data-parallel replicas
        (dp x ep; they divide the batch)."""
        if self.micro_batches is not None:
            return self.micro_batches
        per_replica = self.training.global_batch // replicas
        return tuple(1 << k for k in range(per_replica.bit_length()) if per_replica % (1 << k) == 0)


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class Candidate:
    """One (sizes, micro-batch) with its best placement, stage layout and
    schedule, and the training it was evaluated with (the request's, its
    recomputation chosen under ``--recompute search``): predicted step,
    memory, feasibility and the program of each reduction it uses."""

    config: Configuration
    training: Training
    placement: Placement
    step: StepTime
    memory: Memory
    feasible: bool
    reason: str
    programs: tuple[tuple[str, Goal, int, BestProgram], ...]  # (axis, goal, size, best)
    placements_tried: int
    model_flops: float  # per step, without recomputation
    hardware_flops: float  # per step, with recomputation
    alltoall_programs: tuple[tuple[str, int, AllToAllProgram], ...] = ()  # (axis, bytes, fastest program)

    @property
    def predicted_step_s(self) -> float:
        return self.step.total_s

    def tflops_per_device(self, hardware: bool = False) -> float:
        flops = self.hardware_flops if hardware else self.model_flops
        return flops / (self.step.total_s * self.config.devices) / 1e12

    def program_texts(self) -> dict[str, str]:
        """``axis`` (all-reduce), ``axis/goal`` or ``axis/alltoall`` -> program text."""
        out = {}
        for axis, goal, _, best in self.programs:
            key = axis if goal is Goal.ALLREDUCE else f"{axis}/{goal.value}"
            out[key] = format_program(best.program, " ; ") if best.program else "(none within the step limit)"
        for axis, _, program in self.alltoall_programs:
            out[f"{axis}/{ALLTOALL}"] = format_alltoall(program, " ; ")
        return out


@dataclass(frozen=True)
class JobSolution:
    """Every evaluated (sizes, micro-batch) with its best placement, feasible
    first, each group fastest first."""

    request: JobRequest
    candidates: tuple[Candidate, ...]
    assignments: int  # size assignments within the bounds
    skipped: tuple[tuple[str, int], ...]  # (reason, count) of assignments or micro-batches not evaluated
    evaluated: int  # (sizes, micro-batch, placement) triples predicted
    elapsed_s: float
    costs: CollectiveCosts = field(repr=False, compare=False)

    @property
    def feasible(self) -> tuple[Candidate, ...]:
        return tuple(c for c in self.candidates if c.feasible)

    @property
    def best(self) -> Candidate:
        if not self.feasible:
            raise SynthError(f"no configuration fits in {self.request.device.memory_GiB:g} GiB per device; the "
                             f"smallest needs {format_size(min(c.memory.total for c in self.candidates), 'GiB', 1)} "
                             "(try --sharding zero1/zero2/zero3, --recompute search, or more devices)")
        return self.feasible[0]

    def verify(self, candidate: Candidate) -> None:
        """Prove every program ``candidate`` uses (numpy reference + z3); each
        (placement, reduction, program) once."""
        for axis, goal, _, best in candidate.programs:
            if best.program is not None:
                self.costs.proved(candidate.placement, axis, goal, best.program)

    def is_verified(self, candidate: Candidate) -> bool:
        return all(self.costs.is_proved(candidate.placement, axis, goal, best.program)
                   for axis, goal, _, best in candidate.programs if best.program is not None)

    def plan(self, candidate: Candidate | None = None) -> Plan:
        """The job plan of ``candidate`` (default: the best feasible): one
        reduction per (axis, goal) the step uses, with a program per size range,
        every program proved first."""
        return job_plan(self, candidate or self.best)


# ---------------------------------------------------------------- search


def plan_job(request: JobRequest, progress: Progress | None = None) -> JobSolution:
    """Rank every configuration of ``request`` (module docstring)."""
    started = time.perf_counter()
    topology, model, training = request.topology, request.model, request.training
    costs = CollectiveCosts(topology, request.comm, request.max_steps)
    ranges = {r.name: r for r in request.axes}
    names = tuple(r.name for r in request.axes)
    assignments = size_assignments(request.axes, topology.num_devices)
    skipped = Skipped()
    layouts = LayoutEstimates(model, request.device, request.compute)  # shared by the schedules of a layout
    candidates: list[Candidate] = []
    evaluated = 0
    for n, axes in enumerate(assignments):
        if progress is not None:
            progress(f"planning: {n + 1}/{len(assignments)} size assignments, {evaluated} configurations")
        sizes = {a.name: a.size for a in axes}
        tp, cp, ep, dp, pp = (sizes.get(name, 1) for name in PLANNER_AXES)
        problem = model.parallelism_problem(tp, pp if request.stages == "even" else 1, ep, cp)
        if not problem and model.layers < pp:
            problem = f"pp={pp} is more than the model's layers ({model.layers})"
        if problem:
            skipped.add(problem)
            continue
        if training.global_batch % (dp * ep):
            skipped.add(f"--global-batch {training.global_batch} is not divisible by dp={dp}" if ep == 1 else
                        f"--global-batch {training.global_batch} is not divisible by dp x ep = {dp} x {ep}")
            continue
        placements = _placements(topology, axes, request.constraints)
        if not placements:
            skipped.add(f"no placement of {' '.join(f'{a.name}={a.size}' for a in axes)} satisfies the constraints")
            continue
        for b in request.micro_batches_for(dp * ep):
            best: Candidate | None = None
            trials = []  # the variants, by their bound: (does not fit, step with free communication)
            for config in _variants(request, Configuration(tp, dp, pp, b, ep=ep, cp=cp)):
                problem = configuration_problem(model, training, config)
                if problem:
                    skipped.add(problem)
                    continue
                trained = _training_for(request, config)
                shape, compute = layouts.of(trained, config)
                memory = memory_per_device(model, trained, config)
                trials.append((_bound(request, config, trained, shape, compute, memory), len(trials), config, trained,
                               shape, compute, memory))
            for bound, _, config, trained, shape, compute, memory in sorted(trials, key=lambda t: t[:2]):
                if best is not None and bound > (not best.feasible, best.predicted_step_s):
                    break  # no placement of this variant or of the later ones can rank before the one kept
                if best is not None and variant_beaten(best, bound[0], model, trained, config, costs, placements,
                                                       shape, compute):
                    continue  # nor can one of this variant, each collective at its cheapest placement's price
                candidate = _evaluate(request, costs, config, trained, placements, shape, compute, memory)
                evaluated += len(placements)
                if best is None or (not candidate.feasible, candidate.predicted_step_s) < (
                        not best.feasible, best.predicted_step_s):
                    best = candidate
            if best is not None:
                candidates.append(best)
    if not candidates:
        given = ",".join(str(ranges[name]) for name in names)
        hint = ("; --stages uneven lets pp not divide the layers" if request.stages == "even"
                and any("divide the model's layers" in k for k, _ in skipped.summary()) else "")
        raise SynthError(f"no configuration of --axes '{given}' on {topology.num_devices} devices can run the "
                         f"model: {skipped.examples()}{hint}")
    candidates.sort(key=lambda c: (not c.feasible, c.predicted_step_s, c.config.tp, c.config.pp, c.config.micro_batch))
    return JobSolution(request, tuple(candidates), len(assignments), skipped.summary(), evaluated,
                       time.perf_counter() - started, costs)


def _variants(request: JobRequest, config: Configuration) -> list[Configuration]:
    """The stage layouts and schedules of ``config`` (:func:`_layouts` x :func:`_schedules`)."""
    return [variant for layout in _layouts(request, config) for variant in _schedules(request, layout)]


def _layouts(request: JobRequest, config: Configuration) -> list[Configuration]:
    """The stage layouts ``--stages`` asks to evaluate for ``config``: even
    (when pp divides the layers), the balanced one, or both (search); a
    balanced layout that comes out even is the even configuration."""
    model = request.model
    if request.stages == "even":
        return [config]  # configuration_problem says why when pp does not divide the layers
    layout = balanced_layers(model.layers, config.pp,
                             stage_costs(model, request.training, config, request.compute))
    balanced = config if layout == (model.layers // config.pp,) * config.pp else replace(config, stage_layers=layout)
    if request.stages == "uneven" or model.layers % config.pp or balanced == config:
        return [balanced]
    return [config, balanced]


def _schedules(request: JobRequest, config: Configuration) -> list[Configuration]:
    """``config`` under each schedule ``--schedule`` asks for (1F1B alone without pipeline parallelism); search
    tries the virtual stages dividing the largest stage's layers (uneven: at most the smallest's; Meta ran Llama 3
    405B so), DualPipe the layouts of :func:`schedule_layouts`; ``configuration_problem`` says why one cannot run."""
    if config.pp == 1:
        return [config]
    wanted = wanted_schedules(request.schedule, request.training.recipe.name, config.pp, config.micro_batches(request.training))
    out = []
    for schedule in wanted:
        if schedule is not Schedule.INTERLEAVED:
            layouts = schedule_layouts(schedule, config.stage_layers, request.model.dense_layers)
            out += [replace(config, schedule=schedule, stage_layers=layout) for layout in layouts]
            continue
        layout = config.layers_of_stages(request.model)
        per_stage = max(layout)
        if request.virtual_stages:
            choices: tuple[int, ...] = (request.virtual_stages,)
        elif config.stage_layers:  # uneven: a virtual stage per layer of the smallest stage at most
            choices = tuple(range(2, min(layout) + 1))
        else:
            choices = virtual_stage_choices(per_stage)
        if request.schedule == "search":  # only what can run
            choices = tuple(v for v in choices if per_stage % v == 0)
        elif not choices:  # asked for: configuration_problem says why it cannot run
            choices = (2,)
        out += [replace(config, schedule=schedule, virtual_stages=v) for v in choices]
    return out


def _training_for(request: JobRequest, config: Configuration) -> Training:
    """The training ``config`` is evaluated with: the request's, or under
    ``--recompute search`` the least recomputation whose memory fits (none,
    selective, full: each adds compute, so the first that fits is the fastest;
    full when none fits)."""
    training = request.training
    if not request.recompute_search:
        return training
    usable = request.usable_bytes
    for recompute in (Recompute.NONE, Recompute.SELECTIVE):
        trial = replace(training, recompute=recompute)
        if memory_per_device(request.model, trial, config).total <= usable:
            return trial
    return replace(training, recompute=Recompute.FULL)


def _placements(topology: Topology, axes: tuple[Axis, ...], constraints: Sequence[str]) -> list[Placement]:
    """Every placement of ``axes`` under the constraints."""
    checked = [parse_constraint(str(c), axes, topology) for c in constraints]
    matrices = enumerate_matrices(topology.counts, [a.size for a in axes], checked, [a.name for a in axes],
                                  topology.level_names)
    return [Placement(topology, axes, m) for m in matrices]


def _bound(request: JobRequest, config: Configuration, training: Training, shape: StepShape,
           compute: ComputeEstimate, memory: Memory) -> tuple[bool, float]:
    """What no placement of ``config`` ranks before: (does not fit, :func:`step_lower_bound_s`);
    under HSDP, whose memory depends on the placement, taken as fitting."""
    fits = request.training.sharding is Sharding.HSDP or memory.total <= request.usable_bytes
    return not fits, step_lower_bound_s(request.model, training, config, shape, compute)


def _evaluate(request: JobRequest, costs: CollectiveCosts, config: Configuration, training: Training,
              placements: Sequence[Placement], shape: StepShape | None = None,
              compute: ComputeEstimate | None = None, memory: Memory | None = None) -> Candidate:
    model, device = request.model, request.device
    shape = shape or step_shape(model, training, config)
    compute = compute or compute_estimate(model, training, config, device, request.compute, shape)

    def timed(collectives: PlacementCollectives, data_parallel: bool = True) -> StepTime:
        return step_time(model, training, config, collectives, compute.micro_batch_s, compute.efficiency, shape,
                         compute.optimizer_s, collectives.step_memo, data_parallel, compute.accumulate_s)

    # Memory, and so feasibility, is the configuration's, except under HSDP, whose shard group (dp's split at
    # the innermost level it spans) is the placement's.
    usable = request.usable_bytes
    if training.sharding is Sharding.HSDP and config.dp > 1:
        memories = [memory_per_device(model, training, config, costs.on(p).size(HSDP_SHARD)) for p in placements]
    else:
        memories = [memory or memory_per_device(model, training, config)] * len(placements)
    fits = [m.total <= usable for m in memories]
    # A configuration that fits on no placement cannot run as planned: its reductions are priced as the
    # library's default collectives, and no program is searched for it (on large jobs most of the searches).
    default_only = not any(fits)

    # Branch and bound over the placements, feasible ones first: the step without its data-parallel term
    # bounds it from below (dp_s >= 0 and no other term depends on it), and costs no dp synthesis; a
    # placement whose (not feasible, bound) is above the best (not feasible, step) found cannot be the best.
    # In that order; ties to the enumeration order, as the plain scan over every placement would choose.
    bounds = sorted((not fits[i], timed(costs.on(p, default_only), data_parallel=False).total_s, i)
                    for i, p in enumerate(placements))
    best: tuple[bool, float, int, StepTime] | None = None
    for infeasible, bound, i in bounds:
        if best is not None and (infeasible, bound) > best[:2]:
            break
        step = timed(costs.on(placements[i], default_only))
        if best is None or (infeasible, step.total_s, i) < best[:3]:
            best = (infeasible, step.total_s, i, step)
    assert best is not None
    step, placement, memory = best[3], placements[best[2]], memories[best[2]]
    feasible = fits[best[2]]
    margin = f" - {request.memory_margin_GiB:g} GiB margin" if request.memory_margin_GiB else ""
    reason = "" if feasible else (
        f"needs {format_size(memory.total, 'GiB', 1)} per device ({memory.stage} stage: "
        f"weights {format_size(memory.weights, 'GiB', 1)}, gradients {format_size(memory.gradients, 'GiB', 1)}, "
        f"optimizer {format_size(memory.optimizer, 'GiB', 1)}, "
        f"activations {format_size(memory.activations, 'GiB', 1)}) "
        f"> {device.memory_GiB:g} GiB{margin}")
    price = costs.default if default_only else costs.best
    programs = tuple((axis, goal, size, price(placement, axis, goal, size)) for axis, goal, size in step.reductions)
    alltoall_price = costs.default_alltoall if default_only else costs.best_alltoall
    alltoalls = tuple((axis, size, alltoall_price(placement, axis, size)[1]) for axis, size in step.alltoalls)
    flops = model.training_flops(training.global_batch, training.recompute)
    return Candidate(config, training, placement, step, memory, feasible, reason, programs, len(placements),
                     flops.model, flops.total, alltoalls)


# ---------------------------------------------------------------- job plans


def job_plan(solution: JobSolution, candidate: Candidate) -> Plan:
    """A plan of ``candidate`` (see :meth:`JobSolution.plan`). Each reduction
    gets the best program at every size the step uses it at; DP reductions also
    at every bucket-grid size below the chosen bucket (a trainer's last bucket
    is smaller), with ranges split at the geometric midpoints between sizes.
    HSDP's collectives over sub-groups of dp are not in the plan (a plan's
    reductions are over whole axes; FSDP runs its own, the torchtitan export
    sets its groups); the job's ``hsdp`` says their sizes."""
    costs = solution.costs
    placement = candidate.placement
    wanted: dict[tuple[str, Goal], set[int]] = {}
    for axis, goal, size, _ in candidate.programs:
        if axis in (HSDP_SHARD, HSDP_REPLICATE):
            continue
        sizes = wanted.setdefault((axis, goal), set())
        sizes.add(size)
        if "dp" in axis.split("+") and candidate.step.bucket_bytes is not None:
            sizes.update(bucket_sizes(size))
    if not wanted:
        if candidate.training.sharding is Sharding.HSDP:
            raise SynthError(f"configuration {candidate.config.describe()} reduces over no whole axis: its only "
                             "collectives are HSDP's over sub-groups of dp, which FSDP runs itself; export the "
                             "parallelism with --sharding zero3 (torchtitan runs it as HSDP), or plan with tp > 1")
        raise SynthError(f"configuration {candidate.config.describe()} reduces over no axis (tp = dp = 1); "
                         "there is no reduction to write a plan for")
    reductions = []
    for (axis, goal), sizes in wanted.items():
        reduction = Reduction(placement, reduce_axes(placement, axis), goal)
        ordered = sorted(sizes)
        chosen = [(s, costs.best(placement, axis, goal, s)) for s in ordered]
        if any(best.program is None for _, best in chosen):
            raise SynthError(f"no program of at most {solution.request.max_steps} steps for {reduction.describe()}; "
                             "raise --max-steps")
        programs: list[PlannedProgram] = []
        for i, (size, best) in enumerate(chosen):
            if programs and programs[-1].program == best.program:
                continue  # the previous range extends over this size
            low = 0 if i == 0 else math.isqrt(ordered[i - 1] * size)
            if programs:
                programs[-1] = replace(programs[-1], max_bytes=low)
            lowered = costs.proved(placement, axis, goal, best.program)  # never plan an unproved program
            programs.append(PlannedProgram(lowered, low, None, best.seconds, size))
        reductions.append(PlannedReduction(reduction, one_chunk_layout(programs)))
    return Plan(placement, tuple(reductions), job=job_document(solution, candidate))


def job_document(solution: JobSolution, candidate: Candidate) -> dict[str, Any]:
    """The plan's informative ``job`` object."""
    request = solution.request
    config = candidate.config
    costs_on = solution.costs.on(candidate.placement)
    return {
        "planner": "synth-reduce plan",
        "model": request.model.to_dict(),
        "training": candidate.training.to_dict(),
        "sizes": config.sizes(),
        "micro_batch": config.micro_batch,
        "micro_batches": config.micro_batches(request.training),
        "sequence_parallel": sequence_parallel(request.training, config),
        "stages": "uneven" if config.stage_layers else "even",
        "stage_layers": list(config.layers_of_stages(request.model)),
        "schedule": config.schedule.value,
        "virtual_stages": config.virtual_stages,
        "pipeline_axis": "pp" if config.pp > 1 else None,
        **({"hsdp": {"replicate": costs_on.size(HSDP_REPLICATE), "shard": costs_on.size(HSDP_SHARD)}}
           if candidate.training.sharding is Sharding.HSDP and config.dp > 1 else {}),
        "bucket_bytes": candidate.step.bucket_bytes,
        "predicted_step_s": candidate.predicted_step_s,
        "breakdown_s": candidate.step.breakdown(),
        "memory_bytes_per_device": candidate.memory.to_dict(),
        "device": request.device.to_dict(),
        "compute_profile": request.compute.to_dict(),
        "cost_model": {"algo": request.comm.algorithm.value, "profile": request.comm.profile_path},
    }
