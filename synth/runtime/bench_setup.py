"""The setup of ``bench`` and ``tune``: what is asked (:class:`BenchRequest`),
the checks before any work, and which programs are timed
(:class:`BenchCandidate`, from a plan file or from synthesis).

Every check here gives the same outcome on every rank: the request is compared
across ranks first (:func:`agree_on_request`), the other checks read only the
request and values every rank computes alike, and :func:`collectively` turns a
failure on any rank into the same error on all of them. For example, two ranks
given ``--sizes 1M`` and ``--sizes 2M`` both fail with ``the ranks were given
different arguments (--sizes 1048576 on rank 0, 2097152 on rank 1); ...``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from ..cost import Algorithm, Model, default_program, rank
from ..documents import check_appendable, check_writable
from ..errors import SynthError
from ..plan import load_plan, verify_plan
from ..synthesis.lowering import LoweredProgram, lower
from ..synthesis.placement import Axis
from ..synthesis.problem import ProblemSpec
from ..synthesis.reduction import Reduction
from ..synthesis.search import ReductionPrograms, synthesize_reduction
from ..topology import Topology
from ..units import format_size, parse_size
from .executor import World, ranks_text, scratch_elements, steps_problem

T = TypeVar("T")


def parse_sizes(spec: str) -> tuple[int, ...]:
    """``1M,16M,256M``: K/M/G and KiB/MiB/GiB are powers of 2 (as nccl-tests),
    KB/MB/GB powers of 10 (see synth.units)."""
    return tuple(parse_size(s, "--sizes") for s in spec.split(","))


#: per dtype, the integers it holds exactly: the benchmark's data stays below them
EXACT_INTEGERS = {"float16": 2**11, "bfloat16": 2**8, "float32": 2**24, "float64": 2**53,
                  "int32": 2**31, "int64": 2**63}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of ``--dtype name``; SynthError naming the choices."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise SynthError("--dtype bfloat16 needs the ml_dtypes package (pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    if name not in EXACT_INTEGERS:
        raise SynthError(f"--dtype {name}: unknown; use one of {', '.join(EXACT_INTEGERS)}")
    return np.dtype(name)


# ---------------------------------------------------------------- what to run


@dataclass(frozen=True)
class BenchRequest:
    """What ``bench`` or ``tune`` is asked to run: a plan file (``plan_path``)
    or a problem to synthesize (``problem``), and how to time it."""

    sizes: tuple[int, ...]
    plan_path: str | None = None
    problem: ProblemSpec | None = None
    placement: int | None = None  # only this placement (synthesis)
    top: int = 5  # predicted-best programs per placement (synthesis)
    backend: str = "mpi"
    dtype: str = "float32"
    iters: int = 20
    warmup: int = 5
    jsonl: str | None = None
    out: str | None = None  # tune: where the winner's plan goes
    tune: bool = False
    nccl_log: bool = True  # on NCCL: record what NCCL's tuning log says it chose
    pipelined: bool = False  # also time each synthesized all-reduce as its pipelined schedule (MPI)


@dataclass(frozen=True)
class BenchCandidate:
    """A program on a placement, as benchmarked. ``label``: ``P/J`` is the
    program of predicted rank ``J`` (0 = fastest) on placement ``P``, the main
    command's ``--placement P --program J``; ``plan`` and ``default`` for a plan
    file."""

    label: str
    placement_index: int | None
    reduction: Reduction
    lowered: LoweredProgram
    is_default: bool
    predicted_s: float | None


@dataclass(frozen=True)
class Setup:
    """The candidates of one run, with what the table's header says of them."""

    topology: Topology
    axes: tuple[Axis, ...]
    candidates: tuple[BenchCandidate, ...]
    ranking: str  # how the candidates were chosen, for the header
    reductions: str  # what is reduced, for the header


def set_key(c: BenchCandidate) -> tuple:
    """The benchmark set of a candidate: its placement and reduction (the
    candidates compared with the same default)."""
    return (c.placement_index, c.reduction.axes, c.reduction.goal)


def candidate_sets(candidates: Sequence[BenchCandidate]) -> list[list[BenchCandidate]]:
    """Candidates by :func:`set_key`, in order of first appearance."""
    groups: dict[tuple, list[BenchCandidate]] = {}
    for c in candidates:
        groups.setdefault(set_key(c), []).append(c)
    return list(groups.values())


def choose_programs(result: ReductionPrograms, size_bytes: int, model: Model,
                    top: int) -> list[tuple[int, int, float]]:
    """(program index, predicted rank, predicted seconds) of the ``top`` best
    predicted by the simulator, plus the default."""
    ranked = rank(result, size_bytes, model)
    chosen = [(j, r, t) for r, (j, t) in enumerate(zip(ranked.order, ranked.predicted_s))][:top]
    if ranked.default_index is not None and ranked.default_index not in ranked.order[:top]:
        r = ranked.order.index(ranked.default_index)
        chosen.append((ranked.default_index, r, ranked.default_s))
    return chosen


def from_plan(path: str) -> Setup:
    """The distinct programs of every reduction of a plan file, each set with
    its default (the default added when the plan does not hold it)."""
    plan = load_plan(path)  # the stored steps are exactly the lowering of the programs
    verify_plan(plan, path)  # and the programs are proved
    candidates = []
    for planned in plan.reductions:
        reduction = planned.reduction
        default = default_program(reduction.goal)
        several = len(plan.reductions) > 1
        distinct = []
        for p in planned.programs:
            if p.program not in [d.program for d in distinct]:
                distinct.append(p)
        prefix = f"{','.join(reduction.axes)}:" if several else ""
        rows = [BenchCandidate(f"{prefix}plan{i if len(distinct) > 1 else ''}", None, reduction, p.lowered,
                               p.program == default, None) for i, p in enumerate(distinct)]
        if all(not c.is_default for c in rows):
            rows.insert(0, BenchCandidate(f"{prefix}default", None, reduction, lower(default, reduction), True, None))
        candidates += rows
    reductions = "; ".join(r.reduction.describe() for r in plan.reductions)
    return Setup(plan.placement.topology, plan.placement.axes, tuple(candidates),
                 f"the plan's programs and the default, from {path}", reductions)


def from_synthesis(request: BenchRequest, largest_bytes: int, model: Model) -> Setup:
    """The default and the ``request.top`` programs predicted best at
    ``largest_bytes`` on every chosen placement (the default first)."""
    problem = request.problem.build()
    placements = problem.placements()
    chosen = range(len(placements)) if request.placement is None else [request.placement]
    if request.placement is not None and not 0 <= request.placement < len(placements):
        raise SynthError(f"--placement {request.placement}: choose 0..{len(placements) - 1}")
    default = default_program(problem.goal)
    candidates = []
    for i in chosen:
        result = synthesize_reduction(problem.reduction(placements[i]), problem.max_steps)
        if result.reduction.k == 1:
            continue  # the reduction is local: nothing to run
        rows = []
        for j, position, predicted in choose_programs(result, largest_bytes, model, request.top):
            program = result.programs[j]
            lowered = lower(program, result.reduction)
            rows.append(BenchCandidate(f"{i}/{position}", i, result.reduction, lowered, program == default,
                                       predicted))
        rows.sort(key=lambda c: not c.is_default)  # the default first
        candidates += rows
    if not candidates:
        raise SynthError("every chosen placement keeps the reduction on one device: nothing to benchmark")
    ranking = (f"the default and the {request.top} best predicted by synth.cost ({model.algorithm.value} "
               f"algorithms) at {format_size(largest_bytes)}")
    reductions = f"{problem.goal.value} over {','.join(problem.reduce_axes)}"
    return Setup(problem.topology, problem.axes, tuple(candidates), ranking, reductions)


def prepare(request: BenchRequest, world: World) -> tuple[Setup, np.dtype]:
    """The candidates and the dtype of a checked request on ``world``: the
    output files are writable (rank 0, before the work), the dtype runs on the
    backend, every size holds whole elements, the devices match the ranks."""
    if world.rank == 0:
        check_outputs(request)  # before the work, not after it
    if request.dtype not in world.dtypes:
        raise SynthError(f"--dtype {request.dtype}: the {world.name} backend supports "
                         f"{', '.join(sorted(world.dtypes))}")
    dtype = numpy_dtype(request.dtype)
    for size in request.sizes:
        if size % dtype.itemsize:
            raise SynthError(f"--sizes {size}: not a multiple of the {request.dtype} element size ({dtype.itemsize} B)")
    model = Model(Algorithm.MPI if world.name == "mpi" else Algorithm.NCCL)
    setup = (from_plan(request.plan_path) if request.plan_path
             else from_synthesis(request, max(request.sizes), model))
    devices = setup.topology.num_devices
    if devices != world.size:
        raise SynthError(f"{'the plan' if request.plan_path else 'the topology'} has {devices} devices but "
                         f"{world.size} ranks were launched; run under {world.launcher.format(ranks=devices)}")
    return setup, dtype


# ---------------------------------------------------------------- checks before the work


def collectively(world: World, fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank; if it fails anywhere, fail everywhere alike."""
    value, problem = None, None
    try:
        value = fn()
    except SynthError as exc:
        problem = str(exc)
    world.agree(problem)
    return value  # type: ignore[return-value]


def check_request(request: BenchRequest) -> None:
    """Checks that need no world (the same outcome on every rank once the
    ranks agree on the request: :func:`agree_on_request`)."""
    for name, value, least in (("--iters", request.iters, 1), ("--warmup", request.warmup, 0),
                               ("--top", request.top, 1)):
        if value < least:
            raise SynthError(f"{name} {value}: must be >= {least}")
    if (request.plan_path is None) == (request.problem is None):
        raise SynthError("give a plan file or --topology and --axes, not both")
    if request.tune and not request.out:
        raise SynthError("tune needs --out PLAN.json")
    if request.pipelined and (request.backend != "mpi" or request.tune):
        raise SynthError("--pipelined runs schedules with MPI point-to-point: bench with --backend mpi only")


_REQUEST_TAG = "the bench/tune argument check"  # see synth.runtime.executor.steps_problem
_OPTIONS = {"plan_path": "PLAN.json", "goal": "--collective", "constraints": "--constrain", "tune": "command"}


def request_digest(request: BenchRequest) -> str:
    """A hash of everything the request says (a frozen value: its repr is
    complete and the same in every process)."""
    return hashlib.sha256(repr(request).encode()).hexdigest()


def _arguments(value: Any) -> dict[str, str]:
    """A request's fields as the command line names them (nested values
    flattened), for the message that says which differ."""
    out = {}
    for f in dataclasses.fields(value):
        item = getattr(value, f.name)
        if dataclasses.is_dataclass(item):
            out.update(_arguments(item))
            continue
        if f.name == "tune":
            text = "tune" if item else "bench"
        elif isinstance(item, tuple):
            text = ",".join(map(str, item)) or "none"
        else:
            text = "none" if item is None else str(item)
        out[_OPTIONS.get(f.name, "--" + f.name.replace("_", "-"))] = text
    return out


def agree_on_request(world: World, request: BenchRequest) -> None:
    """Collective, the first of a run: every rank was given the same request
    (compared by :func:`request_digest`, as the executor compares plans by a
    hash); else the same SynthError on every rank naming the arguments that
    differ and on which ranks."""
    everyone = world.allgather((_REQUEST_TAG, request_digest(request), _arguments(request)))
    mixed = steps_problem(everyone)
    if mixed:
        raise SynthError(mixed)
    if len({digest for _, digest, _ in everyone}) == 1:
        return
    differences = []
    for option in dict.fromkeys(k for _, _, arguments in everyone for k in arguments):
        by_value: dict[str, list[int]] = {}
        for r, (_, _, arguments) in enumerate(everyone):
            by_value.setdefault(arguments.get(option, "none"), []).append(r)
        if len(by_value) > 1:
            differences.append(f"{option} " + ", ".join(f"{v} on {ranks_text(rs)}" for v, rs in by_value.items()))
    raise SynthError(f"the ranks were given different arguments ({'; '.join(differences)}); "
                     "give every rank the same arguments")


def check_outputs(request: BenchRequest) -> None:
    """The files rank 0 writes (``--jsonl``, ``--out``) can be written."""
    if request.jsonl:
        check_appendable(request.jsonl, "--jsonl")
    if request.out:
        check_writable(request.out, "--out")


# ---------------------------------------------------------------- memory


LIBRARY_TEMPORARY_BUFFERS = 1  # e.g. OpenMPI's recursive-doubling and Rabenseifner all-reduce: one of the message


def memory_bytes(setup: Setup, sizes: Sequence[int], dtype: np.dtype, rank: int, on_host: bool = True) -> int:
    """Bytes this rank of the benchmark holds at its peak, an upper bound.

    Building a size's data (:func:`~synth.runtime.bench_measure.rank_data`)
    holds, besides the previous size's input and expected result, at most five arrays of ``count`` index
    integers while it sums, or three and the new input and expected result
    while it converts them; measuring holds the input, the expected result, the
    work buffer, :data:`LIBRARY_TEMPORARY_BUFFERS` message-sized temporaries of
    the library and the scratch that the executors of a placement cache for
    each size (:func:`~synth.runtime.executor.scratch_elements`). With ``on_host`` False
    (a device backend) only building the data is counted: that is the host's
    part. ``scripts/bench_memory.py`` compares this with the peak memory of
    real runs."""
    largest = max(sizes)
    count = largest // dtype.itemsize
    index_bytes = 4 if count + 7 * setup.topology.num_devices + 1000 < 2**31 else 8  # rank_data's index type
    building = max(5 * count * index_bytes, 3 * count * index_bytes + 2 * largest) + 2 * largest
    if not on_host:
        return building
    scratch = max(
        sum(scratch_elements(c.lowered, rank, size // dtype.itemsize) for c in group for size in sizes)
        for group in candidate_sets(setup.candidates)
    ) * dtype.itemsize
    return max(building, (3 + LIBRARY_TEMPORARY_BUFFERS) * largest) + scratch


def _machine_memory() -> tuple[str, int | None]:
    """This machine's identity (the kernel's boot id, which the network
    namespaces of an emulated cluster share) and the memory available on it in
    bytes (None if unknown)."""
    try:
        machine = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        machine = socket.gethostname()
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return machine, int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return machine, os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return machine, None


def memory_problem(needs: Sequence[tuple[int, str, int | None]], largest_bytes: int) -> str | None:
    """What is wrong, if anything, with every rank's ``(bytes needed, machine,
    bytes available there)``: the ranks of a machine need more in all than the
    least that any of them saw available."""
    machines: dict[str, list[tuple[int, int | None]]] = {}
    for need, machine, available in needs:
        machines.setdefault(machine, []).append((need, available))
    for ranks in machines.values():
        known = [a for _, a in ranks if a is not None]
        total = sum(n for n, _ in ranks)
        if known and total > min(known):
            per_rank = max(n for n, _ in ranks)
            where = f"the {len(ranks)} ranks of one machine" if len(machines) > 1 else f"{len(ranks)} rank(s)"
            return (f"--sizes {format_size(largest_bytes)}: the benchmark needs about "
                    f"{format_size(per_rank, 'GiB', 1)} per rank ({per_rank / largest_bytes:.1f}x the largest size: "
                    f"data, work buffer, library and executor scratch) and {format_size(total, 'GiB', 1)} for "
                    f"{where}, but {format_size(min(known), 'GiB', 1)} is available; use smaller --sizes or fewer "
                    "ranks per machine")
    return None


def check_memory(world: World, setup: Setup, sizes: Sequence[int], dtype: np.dtype) -> None:
    """Collective: refuse, alike on every rank, a benchmark that does not fit
    the memory of the machines it runs on (:func:`memory_bytes`)."""
    need = memory_bytes(setup, sizes, dtype, world.rank, on_host=world.xp is np)
    problem = memory_problem(world.allgather((need, *_machine_memory())), max(sizes))
    if problem:
        raise SynthError(problem)


