"""``synth-reduce bench`` and ``synth-reduce tune``: time programs on a real
collective library, nccl-tests style, under ``mpiexec``.

    mpiexec -n 8 synth-reduce bench PLAN.json [options]
    mpiexec -n 8 synth-reduce bench --topology T --axes ... [--top K] [options]
    mpiexec -n 8 synth-reduce tune --topology T --axes ... --out PLAN.json [options]

Every rank parses, synthesizes and checks the same input; setup problems are
agreed collectively, so a bad input is the same one-line error on every rank and
a nonzero exit, never a hang. Only rank 0 prints. Timing: a barrier, then each
iteration timed with the world's clock on every rank; an iteration's time is the
maximum over ranks; the table shows the median with min and max. Every timed
iteration starts from the same integer-valued input and its result is compared
with the reduction computed from the reduction groups alone (``#wrong`` counts
wrong elements, summed over ranks and iterations).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence, TypeVar

import numpy as np

from .backends import BACKENDS, make_world
from .problem import Parser, Problem, add_problem_arguments, placements_of, problem_from_args
from .cost import default_program, rank
from .errors import SynthError
from .language import format_program
from .lowering import LoweredProgram, lower
from .placement import Axis, Placement
from .plan import load_plan, plan_document, verify_lowered, verify_plan, write_plan
from .runtime import Executor, World, piece_length
from .search import PlacementPrograms, synthesize_placements
from .semantics import Goal
from .topology import Topology
from .units import format_seconds, format_size, parse_size

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
class Candidate:
    """A program on a placement, as benchmarked. ``label``: ``P/J`` is the
    program of predicted rank ``J`` (0 = fastest) on placement ``P``, the main
    command's ``--placement P --program J``; ``plan`` and ``default`` for a plan
    file."""

    label: str
    placement_index: int | None
    placement: Placement
    lowered: LoweredProgram
    is_default: bool
    predicted_s: float | None


@dataclass(frozen=True)
class Setup:
    topology: Topology
    axes: tuple[Axis, ...]
    reduce_axes: tuple[str, ...]
    goal: Goal
    candidates: tuple[Candidate, ...]
    ranking: str  # how the candidates were chosen, for the header


def _choose(result: PlacementPrograms, problem: Problem, size_bytes: int, algo: str, top: int) -> list[tuple[int, int, float]]:
    """(program index, predicted rank, predicted seconds) of the ``top`` best
    predicted by the simulator, plus the default."""
    ranked = rank(result, problem.reduce_axes, problem.goal, size_bytes, algo=algo)
    chosen = [(j, r, t) for r, (j, t) in enumerate(zip(ranked.order, ranked.predicted_s))][:top]
    if ranked.default_index is not None and ranked.default_index not in ranked.order[:top]:
        r = ranked.order.index(ranked.default_index)
        chosen.append((ranked.default_index, r, ranked.default_s))
    return chosen


def _from_plan(path: str) -> Setup:
    plan = load_plan(path)
    verify_plan(plan, path)  # the stored steps are exactly the proved lowering
    default = default_program(plan.goal)
    candidates = [Candidate("plan", None, plan.placement, plan.stored, plan.program == default, None)]
    if plan.program != default:
        lowered = lower(default, plan.placement, plan.reduce_axes, plan.goal)
        candidates.insert(0, Candidate("default", None, plan.placement, lowered, True, None))
    return Setup(plan.placement.topology, plan.placement.axes, plan.reduce_axes, plan.goal,
                 tuple(candidates), f"the plan's program and the default, from {path}")


def _from_synthesis(args: argparse.Namespace, largest_bytes: int, algo: str) -> Setup:
    problem = problem_from_args(args)
    placements = placements_of(problem)
    chosen = range(len(placements)) if args.placement is None else [args.placement]
    if args.placement is not None and not 0 <= args.placement < len(placements):
        raise SynthError(f"--placement {args.placement}: choose 0..{len(placements) - 1}")
    results = synthesize_placements([placements[i] for i in chosen], problem.reduce_axes, problem.goal,
                                    problem.max_steps)
    default = default_program(problem.goal)
    candidates = []
    for i, result in zip(chosen, results):
        if result.hierarchy.k == 1:
            continue  # the reduction is local: nothing to run
        rows = []
        for j, position, predicted in _choose(result, problem, largest_bytes, algo, args.top):
            program = result.programs[j]
            lowered = lower(program, result.placement, problem.reduce_axes, problem.goal)
            rows.append(Candidate(f"{i}/{position}", i, result.placement, lowered, program == default, predicted))
        rows.sort(key=lambda c: not c.is_default)  # the default first
        candidates += rows
    if not candidates:
        raise SynthError("every chosen placement keeps the reduction on one device: nothing to benchmark")
    ranking = (f"the default and the {args.top} best predicted by synth.cost ({algo} algorithms) at "
               f"{format_size(largest_bytes)}")
    return Setup(problem.topology, problem.axes, problem.reduce_axes, problem.goal, tuple(candidates), ranking)


# ---------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Measurement:
    candidate: Candidate
    size_bytes: int
    count: int
    times_s: tuple[float, ...]  # per iteration, the slowest rank
    wrong: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def algbw_GBps(self) -> float:
        return self.size_bytes / self.median_s / 1e9 if self.median_s > 0 else float("inf")


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


def record(setup: Setup, m: Measurement, backend: str, dtype: str, ranks: int) -> dict[str, Any]:
    """One JSON line, the format ``synth-reduce fit`` and ``validate`` read."""
    c = m.candidate
    return {
        "schema": "synth-reduce/measurement", "version": 1,
        "topology": setup.topology.to_dict(),
        "axes": [{"name": a.name, "size": a.size} for a in setup.axes],
        "matrix": [list(row) for row in c.placement.matrix],
        "reduce": list(setup.reduce_axes),
        "collective": setup.goal.value,
        "program": format_program(c.lowered.program),
        "is_default": c.is_default,
        "backend": backend, "algo": None, "dtype": dtype, "ranks": ranks,
        "size_bytes": m.size_bytes, "iters": len(m.times_s),
        "times_s": list(m.times_s), "median_s": m.median_s,
        "min_s": min(m.times_s), "max_s": max(m.times_s), "wrong": m.wrong,
    }


# ---------------------------------------------------------------- output


_ROW = "{:>8} {:>12} {:>11} {:>8} {:>11} {:>11} {:>11} {:>8} {:>8} {:>7}"


def _print_header(setup: Setup, args: argparse.Namespace, world: World) -> None:
    axes = " ".join(f"{a.name}={a.size}" for a in setup.axes)
    levels = " > ".join(f"{lv.name} x{lv.count}" for lv in setup.topology.levels)
    print(f"# synth-reduce bench: backend {world.name}, {world.size} ranks, dtype {args.dtype}, "
          f"{args.iters} iterations after {args.warmup} warmup")
    print(f"# {setup.topology.name}: {levels}; axes {axes}; {setup.goal.value} over {','.join(setup.reduce_axes)}")
    print(f"# programs: {setup.ranking}")
    print("# time: median over iterations of the slowest rank, with min and max; algbw = size / time; "
          f"busbw = algbw x {'2(n-1)/n' if setup.goal is Goal.ALLREDUCE else '(n-1)/n'}, n = reduction group size")


def _print_placement(setup: Setup, candidates: Sequence[Candidate]) -> None:
    first = candidates[0]
    matrix = first.placement.matrix_text()
    where = "plan" if first.placement_index is None else f"placement {first.placement_index}"
    print(f"#\n# {where}: {matrix} (reduction group of {first.lowered.num_chunks} ranks)")
    for c in candidates:
        predicted = "" if c.predicted_s is None else f"predicted {format_seconds(c.predicted_s)}  "
        flag = "(default)  " if c.is_default else ""
        print(f"#   {c.label:>8}  {flag}{predicted}{format_program(c.lowered.program, ' ; ')}")
    print("#\n" + "#" + _ROW.format("prog", "size(B)", "count", "type", "time(us)", "min(us)", "max(us)",
                                   "algbw", "busbw", "#wrong")[1:])
    print("#" + _ROW.format("", "", "", "", "", "", "", "(GB/s)", "(GB/s)", "")[1:])


def _print_row(m: Measurement, dtype: str, factor: float) -> None:
    print(_ROW.format(m.candidate.label, m.size_bytes, m.count, dtype, f"{m.median_s * 1e6:.1f}",
                      f"{min(m.times_s) * 1e6:.1f}", f"{max(m.times_s) * 1e6:.1f}", f"{m.algbw_GBps:.3f}",
                      f"{m.algbw_GBps * factor:.3f}", m.wrong), flush=True)


def _print_speedups(measurements: Sequence[Measurement], sizes: Sequence[int]) -> None:
    print("#\n# speedup over the default of the same placement (its median time / the program's)")
    print("#" + "".join(f"{s:>10}" for s in ["prog"] + [format_size(z) for z in sizes])[1:])
    default = {(m.candidate.placement_index, m.size_bytes): m.median_s for m in measurements if m.candidate.is_default}
    rows: dict[str, dict[int, float]] = {}
    for m in measurements:
        base = default.get((m.candidate.placement_index, m.size_bytes))
        if base is not None and m.median_s > 0:
            rows.setdefault(m.candidate.label, {})[m.size_bytes] = base / m.median_s
    for label, by_size in rows.items():
        print("".join([f"{label:>10}"] + [f"{by_size[z]:>9.2f}x" if z in by_size else f"{'-':>10}" for z in sizes]))


# ---------------------------------------------------------------- commands


def _parser(prog: str, plan_mode: bool, tune: bool) -> argparse.ArgumentParser:
    p = Parser(
        prog=prog,
        description=(
            f"Run under mpiexec. '{prog} PLAN.json' times the plan's program and the default; "
            f"'{prog} --topology T --axes ...' synthesizes like the main command and times the default "
            "and the --top K predicted programs of every placement."
            + (" tune then writes the plan of the measured winner at the largest size to --out." if tune else "")
        ),
    )
    if plan_mode:
        p.add_argument("plan", help="plan JSON written by synth-reduce --out")
    else:
        add_problem_arguments(p)
        p.add_argument("--placement", type=int, metavar="I", help="only placement I (default: all)")
        p.add_argument("--top", type=int, default=5, metavar="K", help="predicted-best programs per placement (default 5)")
    p.add_argument("--backend", default="mpi", choices=BACKENDS, help="collective library (default: mpi)")
    p.add_argument("--sizes", default="1M,16M", help="per-rank buffer sizes in bytes, e.g. 1M,16M,256M (1M = 2^20)")
    p.add_argument("--dtype", default="float32", help="float32, float64, int32, int64; nccl also float16, bfloat16")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    p.add_argument("--jsonl", metavar="FILE", help="append one measurement record per (placement, program, size)")
    if tune:
        p.add_argument("--out", required=True, metavar="PLAN.json", help="write the plan of the measured winner")
    return p


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


def _run(argv: Sequence[str], tune: bool) -> int:
    prog = "synth-reduce " + ("tune" if tune else "bench")
    plan_mode = not tune and bool(argv) and not argv[0].startswith("-")
    args = _parser(prog, plan_mode, tune).parse_args(argv)
    sizes = parse_sizes(args.sizes)
    for name, value, least in (("--iters", args.iters, 1), ("--warmup", args.warmup, 0),
                               ("--top", getattr(args, "top", 1), 1)):
        if value < least:
            raise SynthError(f"{name} {value}: must be >= {least}")
    world = make_world(args.backend)
    with _rank0_prints(world):
        try:
            return _bench(args, world, sizes, plan_mode, tune)
        except SynthError:
            raise
        except Exception:  # a bug or a library failure on some ranks: stop all, never hang
            traceback.print_exc()
            sys.stderr.flush()
            world.abort(1)
            raise


def _bench(args: argparse.Namespace, world: World, sizes: tuple[int, ...], plan_mode: bool, tune: bool) -> int:
    def setup_all() -> tuple[Setup, np.dtype]:
        if args.dtype not in world.dtypes:
            raise SynthError(f"--dtype {args.dtype}: the {world.name} backend supports "
                             f"{', '.join(sorted(world.dtypes))}")
        dtype = numpy_dtype(args.dtype)
        for size in sizes:
            if size % dtype.itemsize:
                raise SynthError(f"--sizes {size}: not a multiple of the {args.dtype} element size ({dtype.itemsize} B)")
        setup = _from_plan(args.plan) if plan_mode else _from_synthesis(args, max(sizes), "mpi" if world.name == "mpi" else "ring")
        devices = setup.topology.num_devices
        if devices != world.size:
            raise SynthError(f"{'the plan' if plan_mode else 'the topology'} has {devices} devices but "
                             f"{world.size} ranks were launched; run under mpiexec -n {devices}")
        if args.jsonl and world.rank == 0:
            try:
                open(args.jsonl, "a").close()
            except OSError as exc:
                raise SynthError(f"--jsonl {args.jsonl}: cannot write ({exc.strerror})") from None
        return setup, dtype

    setup, dtype = _collectively(world, setup_all)
    _print_header(setup, args, world)
    measurements = []
    placements = {}
    for c in setup.candidates:
        placements.setdefault(c.placement_index, []).append(c)
    for candidates in placements.values():
        _print_placement(setup, candidates)
        executors = [Executor(c.lowered, world) for c in candidates]
        factor = bus_factor(setup.goal, candidates[0].lowered.num_chunks)
        for size in sizes:
            count = size // dtype.itemsize
            data = rank_data(candidates[0].lowered, world.rank, count, dtype)
            data = RankData(world.xp.asarray(data.input), world.xp.asarray(data.expected), data.checked)
            for c, executor in zip(candidates, executors):
                times, wrong = measure(world, executor, data, args.iters, args.warmup)
                m = Measurement(c, size, count, times, wrong)
                measurements.append(m)
                _print_row(m, args.dtype, factor)
                if args.jsonl and world.rank == 0:
                    with open(args.jsonl, "a") as f:
                        f.write(json.dumps(record(setup, m, world.name, args.dtype, world.size)) + "\n")
    _print_speedups(measurements, sizes)
    if tune:
        _write_winner(args, world, setup, measurements, max(sizes))
    return 0


def _write_winner(args: argparse.Namespace, world: World, setup: Setup, measurements: Sequence[Measurement], size: int) -> None:
    at_size = [m for m in measurements if m.size_bytes == size and m.wrong == 0]
    if not at_size:
        raise SynthError("no program gave correct results at the largest size; no plan written")
    best = min(at_size, key=lambda m: m.median_s)  # identical on every rank: times are gathered
    c = best.candidate
    default = next((m for m in at_size if m.candidate.is_default and m.candidate.placement_index == c.placement_index), None)
    speedup = f", {default.median_s / best.median_s:.2f}x the default" if default else ""

    def write() -> None:
        if world.rank == 0:
            verify_lowered(c.lowered)  # never write an unproved plan
            write_plan(args.out, plan_document(c.placement, setup.reduce_axes, c.lowered))

    _collectively(world, write)
    print(f"#\n# winner at {format_size(size)}: {c.label} {format_program(c.lowered.program, ' ; ')} "
          f"({best.median_s * 1e6:.1f} us{speedup})\nwrote plan -> {args.out}")


def bench_main(argv: list[str]) -> int:
    return _run(argv, tune=False)


def tune_main(argv: list[str]) -> int:
    return _run(argv, tune=True)
