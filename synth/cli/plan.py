"""``synth-reduce plan``: the job planner. Axis sizes, placement and reduction
programs for a whole training step of a transformer, ranked by predicted step
time, as a table or JSON, and the best configuration as a job plan (``--out``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Sequence

from ..documents import check_writable
from ..errors import SynthError
from ..plan import write_plan
from ..planner.activations import Recompute
from ..planner.compute import DEFAULT_COMPUTE, ComputeModel
from ..planner.frameworks import FRAMEWORK_CHOICES, framework_of
from ..planner.operations import OperationProfile
from ..planner.schedules import SCHEDULE_CHOICES
from ..planner.configurations import Candidate, JobSolution, plan_job
from ..planner.request import JobRequest
from ..planner.stages import describe_layers
from ..planner.stepmodel import Sharding, Training, sequence_parallel
from ..planner.training import CP_COMMS, CROSS_ENTROPY_BYTES
from ..planner.modelspec import load_model
from ..synthesis.placement import parse_axis_ranges
from ..synthesis.problem import MAX_STEPS_DEFAULT
from ..topology import load_topology, parse_device, parse_scale
from ..units import MAX_COUNT, bounded_int, format_seconds, format_size
from .args import Parser, add_model_arguments, compute_profile_argument, model_of
from .plan_plot import plot_plan, pyplot


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="synth-reduce plan", description=(
        "Plan a transformer's training step: every assignment of sizes to tp, cp, ep, dp and pp, every "
        "micro-batch, schedule and stage layout, and every placement, ranked by predicted step time (compute, "
        "pipeline bubble, tensor, context, expert, pipeline and data-parallel communication with the best verified "
        "program per axis), with memory per device."))
    p.add_argument("--topology", required=True, help="topology YAML file, or a shipped name (e.g. dgx-a100)")
    p.add_argument("--scale", default="", metavar="LEVEL=COUNT", help="override level counts, e.g. node=64")
    p.add_argument("--model", required=True,
                   help="a shipped model (e.g. gpt3-175b, llama2-70b), a YAML file, or inline fields "
                        "layers=30,hidden=3072,heads=32,seq=2048,vocab=51200 (ffn defaults to 4 x hidden)")
    p.add_argument("--global-batch", type=lambda text: bounded_int(text, "--global-batch", MAX_COUNT), required=True,
                   metavar="B", help="sequences per training step")
    p.add_argument("--micro-batch", metavar="B1,B2,...",
                   help="micro-batch sizes to try (default: the powers of two that divide the batch per replica)")
    p.add_argument("--axes", default=None,
                   help="axes among tp, cp, ep, dp, pp, with sizes or bounds: 'tp<=8,dp,pp', 'tp=8,cp=2,dp,pp' "
                        "(an axis left out has size 1; default tp,dp,pp, and tp,ep,dp,pp for a model with experts)")
    p.add_argument("--constrain", action="append", default=[], metavar="AXIS@LEVEL{=,>=,<=}N",
                   help="constrain placements, e.g. tp@node=1; repeatable")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32", "fp8"),
                   help="training dtype (default bf16); fp8: BF16 training whose layers' GEMMs run in FP8 "
                        "(Transformer Engine, torchtitan's float8: row-wise scaled; --framework deepseek: "
                        "DeepSeek-V3's tile- and block-scaled FP8 with FP8 dispatch), on GPUs of compute "
                        "capability 8.9 or more")
    p.add_argument("--sharding", default="none", help="sharding over dp: none (default), zero1 (optimizer states), zero2 (and gradients, "
                        "reduce-scattered every micro-batch), zero3 (fsdp: and weights), hsdp (zero3 inside dp's "
                        "group at the innermost level it spans, replicated across)")
    p.add_argument("--recompute", default="none",
                   help="activation recomputation: none (default), selective, full, or search (per configuration "
                        "the least that fits in memory, which is the fastest); recompute in --json")
    p.add_argument("--memory-margin", type=_gib_amount, default=None, metavar="GiB",
                   help="memory kept free on every device for the framework, CUDA context and fragmentation "
                        "(default 5%% of the device's: 4 GiB of 80; 0 counts the weights, gradients, optimizer "
                        "states and activations only)")
    p.add_argument("--attention", default="flash", choices=("flash", "unfused"),
                   help="the attention kernel: flash stores no s x s scores (default); unfused stores them (5 a s^2 b "
                        "bytes per layer and micro-batch without recomputation) and adds its softmax and dropout "
                        "passes (at the device's memory_bandwidth_GBps with the efficiency curve)")
    p.add_argument("--cross-entropy", default=None, choices=tuple(CROSS_ENTROPY_BYTES),
                   help="the loss, for memory: fused keeps the fp32 logits, 4 s b V / tp bytes (Megatron-LM's "
                        "vocabulary-parallel cross-entropy; megatron's default); eager is F.cross_entropy on "
                        "logits.float() (torchtitan, plain PyTorch loops; their default): 14 s b V / tp at the start "
                        "of the backward; megatron is Megatron-LM's unfused vocabulary-parallel cross-entropy (without "
                        "--cross-entropy-loss-fusion): fused's memory, 38 bytes per logit forward where fused moves 14")
    p.add_argument("--framework", default="megatron", choices=FRAMEWORK_CHOICES,
                   help="the training framework, for the states it holds and what its step does outside the layers "
                        "(docs/planner.md, 'Frameworks'): megatron (default: bf16 weights, fp32 main gradients), "
                        "torchtitan (FSDP2, fp32 sharded states, operator-level selective recomputation), eager "
                        "(fp32 weights under bf16 autocast), eager-master (bf16 weights, an fp32 master copy), deepseek "
                        "(DeepSeek-V3's: BF16 Adam moments, FP8 activation caches, RMSNorm recomputed, block-scaled FP8)")
    p.add_argument("--sequence-parallel", choices=("on", "off"), default="on",
                   help="Megatron-LM's sequence parallelism where tp > 1 (default on): norms, residuals and their "
                        "activations split over the tensor-parallel group, each tp all-reduce an all-gather and a "
                        "reduce-scatter")
    p.add_argument("--tp-overlap", action="store_true",
                   help="overlap the tensor-parallel all-gathers and reduce-scatters with their GEMMs (Megatron-LM's "
                        "--tp-comm-overlap; needs sequence parallelism): each shows only what its GEMM cannot hide, "
                        "at least one of tp chunks; tp_overlap in --json")
    p.add_argument("--overlap-param-gather", action="store_true",
                   help="with --sharding zero1 or zero2, all-gather the updated weights bucket by bucket beside the "
                        "next step's first forward (Megatron-LM's --overlap-param-gather) instead of after the step")
    p.add_argument("--ep-overlap", action="store_true",
                   help="run each MoE layer's all-to-alls beside another micro-batch's computation of that layer "
                        "(DeepSeek-V3's DualPipe): only what outlasts it shows, and the computation beside them runs "
                        "on the 112 of 132 SMs they leave")
    p.add_argument("--cp-comm", choices=CP_COMMS, default="ring",
                   help="how context parallelism exchanges keys and values: ring (Megatron-LM's, default: cp - 1 "
                        "sends per layer and pass, each beside the attention it feeds) or allgather (Llama 3's: "
                        "the whole sequence's keys and values gathered before the attention and their gradients "
                        "reduce-scattered after it, on the critical path)")
    p.add_argument("--stages", choices=("even", "uneven", "search"), default="even",
                   help="layers per pipeline stage: even (pp divides the layers; default), uneven (first and last "
                        "stage counts chosen so the slowest stage, with the embedding and the loss, is fastest; pp "
                        "need not divide the layers) or search (both, the faster kept); stage_layers in --json")
    p.add_argument("--schedule", choices=SCHEDULE_CHOICES, default="1f1b",
                   help="pipeline schedule: 1f1b (default), interleaved (virtual stages per device; every count "
                        "dividing a stage's layers unless --virtual-stages), zero-bubble (ZB-H1: weight gradients "
                        "fill the bubble), dualpipe (DeepSeek-V3's DualPipe: each rank runs stages i and pp-1-i, "
                        "half the micro-batches from each end; even pp, even micro-batches >= 2 pp) or search "
                        "(each, the fastest kept; dualpipe only with --framework deepseek); schedule and "
                        "virtual_stages in --json")
    p.add_argument("--virtual-stages", type=lambda text: bounded_int(text, "--virtual-stages", MAX_COUNT),
                   metavar="V", help="virtual pipeline stages per device for the interleaved schedule (>= 2)")
    p.add_argument("--no-overlap", action="store_true",
                   help="data-parallel reductions after the backward pass instead of overlapped with it")
    p.add_argument("--device", metavar="memory_GiB=M,peak_TFLOPs=P",
                   help="the device's memory and dense peak, optionally name=N and memory_bandwidth_GBps=G (HBM, "
                        "for --attention unfused with the efficiency curve) (default: the topology's 'device')")
    p.add_argument("--compute-profile", metavar="COMPUTE.json",
                   help="compute profile: per-operation (version 2: synth-reduce calibrate) or the efficiency curve "
                        "(version 1: synth-reduce fit on step records), or a shipped one by name (h100-sxm5-80gb); "
                        "default: the shipped per-operation profile of the device (profiles/), else the curve "
                        "fitted on A100 steps")
    add_model_arguments(p)
    p.add_argument("--max-steps", type=int, default=MAX_STEPS_DEFAULT, help="longest reduction program searched")
    p.add_argument("--top", type=int, default=10, metavar="K",
                   help="configurations listed in the table (their programs are proved), default 10")
    p.add_argument("--json", action="store_true", help="print one JSON document with every configuration")
    p.add_argument("--out", metavar="JOB.json", help="write the best feasible configuration as a job plan")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw the listed configurations' predicted step time by term beside their memory per device "
                        "against the device's capacity (matplotlib: the plots extra)")
    p.add_argument("--no-verify", action="store_true", help="do not prove the listed configurations' programs")
    return p


class _Progress:
    """Progress lines on stderr (also when it is not a terminal), once work has
    run for a second and then at most once a second, so quick runs (and their
    one-line errors) stay quiet."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.last = self.started
        self.shown = False

    def __call__(self, message: str) -> None:
        now = time.perf_counter()
        if now - self.last < 1.0:
            return
        self.last, self.shown = now, True
        tty = sys.stderr.isatty()
        print(f"\r{message}\033[K" if tty else message, end="" if tty else "\n", file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.shown and sys.stderr.isatty():
            print("\r\033[K", end="", file=sys.stderr, flush=True)


def _micro_batches(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    out = []
    for item in (s.strip() for s in text.split(",")):
        if not (item.isascii() and item.isdigit()) or not item.strip("0"):  # digits only, not all zeros
            raise SynthError(f"--micro-batch '{item}': give micro-batch sizes as integers >= 1, e.g. 1,2,4,8")
        out.append(bounded_int(item, "--micro-batch", MAX_COUNT))
    return tuple(out)


def _gib_amount(text: str) -> float:
    """A number of GiB (``4``, ``2.5``); SynthError otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise SynthError(f"--memory-margin {text!r}: a number of GiB, e.g. 4") from None
    if not value >= 0 or value != value or value == float("inf"):
        raise SynthError(f"--memory-margin {text}: a number of GiB >= 0")
    return value


def request_of(args: argparse.Namespace) -> JobRequest:
    """The request the arguments describe; SynthError naming the bad one."""
    topology = load_topology(args.topology)
    if args.scale:
        topology = topology.scaled(parse_scale(args.scale))
    device = parse_device(args.device) if args.device else topology.device
    if device is None:
        raise SynthError(f"topology '{topology.name}' has no 'device' (memory_GiB, peak_TFLOPs): add one to the "
                         "topology file or pass --device memory_GiB=M,peak_TFLOPs=P")
    model = load_model(args.model)
    search_recompute = args.recompute == "search"
    training = Training(args.global_batch, args.dtype, Sharding.from_text(args.sharding),
                        Recompute.NONE if search_recompute else Recompute.from_text(args.recompute),
                        not args.no_overlap, args.attention, args.sequence_parallel == "on", args.tp_overlap,
                        args.cross_entropy or framework_of(args.framework).default_cross_entropy, args.framework,
                        args.overlap_param_gather, args.ep_overlap, args.cp_comm)
    if args.max_steps < 1:
        raise SynthError(f"--max-steps {args.max_steps}: must be >= 1")
    compute = compute_profile_argument(args.compute_profile) if args.compute_profile else None  # None: by device
    axes = args.axes if args.axes is not None else ("tp,ep,dp,pp" if model.moe else "tp,dp,pp")
    return JobRequest(topology, device, model, training, parse_axis_ranges(axes),
                      _micro_batches(args.micro_batch), tuple(args.constrain), args.max_steps, model_of(args),
                      compute, args.memory_margin, args.stages, args.schedule, args.virtual_stages, search_recompute)


def run(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    if args.top < 0:
        raise SynthError(f"--top {args.top}: must be >= 0")
    if args.out:
        check_writable(args.out, "--out")  # before the planning, not after it
    if args.plot:
        if args.top == 0:
            raise SynthError("plan --plot: no configuration to draw (--top 0)")
        check_writable(args.plot, "--plot")
        pyplot()  # matplotlib missing: say so before planning
    request = request_of(args)
    progress = _Progress()
    solution = plan_job(request, progress=progress)
    if args.out and not solution.feasible:
        raise SynthError(no_fit_message(solution))  # fail before proving anything
    listed = solution.candidates[: args.top]
    if not args.no_verify:
        for n, candidate in enumerate(listed):
            progress(f"proving the programs of configuration {n + 1}/{len(listed)}")
            solution.verify(candidate)
    plan = solution.plan() if args.out else None  # proved; fails before anything is printed
    progress.done()
    model = request.model
    if model.source_inconsistency:
        print(f"synth-reduce: note: model {model.name}: {' '.join(model.source_inconsistency.split())}; the "
              f"planner uses hidden={model.hidden} as printed, and heads x head_dim = {model.q_dim} for the "
              "attention (tp must divide both heads and hidden)",
              file=sys.stderr)
    if plan is not None:
        write_plan(args.out, plan)
    if args.plot:
        plot_plan(solution, listed, args.plot)
    if args.json:
        print(json.dumps(solution_document(solution), indent=1))
    else:
        print_table(solution, listed)
        if args.out:
            print(f"\nwrote job plan: {solution.best.config.describe()} -> {args.out}")
    if not solution.feasible:  # listed, marked, and an error as with --out
        raise SynthError(no_fit_message(solution))
    return 0


PROGRAMS_WIDTH = 100  # a row's programs past this many columns continue on lines of their own


def _with_programs(row: str, programs: list[str], mark: str, column: int) -> str:
    """``row`` followed by its programs (joined by `` | ``) and ``mark``; when
    they run past :data:`PROGRAMS_WIDTH` columns, one program per line, each
    continuation indented to the programs' column."""
    text = " | ".join(programs) + mark
    if len(text) <= PROGRAMS_WIDTH or len(programs) == 1:
        return row + text
    lines = [row + programs[0]] + [" " * column + p for p in programs[1:]]
    return "\n".join(lines) + mark


def no_fit_message(solution: JobSolution) -> str:
    """The planner's error when no configuration fits, with ``--stages
    uneven`` suggested where size assignments were refused because pp does
    not divide the layers and the stages are even."""
    try:
        _ = solution.best
        return ""
    except SynthError as exc:
        message = str(exc)
    refused = sum(count for reason, count in solution.skipped if reason.startswith("pp does not divide"))
    if refused and solution.request.stages == "even" and "--stages uneven" not in message:
        message += (f"; {refused} size assignment(s) were not evaluated because pp does not divide the layers: "
                    "--stages uneven evaluates them")
    return message


# ---------------------------------------------------------------- JSON


def candidate_document(solution: JobSolution, c: Candidate) -> dict[str, Any]:
    return {
        "axes": c.config.sizes(),
        "micro_batch": c.config.micro_batch,
        "micro_batches": c.config.micro_batches(solution.request.training),
        "sequence_parallel": sequence_parallel(solution.request.training, c.config),
        "stages": "uneven" if c.config.stage_layers else "even",
        "stage_layers": list(c.config.layers_of_stages(solution.request.model)),
        "schedule": c.config.schedule.value,
        "virtual_stages": c.config.virtual_stages,
        "recompute": c.training.recompute.value,
        "tp_overlap": c.training.tp_overlap and sequence_parallel(solution.request.training, c.config),
        "sharding": c.training.sharding.value,
        "dtype": c.training.dtype,
        "matrix": [list(row) for row in c.placement.matrix],
        "matrix_axes": list(c.placement.axis_names),
        "predicted_step_s": c.predicted_step_s,
        "feasible": c.feasible,
        "reason": c.reason or None,
        "memory_bytes_per_device": c.memory.total,
        "memory": c.memory.to_dict(),
        "breakdown": c.step.breakdown(),
        "efficiency": c.step.efficiency,
        "bucket_bytes": c.step.bucket_bytes,
        "programs": c.program_texts(),
        "programs_verified": solution.is_verified(c),
        "model_tflops_per_device": c.tflops_per_device(),
        "hardware_tflops_per_device": c.tflops_per_device(hardware=True),
        "placements_evaluated": c.placements_tried,
    }


def solution_document(solution: JobSolution) -> dict[str, Any]:
    """What ``plan --json`` prints: the request, and every evaluated (sizes,
    micro-batch) with its best placement, feasible first, fastest first."""
    r = solution.request
    return {
        "topology": r.topology.to_dict(),
        "device": r.device.to_dict(),
        "model": r.model.to_dict(),
        "training": r.training.to_dict(),
        "axes": [str(a) for a in r.axes],
        "constraints": list(r.constraints),
        "memory_margin_GiB": r.memory_margin_GiB,
        "stages": r.stages,
        "schedule": r.schedule,
        "virtual_stages": r.virtual_stages,
        "recompute": r.recompute_text,
        "cost_model": {"algo": r.comm.algorithm.value, "profile": r.comm.profile_path},
        "compute_profile": r.compute.to_dict(),
        "size_assignments": solution.assignments,
        "skipped": [{"reason": reason, "count": count} for reason, count in solution.skipped],
        "evaluated": solution.evaluated,
        "elapsed_s": round(solution.elapsed_s, 6),
        "configurations": [candidate_document(solution, c) for c in solution.candidates],
    }


# ---------------------------------------------------------------- table


def _compute_text(compute: ComputeModel, memory_bandwidth_GBps: float | None = None) -> str:
    """The header's account of how compute is priced; with the efficiency curve
    on a device without a memory bandwidth it says that the layers'
    memory-bound passes are left out, and how to give the bandwidth."""
    if isinstance(compute, OperationProfile):
        return (f"compute per operation ({compute.name or compute.source}: GEMMs up to "
                f"{compute.gemm.rate_flops / 1e12:.0f} TFLOP/s, {compute.elementwise.bandwidth_Bps / 1e9:.0f} GB/s "
                "memory-bound)")
    unpriced = ("" if memory_bandwidth_GBps is not None else
                "; the layers' memory-bound passes not priced: the device has no memory bandwidth "
                "(--device ...,memory_bandwidth_GBps=G)")
    if compute is DEFAULT_COMPUTE:
        return (f"compute at {compute.efficiency_max:.1%} of peak (the curve fitted on A100 Megatron-LM runs: no "
                f"per-operation profile for this device){unpriced}")
    if compute.half_flops == 0:
        return f"compute at {compute.efficiency_max:.1%} of peak{unpriced}"
    return (f"compute at {compute.efficiency_max:.1%} of peak x x / (x + {compute.half_flops:.3g}), x = FLOPs per "
            f"layer and micro-batch{unpriced}")


def print_table(solution: JobSolution, listed: Sequence[Candidate]) -> None:
    r = solution.request
    t = r.training
    print(r.model.describe())
    levels = " > ".join(f"{lv.name} x{lv.count}" for lv in r.topology.levels)
    named = "" if r.device.name == "device" else f" {r.device.name}:"  # --device without a name= field
    print(f"topology {r.topology.name}: {levels} ({r.topology.num_devices} devices of{named} "
          f"{r.device.memory_GiB:g} GiB, {r.device.peak_TFLOPs:g} TFLOP/s peak)")
    schedule = f"schedule {r.schedule}" + (f" (v={r.virtual_stages})" if r.virtual_stages else "")
    print(f"global batch {t.global_batch}, {t.dtype}, framework {t.framework}, sharding {t.sharding.value}, "
          f"recompute {r.recompute_text}, "
          f"{schedule}, stages {r.stages}, " + ("tp overlapped with GEMMs, " if t.tp_overlap else "") +
          ("cp keys and values all-gathered, " if t.cp_comm == "allgather" else "") +
          f"sequence parallel {'on where tp > 1' if t.sequence_parallel else 'off'}; "
          f"{r.comm.describe()}; {_compute_text(r.compute, r.device.memory_bandwidth_GBps)}")
    feasible = len(solution.feasible)
    print(f"{solution.evaluated} configurations (sizes x micro-batch x placement) of {solution.assignments} size "
          f"assignments ranked in {format_seconds(solution.elapsed_s)}; {len(solution.candidates)} (sizes, "
          f"micro-batch) with their best placement: {feasible} fit in memory, "
          f"{len(solution.candidates) - feasible} do not")
    for reason, count in solution.skipped:
        print(f"  not evaluated ({count}): {reason}")
    print(f"\nmatrix rows are axes, columns are levels ({' '.join(r.topology.level_names)}); times per step; "
          "TFLOP/s = model FLOPs (no recomputation) per device"
          + ("; listed programs proved (numpy reference + z3)" if listed and all(
              solution.is_verified(c) for c in listed) else ""))
    optimizer = isinstance(r.compute, OperationProfile)  # the curve folds the optimizer step into compute
    experts = any(a.name == "ep" for a in r.axes)
    context = any(a.name == "cp" for a in r.axes)
    width = max([26, *(len(c.placement.matrix_text()) for c in listed)])  # MoE matrices are longer
    header = (f"{'rank':>4} {'tp':>3} " + (f"{'cp':>3} " if context else "") + (f"{'ep':>3} " if experts else "")
              + f"{'dp':>4} {'pp':>3} {'mb':>3}  {'matrix':<{width}} {'step':>10} {'compute':>10} {'bubble':>10} {'tp':>10} "
              + (f"{'cp':>10} " if context else "") + (f"{'ep':>10} " if experts else "")
              + f"{'pp':>10} {'dp':>10} " + (f"{'optim':>10} " if optimizer else "") + f"{'mem':>7} {'TFLOP/s':>7}  programs")
    print(header)
    print("-" * len(header))
    for n, c in enumerate(listed):
        b = c.step
        fits = "" if c.feasible else "(does not fit) "  # before the programs, where a reader sees it
        mark = ""
        if c.config.stage_layers:
            mark += f" (layers per stage {describe_layers(c.config.stage_layers)})"
        if c.config.pp > 1 and r.schedule != "1f1b":
            mark += f" ({c.config.schedule.describe(c.config.virtual_stages)})"
        if r.recompute_search:
            mark += f" (recompute {c.training.recompute.value})"
        programs = [f"{axis}: {text}" for axis, text in c.program_texts().items()] or ["-"]
        row = (f"{n + 1:>4} {c.config.tp:>3} " + (f"{c.config.cp:>3} " if context else "")
              + (f"{c.config.ep:>3} " if experts else "")
              + f"{c.config.dp:>4} {c.config.pp:>3} {c.config.micro_batch:>3}  "
              f"{c.placement.matrix_text():<{width}} {format_seconds(b.total_s):>10} {format_seconds(b.compute_s):>10} "
              f"{format_seconds(b.bubble_s):>10} {format_seconds(b.tp_s):>10} "
              + (f"{format_seconds(b.cp_s):>10} " if context else "")
              + (f"{format_seconds(b.ep_s):>10} " if experts else "") + f"{format_seconds(b.pp_s):>10} "
              f"{format_seconds(b.dp_s):>10} " + (f"{format_seconds(b.optimizer_s):>10} " if optimizer else "")
              + f"{format_size(c.memory.total, places=1, short=True):>7} {c.tflops_per_device():>7.1f}  {fits}")
        print(_with_programs(row, programs, mark, len(header) - len("programs")))
    if feasible and solution.best.step.bucket_bytes:
        print(f"\nbest: DP bucket {format_size(solution.best.step.bucket_bytes)}")
    infeasible = [c for c in solution.candidates if not c.feasible]
    if infeasible:
        smallest = min(infeasible, key=lambda c: c.memory.total)
        print(f"\n{len(infeasible)} configuration(s) do not fit, e.g. {smallest.config.describe()}: {smallest.reason}")
