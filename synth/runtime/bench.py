"""``synth-reduce bench`` and ``synth-reduce tune``: time programs on a real
collective library, nccl-tests style, under ``mpiexec`` (backends ``mpi``,
``nccl``) or ``torchrun`` (backend ``torch``: NCCL on GPUs, gloo on CPUs).

    mpiexec -n 8 synth-reduce bench PLAN.json [options]
    mpiexec -n 8 synth-reduce bench --topology T --axes ... [--top K] [options]
    mpiexec -n 8 synth-reduce tune --topology T --axes ... --out PLAN.json [options]
    torchrun --nproc-per-node 8 -m synth.cli bench --backend torch ...

Every rank parses, synthesizes and checks the same input; setup problems are
agreed collectively, so a bad input is the same one-line error on every rank and
a nonzero exit, never a hang. Only rank 0 prints. Timing: a barrier, then each
iteration timed with the world's clock on every rank; an iteration's time is the
maximum over ranks; the table shows the median with min and max. Every timed
iteration starts from the same integer-valued input and its result is compared
with the reduction computed from the reduction groups alone (``#wrong`` counts
wrong elements, summed over ranks and iterations). On NCCL, rank 0 reads
NCCL's tuning log after each (program, size) and records the version and the
algorithms NCCL chose (:mod:`synth.cost.nccl_log`). ``tune`` writes a plan with one
program per measured size (:func:`size_winners`, :func:`tuned_ranges`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import socket
import statistics
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence, TypeVar

import numpy as np

from ..cost import Algorithm, Model, default_program, rank
from ..cost.nccl_log import Capture, Choice, parse, summarize
from ..cost.records import Record, append_records
from ..documents import check_writable
from ..errors import SynthError
from ..interrupts import holding_interrupts
from ..plan import Plan, PlannedProgram, PlannedReduction, load_plan, one_chunk_layout, verify_plan, write_plan
from ..synthesis.language import format_program
from ..synthesis.lowering import LoweredProgram, lower
from ..synthesis.placement import Axis
from ..synthesis.problem import ProblemSpec
from ..synthesis.reduction import Reduction
from ..synthesis.search import ReductionPrograms, synthesize_reduction
from ..synthesis.semantics import Goal
from ..synthesis.verify import verify_lowered
from ..topology import Topology
from ..units import format_seconds, format_size, parse_size
from .backends import make_world
from .executor import Executor, World, piece_length, ranks_text, scratch_elements, steps_problem

T = TypeVar("T")

def parse_sizes(spec: str) -> tuple[int, ...]:
    """``1M,16M,256M``: K/M/G and KiB/MiB/GiB are powers of 2 (as nccl-tests),
    KB/MB/GB powers of 10 (see synth.units)."""
    return tuple(parse_size(s, "--sizes") for s in spec.split(","))


def bus_factor(goal: Goal, group_size: int) -> float:
    """busbw / algbw as in nccl-tests: 2(n-1)/n for all-reduce, (n-1)/n else."""
    n = group_size
    return (2 if goal is Goal.ALLREDUCE else 1) * (n - 1) / n


# ---------------------------------------------------------------- the data


@dataclass(frozen=True)
class RankData:
    """One rank's input, the expected result and the part of it the goal defines."""

    input: Any
    expected: Any
    checked: slice


_EXACT_INTEGERS = {"float16": 2**11, "bfloat16": 2**8, "float32": 2**24, "float64": 2**53,
                   "int32": 2**31, "int64": 2**63}


def numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise SynthError("--dtype bfloat16 needs the ml_dtypes package (pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    if name not in _EXACT_INTEGERS:
        raise SynthError(f"--dtype {name}: unknown; use one of {', '.join(_EXACT_INTEGERS)}")
    return np.dtype(name)


def rank_data(lowered: LoweredProgram, rank: int, count: int, dtype: np.dtype) -> RankData:
    """Integer-valued data whose sums are exact in ``dtype``: rank ``d`` holds
    ``(i + 7d) mod span - span/2`` at element ``i``. For allgather only the
    rank's own shard holds data (the rest is the out-of-range value ``span``)."""
    k = lowered.num_chunks
    group = next(g for g in lowered.reduction_groups if rank in g)
    r = group.index(rank)
    span = max(2, min(1000, _EXACT_INTEGERS[dtype.name] // k))
    index_type = np.int32 if count + 7 * max(group) + span < 2**31 else np.int64
    base = np.arange(count, dtype=index_type) % span

    def values(device: int) -> np.ndarray:
        return (base + 7 * device) % span - span // 2

    q = piece_length(count, k)
    shard = [slice(s * q, min((s + 1) * q, count)) for s in range(k)]
    if lowered.goal is Goal.ALLGATHER:
        data = np.full(count, span, dtype=index_type)
        data[shard[r]] = values(rank)[shard[r]]
        expected = np.empty(count, dtype=index_type)
        for s, device in enumerate(group):
            expected[shard[s]] = values(device)[shard[s]]
        checked = slice(0, count)
    else:
        data = values(rank)
        expected = sum(values(device) for device in group)
        checked = shard[r] if lowered.goal is Goal.REDUCESCATTER else slice(0, count)
    return RankData(data.astype(dtype), expected.astype(dtype), checked)


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
class Candidate:
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
    topology: Topology
    axes: tuple[Axis, ...]
    candidates: tuple[Candidate, ...]
    ranking: str  # how the candidates were chosen, for the header
    reductions: str  # what is reduced, for the header


def _choose(result: ReductionPrograms, size_bytes: int, model: Model, top: int) -> list[tuple[int, int, float]]:
    """(program index, predicted rank, predicted seconds) of the ``top`` best
    predicted by the simulator, plus the default."""
    ranked = rank(result, size_bytes, model)
    chosen = [(j, r, t) for r, (j, t) in enumerate(zip(ranked.order, ranked.predicted_s))][:top]
    if ranked.default_index is not None and ranked.default_index not in ranked.order[:top]:
        r = ranked.order.index(ranked.default_index)
        chosen.append((ranked.default_index, r, ranked.default_s))
    return chosen


def _from_plan(path: str) -> Setup:
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
        rows = [Candidate(f"{prefix}plan{i if len(distinct) > 1 else ''}", None, reduction, p.lowered,
                          p.program == default, None) for i, p in enumerate(distinct)]
        if all(not c.is_default for c in rows):
            rows.insert(0, Candidate(f"{prefix}default", None, reduction, lower(default, reduction), True, None))
        candidates += rows
    reductions = "; ".join(r.reduction.describe() for r in plan.reductions)
    return Setup(plan.placement.topology, plan.placement.axes, tuple(candidates),
                 f"the plan's programs and the default, from {path}", reductions)


def _from_synthesis(request: BenchRequest, largest_bytes: int, model: Model) -> Setup:
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
        for j, position, predicted in _choose(result, largest_bytes, model, request.top):
            program = result.programs[j]
            lowered = lower(program, result.reduction)
            rows.append(Candidate(f"{i}/{position}", i, result.reduction, lowered, program == default, predicted))
        rows.sort(key=lambda c: not c.is_default)  # the default first
        candidates += rows
    if not candidates:
        raise SynthError("every chosen placement keeps the reduction on one device: nothing to benchmark")
    ranking = (f"the default and the {request.top} best predicted by synth.cost ({model.algorithm.value} "
               f"algorithms) at {format_size(largest_bytes)}")
    reductions = f"{problem.goal.value} over {','.join(problem.reduce_axes)}"
    return Setup(problem.topology, problem.axes, tuple(candidates), ranking, reductions)


# ---------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Timing:
    """One candidate timed at one size."""

    candidate: Candidate
    size_bytes: int
    count: int
    times_s: tuple[float, ...]  # per iteration, the slowest rank
    wrong: int
    nccl_choices: tuple[Choice, ...] = ()  # what rank 0's NCCL log said it ran (NCCL only)

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def algbw_GBps(self) -> float:
        return self.size_bytes / self.median_s / 1e9 if self.median_s > 0 else float("inf")

    def record(self, backend: str, dtype: str, ranks: int, nccl_version: str | None = None) -> Record:
        """The measurement record ``fit`` and ``validate`` read."""
        c = self.candidate
        return Record(c.reduction, c.lowered.program, self.size_bytes, self.median_s, is_default=c.is_default,
                      backend=backend, algo=None, dtype=dtype, ranks=ranks, times_s=self.times_s,
                      min_s=min(self.times_s), max_s=max(self.times_s), wrong=self.wrong,
                      nccl_version=nccl_version, nccl_choices=self.nccl_choices)


def measure(world: World, executor: Executor, data: RankData, iters: int, warmup: int) -> tuple[tuple[float, ...], int]:
    """Per-iteration times (max over ranks) and wrong elements (sum over ranks
    and iterations). Collective over the world."""
    xp = world.xp
    buffer = xp.empty_like(data.input)
    buffer[...] = data.input
    executor(buffer, check=True)  # once, collectively checked
    times, wrong = [], 0
    for iteration in range(warmup + iters):
        buffer[...] = data.input
        world.synchronize()
        world.barrier()
        start = world.wtime()
        executor(buffer, check=False)
        world.synchronize()
        elapsed = world.wtime() - start
        if iteration >= warmup:
            times.append(elapsed)
            wrong += int((buffer[data.checked] != data.expected[data.checked]).sum())
    everyone = world.allgather((times, wrong))
    return tuple(max(t[i] for t, _ in everyone) for i in range(iters)), sum(w for _, w in everyone)


# ---------------------------------------------------------------- output


_ROW = "{:>8} {:>12} {:>11} {:>8} {:>11} {:>11} {:>11} {:>8} {:>8} {:>7}"


def backend_label(world: World) -> str:
    """``mpi``, ``nccl``, ``torch-gloo``, ``torch-nccl``: what records name."""
    library = getattr(world, "library", None)
    return f"{world.name}-{library}" if library else world.name


def _print_header(setup: Setup, request: BenchRequest, world: World) -> None:
    axes = " ".join(f"{a.name}={a.size}" for a in setup.axes)
    levels = " > ".join(f"{lv.name} x{lv.count}" for lv in setup.topology.levels)
    goals = {c.reduction.goal for c in setup.candidates}
    version = getattr(world, "nccl_version", None)
    print(f"# synth-reduce bench: backend {backend_label(world)}{f' (NCCL {version})' if version else ''}, "
          f"{world.size} ranks, dtype {request.dtype}, {request.iters} iterations after {request.warmup} warmup")
    if getattr(world, "library", None) == "gloo":
        print("# gloo implements reduce-scatter through all-reduce: results are exact, times are no benchmark "
              "of the programs (time them on MPI or NCCL)")
    print(f"# {setup.topology.name}: {levels}; axes {axes}; {setup.reductions}")
    print(f"# programs: {setup.ranking}")
    factors = sorted({"2(n-1)/n" if g is Goal.ALLREDUCE else "(n-1)/n" for g in goals})
    print("# time: median over iterations of the slowest rank, with min and max; algbw = size / time; "
          f"busbw = algbw x {' or '.join(factors)}, n = reduction group size")


def _print_placement(candidates: Sequence[Candidate]) -> None:
    first = candidates[0]
    matrix = first.reduction.placement.matrix_text()
    where = "plan" if first.placement_index is None else f"placement {first.placement_index}"
    what = f", {first.reduction.describe()}" if first.placement_index is None else ""
    print(f"#\n# {where}: {matrix} (reduction group of {first.lowered.num_chunks} ranks{what})")
    for c in candidates:
        predicted = "" if c.predicted_s is None else f"predicted {format_seconds(c.predicted_s)}  "
        flag = "(default)  " if c.is_default else ""
        print(f"#   {c.label:>8}  {flag}{predicted}{format_program(c.lowered.program, ' ; ')}")
    print("#\n" + "#" + _ROW.format("prog", "size(B)", "count", "type", "time(us)", "min(us)", "max(us)",
                                   "algbw", "busbw", "#wrong")[1:])
    print("#" + _ROW.format("", "", "", "", "", "", "", "(GB/s)", "(GB/s)", "")[1:])


def _print_row(m: Timing, dtype: str, factor: float) -> None:
    print(_ROW.format(m.candidate.label, m.size_bytes, m.count, dtype, f"{m.median_s * 1e6:.1f}",
                      f"{min(m.times_s) * 1e6:.1f}", f"{max(m.times_s) * 1e6:.1f}", f"{m.algbw_GBps:.3f}",
                      f"{m.algbw_GBps * factor:.3f}", m.wrong), flush=True)


def _group_key(c: Candidate) -> tuple:
    return (c.placement_index, c.reduction.axes, c.reduction.goal)


def _groups(candidates: Sequence[Candidate]) -> dict[tuple, list[Candidate]]:
    """Candidates by placement and reduction, in order: the benchmark's sets."""
    groups: dict[tuple, list[Candidate]] = {}
    for c in candidates:
        groups.setdefault(_group_key(c), []).append(c)
    return groups


def _print_speedups(timings: Sequence[Timing], sizes: Sequence[int]) -> None:
    print("#\n# speedup over the default of the same placement (its median time / the program's)")
    print("#" + "".join(f"{s:>10}" for s in ["prog"] + [format_size(z) for z in sizes])[1:])
    default = {(_group_key(m.candidate), m.size_bytes): m.median_s for m in timings if m.candidate.is_default}
    rows: dict[str, dict[int, float]] = {}
    for m in timings:
        base = default.get((_group_key(m.candidate), m.size_bytes))
        if base is not None and m.median_s > 0:
            rows.setdefault(m.candidate.label, {})[m.size_bytes] = base / m.median_s
    for label, by_size in rows.items():
        print("".join([f"{label:>10}"] + [f"{by_size[z]:>9.2f}x" if z in by_size else f"{'-':>10}" for z in sizes]))


# ---------------------------------------------------------------- running


def _collectively(world: World, fn: Callable[[], T]) -> T:
    """Run ``fn`` on every rank; if it fails anywhere, fail everywhere alike."""
    value, problem = None, None
    try:
        value = fn()
    except SynthError as exc:
        problem = str(exc)
    world.agree(problem)
    return value  # type: ignore[return-value]


@contextlib.contextmanager
def _rank0_prints(world: World) -> Iterator[None]:
    if world.rank == 0:
        yield
        return
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        yield


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


def run(request: BenchRequest, pipeliner: Pipeliner | None = None) -> int:
    """Run ``bench`` or ``tune`` on this process's rank (under mpiexec or
    torchrun); every rank calls it with the same request (the first collective
    checks it). Only rank 0 prints. ``pipeliner`` (with ``request.pipelined``)
    gives a candidate's checked pipelined schedule for a member of its group
    (the command line compiles it: synth.export.msccl)."""
    nccl_log = request.nccl_log and request.backend in ("nccl", "torch")
    with Capture() if nccl_log else contextlib.nullcontext() as capture:
        # under mpiexec an interrupt inside MPI_Init is held until the world
        # exists, so that it ends the job (world.abort) instead of leaving this
        # rank in MPI_Finalize at exit while the others wait for it (torchrun
        # ends a job whose rank exits; its rendezvous stays interruptible)
        if request.backend in ("mpi", "nccl"):
            world, interrupted = holding_interrupts(lambda: make_world(request.backend))
        else:
            world, interrupted = make_world(request.backend), False
        with _rank0_prints(world):
            try:
                if interrupted:
                    raise KeyboardInterrupt
                agree_on_request(world, request)
                check_request(request)
                return _bench(request, world, capture, pipeliner)
            except SynthError:
                raise
            except KeyboardInterrupt:  # Ctrl-C or SIGINT to one rank: end the job, never leave the others waiting
                print("synth-reduce: interrupted", file=sys.stderr, flush=True)
                world.abort(130)
                raise
            except Exception:  # a bug or a library failure on some ranks: stop all, never hang
                traceback.print_exc()
                sys.stderr.flush()
                world.abort(1)
                raise
            finally:
                getattr(world, "close", lambda: None)()  # the torch backend's process group


# ---------------------------------------------------------------- checks before the work


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
        check_writable(request.jsonl, "--jsonl")
    if request.out:
        check_writable(request.out, "--out")


LIBRARY_TEMPORARY_BUFFERS = 1  # e.g. OpenMPI's recursive-doubling and Rabenseifner all-reduce: one of the message


def memory_bytes(setup: Setup, sizes: Sequence[int], dtype: np.dtype, rank: int, on_host: bool = True) -> int:
    """Bytes this rank of the benchmark holds at its peak, an upper bound.

    Building a size's data (:func:`rank_data`) holds, besides the previous
    size's input and expected result, at most five arrays of ``count`` index
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
        for group in _groups(setup.candidates).values()
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


def _bench(request: BenchRequest, world: World, capture: Capture | None = None,
           pipeliner: Pipeliner | None = None) -> int:
    sizes = request.sizes

    def setup_all() -> tuple[Setup, np.dtype]:
        if world.rank == 0:
            check_outputs(request)  # before the work, not after it
        if request.dtype not in world.dtypes:
            raise SynthError(f"--dtype {request.dtype}: the {world.name} backend supports "
                             f"{', '.join(sorted(world.dtypes))}")
        dtype = numpy_dtype(request.dtype)
        for size in sizes:
            if size % dtype.itemsize:
                raise SynthError(f"--sizes {size}: not a multiple of the {request.dtype} element size ({dtype.itemsize} B)")
        model = Model(Algorithm.MPI if world.name == "mpi" else Algorithm.NCCL)
        setup = _from_plan(request.plan_path) if request.plan_path else _from_synthesis(request, max(sizes), model)
        devices = setup.topology.num_devices
        if devices != world.size:
            raise SynthError(f"{'the plan' if request.plan_path else 'the topology'} has {devices} devices but "
                             f"{world.size} ranks were launched; run under {world.launcher.format(ranks=devices)}")
        return setup, dtype

    setup, dtype = _collectively(world, setup_all)
    check_memory(world, setup, sizes, dtype)
    _print_header(setup, request, world)
    nccl_version = getattr(world, "nccl_version", None)  # None unless the world runs on NCCL
    read_log = capture is not None and world.rank == 0 and nccl_version is not None
    timings = []
    for candidates in _groups(setup.candidates).values():
        _print_placement(candidates)
        executors: list[Any] = [Executor(c.lowered, world) for c in candidates]
        if request.pipelined and pipeliner is not None:
            candidates, executors = _with_pipelined(candidates, executors, world, pipeliner)
        first = candidates[0].lowered
        factor = bus_factor(first.goal, first.num_chunks)
        for size in sizes:
            count = size // dtype.itemsize
            data = rank_data(first, world.rank, count, dtype)
            data = RankData(world.xp.asarray(data.input), world.xp.asarray(data.expected), data.checked)
            for c, executor in zip(candidates, executors):
                times, wrong = measure(world, executor, data, request.iters, request.warmup)
                lines = capture.read() if read_log else []
                m = Timing(c, size, count, times, wrong, summarize(parse(lines)))
                timings.append(m)
                _print_row(m, request.dtype, factor)
                if request.jsonl and not c.label.endswith(PIPELINED_MARK):  # a record is step-by-step execution
                    # collectively: a failed write (full disk, /proc) fails every rank alike
                    record = m.record(backend_label(world), request.dtype, world.size, nccl_version)
                    _collectively(world, lambda: append_records(request.jsonl, [record]) if world.rank == 0
                                  else None)
    _print_speedups(timings, sizes)
    if request.tune:
        _write_tuned(request, world, timings, sizes)
    return 0


PIPELINED_MARK = "~p"  # label suffix of a candidate timed as its pipelined schedule
Pipeliner = Callable[[Reduction, LoweredProgram, int], Any]


class _PipelinedRun:
    """A candidate's pipelined schedule, called like an Executor."""

    def __init__(self, schedule: Any, comm: Any) -> None:
        self.schedule, self.comm = schedule, comm

    def __call__(self, buffer: Any, check: bool = False) -> None:
        from .pipelined import allreduce

        allreduce(self.schedule, self.comm, buffer)


def _with_pipelined(candidates: Sequence[Candidate], executors: list[Any], world: World,
                    pipeliner: Pipeliner) -> tuple[list[Candidate], list[Any]]:
    """Each non-default all-reduce candidate followed by itself run as its
    pipelined schedule (label + PIPELINED_MARK)."""
    out_c, out_e = [], []
    for c, executor in zip(candidates, executors):
        out_c.append(c)
        out_e.append(executor)
        if c.is_default or c.reduction.goal is not Goal.ALLREDUCE:
            continue
        groups = [tuple(int(d) for d in g) for g in c.reduction.reduction_groups]
        member = next(g.index(world.rank) for g in groups if world.rank in g)
        try:  # the same file on every rank: every rank gets the same schedule or the same refusal
            schedule = pipeliner(c.reduction, c.lowered, member)
        except SynthError as exc:
            print(f"# {c.label}: no pipelined schedule ({exc})", flush=True)
            continue
        out_c.append(dataclasses.replace(c, label=c.label + PIPELINED_MARK))
        out_e.append(_PipelinedRun(schedule, world.mpi_split(groups)))
    return out_c, out_e


def _range_bounds(sizes: Sequence[int]) -> list[int]:
    """Where the size ranges of a tuned plan meet: between consecutive measured
    sizes, at their geometric mean (rounded down, above the smaller size)."""
    return [max(math.isqrt(a * b), a + 1) for a, b in zip(sizes, sizes[1:])]


def size_winners(timings: Sequence[Timing], sizes: Sequence[int]) -> list[Timing]:
    """What ``tune`` chooses, per measured size in increasing order: on the
    placement (and reduction) of the fastest correct program at the largest
    size, the fastest correct program of that size. Every rank computes the same
    from the gathered times."""
    sizes = sorted(set(sizes))
    correct = [m for m in timings if m.wrong == 0]
    largest = [m for m in correct if m.size_bytes == sizes[-1]]
    if not largest:
        raise SynthError("no program gave correct results at the largest size; no plan written")
    group = _group_key(min(largest, key=lambda m: m.median_s).candidate)
    winners = []
    for size in sizes:
        here = [m for m in correct if m.size_bytes == size and _group_key(m.candidate) == group]
        if not here:
            raise SynthError(f"no program gave correct results at {format_size(size)}; no plan written")
        winners.append(min(here, key=lambda m: m.median_s))
    return winners


def tuned_ranges(winners: Sequence[Timing]) -> list[PlannedProgram]:
    """The size ranges of a tuned plan: the winner of size ``s`` runs from the
    previous bound to the bound between ``s`` and the next measured size
    (:func:`_range_bounds`); the first range starts at 0, the last is unbounded;
    adjacent ranges with the same program are merged."""
    bounds = [0, *_range_bounds([m.size_bytes for m in winners]), None]
    ranges: list[PlannedProgram] = []
    for m, low, high in zip(winners, bounds, bounds[1:]):
        if ranges and ranges[-1].program == m.candidate.lowered.program:
            ranges[-1] = PlannedProgram(ranges[-1].lowered, ranges[-1].min_bytes, high)
        else:
            ranges.append(PlannedProgram(m.candidate.lowered, low, high))
    return ranges


def _write_tuned(request: BenchRequest, world: World, timings: Sequence[Timing], sizes: Sequence[int]) -> None:
    winners = size_winners(timings, sizes)
    reduction = winners[0].candidate.reduction
    programs = tuned_ranges(winners)

    def write() -> None:
        if world.rank == 0:
            for p in programs:
                verify_lowered(p.lowered)  # never write an unproved plan
            write_plan(request.out, Plan(reduction.placement,
                                         (PlannedReduction(reduction, one_chunk_layout(programs)),)))

    _collectively(world, write)
    defaults = {(_group_key(m.candidate), m.size_bytes): m.median_s for m in timings if m.candidate.is_default}
    print("#")
    for m in winners:
        c = m.candidate
        default = defaults.get((_group_key(c), m.size_bytes))
        speedup = f", {default / m.median_s:.2f}x the default" if default else ""
        print(f"# winner at {format_size(m.size_bytes)}: {c.label} {format_program(c.lowered.program, ' ; ')} "
              f"({m.median_s * 1e6:.1f} us{speedup})")
    for p in programs:
        upper = "" if p.max_bytes is None else f" < {p.max_bytes}"
        print(f"# plan: {p.min_bytes} <= bytes{upper}: {format_program(p.program, ' ; ')}")
    print(f"wrote plan -> {request.out}")
