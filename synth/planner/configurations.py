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

The request is a :class:`~synth.planner.request.JobRequest`. Every
collective of a step is costed by the project's cost model with the best
synthesized program for its axis, placement and size
(:class:`~synth.planner.collectivecosts.CollectiveCosts`): placement and
programs change the step time.

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

from ..errors import SynthError
from ..plan import Plan, PlannedProgram, PlannedReduction, one_chunk_layout
from ..synthesis.alltoall import ALLTOALL, AllToAllProgram, format_alltoall
from ..synthesis.language import format_program
from ..synthesis.placement import (
    Axis,
    Placement,
    enumerate_matrices,
    parse_constraint,
    size_assignments,
)
from ..synthesis.reduction import Reduction
from ..synthesis.semantics import Goal
from ..topology import Topology
from ..units import format_size
from .activations import Recompute
from .collectivecosts import BestProgram, CollectiveCosts, PlacementCollectives, reduce_axes
from .schedules import Schedule, schedule_layouts, virtual_stage_choices, wanted_schedules
from .pruning import LayoutEstimates, Skipped, variant_beaten
from .request import PLANNER_AXES, JobRequest
from .stages import balanced_layers
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

Progress = Callable[[str], None]


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
    wanted = wanted_schedules(request.schedule, request.training.recipe.name, config.pp,
                              config.micro_batches(request.training))
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
