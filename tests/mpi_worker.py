"""Worker for tests/runtime/test_runtime.py, run as ``mpiexec -n 8 python tests/mpi_worker.py MODE``.

``programs``: every program of every placement, for each goal and several axes
and reductions on testbed-2x4, on odd and even lengths and four dtypes; every
rank's whole buffer must equal the numpy reference and the goal's part must
equal the direct reduction. Rank 0 prints ``ok: ...`` or the failures; exit 1 on
any failure.

``bad-length`` / ``bad-dtype`` / ``read-only`` / ``byte-order``: one rank
passes a wrong buffer; every rank must raise the same SynthError, print it and
exit 2.

``alltoall``: every all-to-all program of every placement of testbed-2x4 over
ep, run with MPI_Alltoall on each step's sub-communicators; rank 0 prints
``ok: ...`` if every rank's result is the one-call all-to-all's.

``plan-path GOOD BAD WHO``: ``Executor(path, world)`` where the ranks in WHO
(``all`` or ``3,5``) pass BAD and the others GOOD, then every rank runs the
plan on integer data: a SynthError is printed and exit 2; a wrong element
prints ``rank R: WRONG SUMS``; rank 0 prints ``ok: ...`` if every rank is exact.
"""

from __future__ import annotations

import sys

import numpy as np

from synth.errors import SynthError
from synth.runtime.backends import MPIWorld
from synth.runtime.bench_measure import rank_data
from synth.runtime.executor import Executor, reference
from synth.synthesis.language import Collective, format_program
from synth.synthesis.lowering import lower
from synth.synthesis.placement import enumerate_placements, parse_axes
from synth.synthesis.reduction import Reduction
from synth.synthesis.search import synthesize_reduction
from synth.synthesis.semantics import Goal
from synth.topology import load_topology

PROBLEMS = (("dp=8", "dp"), ("dp=4,mp=2", "dp"), ("dp=2,mp=4", "dp,mp"), ("dp=2,mp=4", "dp"))
DTYPES = (np.dtype("int32"), np.dtype("int64"), np.dtype("float32"), np.dtype("float64"))


def lowered_programs():
    topology = load_topology("testbed-2x4")
    for axes_spec, reduce_spec in PROBLEMS:
        axes = parse_axes(axes_spec)
        reduce_axes = tuple(reduce_spec.split(","))
        placements = enumerate_placements(topology, axes, ())
        for goal in Goal:
            for placement in placements:
                result = synthesize_reduction(Reduction.of(placement, reduce_axes, goal), 5)
                for program in result.programs:
                    yield f"{axes_spec} over {reduce_spec}, {placement.describe()}", lower(program, result.reduction)


def check_programs(world: MPIWorld) -> int:
    failures, runs, programs = [], 0, 0
    for where, lowered in lowered_programs():
        programs += 1
        executor = Executor(lowered, world)
        k = lowered.num_chunks
        for number, length in enumerate((2 * k + 1, 3 * k)):
            dtype = DTYPES[(programs + number) % len(DTYPES)]
            data = [rank_data(lowered, r, length, dtype) for r in range(world.size)]
            want = reference(lowered, np.stack([d.input for d in data]))[world.rank]
            mine = data[world.rank]
            buffer = mine.input.copy()
            executor(buffer)
            runs += 1
            if not np.array_equal(buffer, want) or not np.array_equal(
                buffer[mine.checked], mine.expected[mine.checked]
            ):
                failures.append(f"rank {world.rank}: {where}: {lowered.program} length {length} {dtype}")
        if world.rank == 0 and programs % 20 == 0:  # progress: the test's watchdog bounds the silence, not the run
            print(f"progress: {programs} programs", file=sys.stderr, flush=True)
    everyone = world.allgather(failures)
    if world.rank == 0:
        wrong = [f for fs in everyone for f in fs]
        if wrong:
            print(f"FAILED: {len(wrong)} wrong rank-runs; first: {wrong[:3]}")
        else:
            print(f"ok: {programs} programs, {runs} runs per rank on {world.size} ranks, all exact")
    return 1 if any(everyone) else 0


def bad_buffer(world: MPIWorld, mode: str) -> int:
    lowered = next(lowered for _, lowered in lowered_programs())
    executor = Executor(lowered, world)
    length = 1024 - (world.rank == 3 and mode == "bad-length")
    dtype = "float16" if world.rank == 1 and mode == "bad-dtype" else "float32"
    if world.rank == 5 and mode == "byte-order":
        dtype = ">f4"
    buffer = np.zeros(length, dtype=dtype)
    if world.rank == 5 and mode == "read-only":
        buffer.setflags(write=False)
    try:
        executor(buffer)
    except SynthError as exc:
        print(f"synth-reduce: error: {exc}", file=sys.stderr)
        return 2
    return 0


def plan_path(world: MPIWorld, good: str, bad: str, who: str) -> int:
    mine = bad if who == "all" or str(world.rank) in who.split(",") else good
    try:
        executor = Executor(mine, world)
    except SynthError as exc:
        print(f"synth-reduce: error: {exc}", file=sys.stderr)
        return 2
    lowered = executor.lowered
    data = rank_data(lowered, world.rank, 3 * lowered.num_chunks + 1, np.dtype("int64"))
    buffer = data.input.copy()
    executor(buffer)
    exact = np.array_equal(buffer[data.checked], data.expected[data.checked])
    if not exact:
        print(f"rank {world.rank}: WRONG SUMS", flush=True)
    everyone = world.allgather(exact)
    if world.rank == 0 and all(everyone):
        print(f"ok: {format_program(lowered.program, ' ; ')} exact on {world.size} ranks")
    return 0 if all(everyone) else 1


def check_pipelined(world: MPIWorld) -> int:
    """Every all-reduce program of testbed-2x4 (dp=8 and dp=4,mp=2 over dp),
    compiled to MSCCL and checked, run as a pipelined schedule of non-blocking
    point-to-point on each reduction group at two lengths (one padded): every
    rank's buffer must equal the direct sum."""
    from synth.export.msccl import compile_program, schedule_of
    from synth.export.msccl_check import check_algorithm
    from synth.runtime.pipelined import allreduce

    failures, runs = [], 0
    topology = load_topology("testbed-2x4")
    for axes_spec, reduce_spec in (("dp=8", "dp"), ("dp=4,mp=2", "dp")):
        for placement in enumerate_placements(topology, parse_axes(axes_spec), ()):
            reduction = Reduction.of(placement, reduce_spec, Goal.ALLREDUCE)
            groups = [tuple(int(d) for d in g) for g in reduction.reduction_groups]
            comm = world.mpi_split(groups)
            member = next(g.index(world.rank) for g in groups if world.rank in g)
            group = next(g for g in groups if world.rank in g)
            for program in synthesize_reduction(reduction, 5).programs:
                # as exported and, where it has AllReduce steps, with them split into ReduceScatter + AllGather
                # thread blocks (at the padded length only)
                has_allreduce = any(i.collective is Collective.ALLREDUCE for i in program.instructions)
                for split in (None, True) if has_allreduce else (None,):
                    algorithm = compile_program(program, reduction, "t", split_allreduce=split)
                    if world.rank == 0:  # nothing runs unchecked (the same file on every rank: one check)
                        check_algorithm(algorithm.xml(), "t")
                    schedule = schedule_of(algorithm, member)
                    lengths = (algorithm.nchunksperloop * 5, algorithm.nchunksperloop * 3 + 1)
                    for length in lengths[1:] if split else lengths:
                        rng = np.random.default_rng(1000 * runs)
                        inputs = rng.integers(-1000, 1000, size=(world.size, length)).astype(np.int64)
                        buffer = inputs[world.rank].copy()
                        allreduce(schedule, comm, buffer)
                        if not np.array_equal(buffer, inputs[list(group)].sum(axis=0)):
                            failures.append(f"{axes_spec} {placement.describe()} {format_program(program, ' ; ')} "
                                            f"split {split} length {length}")
                        runs += 1
    everyone = world.allgather(failures)
    if world.rank == 0:
        wrong = [f for fs in everyone for f in fs]
        print("; ".join(wrong[:5]) if wrong else f"ok: {runs} pipelined runs on {world.size} ranks, all exact",
              flush=True)
    return 1 if any(everyone) else 0


def check_alltoalls(world: MPIWorld) -> int:
    """Every all-to-all program of every placement of testbed-2x4 (ep=8; ep=4,tp=2
    and ep=2,tp=4 over ep) on int64 blocks: block i of rank d's result must be
    the block that rank i of d's group addressed to d."""
    from synth.runtime.alltoall import run_alltoall
    from synth.synthesis.alltoall import format_alltoall, synthesize_alltoall

    topology = load_topology("testbed-2x4")
    wrong, runs = [], 0
    for axes in ("ep=8", "ep=4,tp=2", "ep=2,tp=4"):
        for placement in enumerate_placements(topology, parse_axes(axes)):
            groups = Reduction.of(placement, ("ep",))
            table = groups.reduction_groups
            row, rank = (int(v[0]) for v in np.nonzero(table == world.rank))
            k = table.shape[1]
            for program in synthesize_alltoall(groups.hierarchy, 5).programs:
                for block in (1, 3):
                    sent = np.arange(k * block, dtype=np.int64) + 1000 * world.rank
                    got = run_alltoall(world, groups, program, sent)
                    want = np.concatenate([np.arange(rank * block, (rank + 1) * block) + 1000 * int(d)
                                           for d in table[row]])
                    runs += 1
                    if not np.array_equal(got, want):
                        wrong.append(f"rank {world.rank}: {axes} {placement.matrix_text()} "
                                     f"{format_alltoall(program, ' ; ')}")
    everyone = world.allgather(wrong)
    if world.rank == 0:
        failures = [f for fs in everyone for f in fs]
        print("; ".join(failures[:5]) if failures else f"ok: {runs} all-to-all runs per rank on {world.size} ranks, "
              "all exact", flush=True)
    return 1 if any(everyone) else 0


def main(mode: str, *args: str) -> int:
    world = MPIWorld()
    if mode == "programs":
        return check_programs(world)
    if mode == "alltoall":
        return check_alltoalls(world)
    if mode == "pipelined":
        return check_pipelined(world)
    if mode == "plan-path":
        return plan_path(world, *args)
    return bad_buffer(world, mode)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
