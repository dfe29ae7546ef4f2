"""What ``bench`` and ``tune`` print and write: the nccl-tests style table
(rank 0 prints; the other ranks' stdout is discarded by the run) and the
measurement records of ``--jsonl``.

The table: a header naming the backend, ranks, dtype and how the programs were
chosen; per benchmark set (placement and reduction) its programs, then one row
per (program, size) with the median, min and max time over iterations, the
algorithm and bus bandwidths (nccl-tests' factors, :func:`bus_factor`) and the
wrong elements; last, each program's speedup over its set's default, e.g.
``0/0  1.85x`` when the default's median is 1.85 times program ``0/0``'s.
"""

from __future__ import annotations

from typing import Sequence

from ..cost.records import append_records
from ..synthesis.language import format_program
from ..synthesis.semantics import Goal
from ..units import format_seconds, format_size
from .bench_measure import PIPELINED_MARK, Timing, bus_factor
from .bench_setup import BenchCandidate, BenchRequest, Setup, collectively, set_key
from .executor import World

_ROW = "{:>8} {:>12} {:>11} {:>8} {:>11} {:>11} {:>11} {:>8} {:>8} {:>7}"


def backend_label(world: World) -> str:
    """``mpi``, ``nccl``, ``torch-gloo``, ``torch-nccl``: what records name."""
    library = getattr(world, "library", None)
    return f"{world.name}-{library}" if library else world.name


def print_header(setup: Setup, request: BenchRequest, world: World) -> None:
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


def print_set(candidates: Sequence[BenchCandidate]) -> None:
    """A benchmark set's placement, its programs and the table's column heads."""
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


def print_row(m: Timing, dtype: str) -> None:
    lowered = m.candidate.lowered
    factor = bus_factor(lowered.goal, lowered.num_chunks)
    print(_ROW.format(m.candidate.label, m.size_bytes, m.count, dtype, f"{m.median_s * 1e6:.1f}",
                      f"{min(m.times_s) * 1e6:.1f}", f"{max(m.times_s) * 1e6:.1f}", f"{m.algbw_GBps:.3f}",
                      f"{m.algbw_GBps * factor:.3f}", m.wrong), flush=True)


def print_speedups(timings: Sequence[Timing], sizes: Sequence[int]) -> None:
    print("#\n# speedup over the default of the same placement (its median time / the program's)")
    print("#" + "".join(f"{s:>10}" for s in ["prog"] + [format_size(z) for z in sizes])[1:])
    default = {(set_key(m.candidate), m.size_bytes): m.median_s for m in timings if m.candidate.is_default}
    rows: dict[str, dict[int, float]] = {}
    for m in timings:
        base = default.get((set_key(m.candidate), m.size_bytes))
        if base is not None and m.median_s > 0:
            rows.setdefault(m.candidate.label, {})[m.size_bytes] = base / m.median_s
    for label, by_size in rows.items():
        print("".join([f"{label:>10}"] + [f"{by_size[z]:>9.2f}x" if z in by_size else f"{'-':>10}" for z in sizes]))


def is_record(m: Timing) -> bool:
    """Whether ``m`` becomes a measurement record: a pipelined schedule's
    timing does not (records describe step-by-step execution)."""
    return not m.candidate.label.endswith(PIPELINED_MARK)


def print_written(request: BenchRequest, timings: Sequence[Timing]) -> None:
    """Say how many records ``--jsonl`` got (:func:`is_record`)."""
    if request.jsonl:
        written = sum(1 for m in timings if is_record(m))
        print(f"#\n# wrote {written} measurement record(s) to {request.jsonl} (appended; synth-reduce fit reads them)")


def write_record(world: World, request: BenchRequest, m: Timing) -> None:
    """Collective: with ``--jsonl``, rank 0 appends the measurement record of
    ``m`` (:meth:`Timing.record`) where it is one (:func:`is_record`); a failed
    write (full disk, /proc) fails every rank alike."""
    if not request.jsonl or not is_record(m):
        return
    record = m.record(backend_label(world), request.dtype, world.size, getattr(world, "nccl_version", None))
    collectively(world, lambda: append_records(request.jsonl, [record]) if world.rank == 0 else None)
