"""All-to-all programs (synth.runtime.alltoall) beside MPI_Alltoall over the
same groups, measured side by side in one run under mpiexec.

    mpiexec -n 8 python scripts/bench_alltoall.py [--topology testbed-2x4] [--axes ep=8]
        [--sizes 64K,1M,16M] [--iters 10]
    synth-reduce emulate --topology testbed-2x4 -- python scripts/bench_alltoall.py ...

Prints, per size (bytes per rank) and program, the median over iterations of
the per-iteration maximum over ranks, its ratio to MPI_Alltoall over the whole
group, and #wrong (elements that differ from the one call's result, int32
data). The first axis is the all-to-all's. docs/alltoall.md records a run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synth.runtime.alltoall import AllToAllRunner  # noqa: E402
from synth.runtime.backends import MPIWorld  # noqa: E402
from synth.runtime.bench_setup import parse_sizes  # noqa: E402
from synth.synthesis.alltoall import format_alltoall, synthesize_alltoall  # noqa: E402
from synth.synthesis.placement import enumerate_placements, parse_axes  # noqa: E402
from synth.synthesis.reduction import Reduction  # noqa: E402
from synth.topology import load_topology  # noqa: E402


def timed(world: MPIWorld, run, iters: int) -> float:
    """Median over ``iters`` of the slowest rank's seconds (one warm-up call)."""
    run()
    times = []
    for _ in range(iters):
        world.comm.Barrier()
        start = world.wtime()
        run()
        times.append(world.comm.allreduce(world.wtime() - start, op=world.MPI.MAX))
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", default="testbed-2x4")
    p.add_argument("--axes", default="ep=8")
    p.add_argument("--sizes", default="64K,1M,16M")
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    world = MPIWorld()
    placement = enumerate_placements(load_topology(args.topology), parse_axes(args.axes))[0]
    groups = Reduction.of(placement, (placement.axes[0].name,))
    table = groups.reduction_groups
    row, rank = (int(v[0]) for v in np.nonzero(table == world.rank))
    members = [int(d) for d in table[row]]
    k = len(members)
    comm = world.mpi_split([tuple(int(d) for d in r) for r in table])
    programs = synthesize_alltoall(groups.hierarchy, 5).programs
    if world.rank == 0:
        print(f"{args.topology} {args.axes}, {placement.describe()}; all-to-all over {placement.axes[0].name} "
              f"({k} ranks per group); {world.size} MPI ranks, int32, median of {args.iters}")
        print(f"{'size':>9} {'time':>10} {'/ MPI':>6} {'#wrong':>7}  program")
    for size in parse_sizes(args.sizes):
        block = max(size // 4 // k, 1)
        sent = (np.arange(k * block, dtype=np.int32) + 1000 * world.rank).astype(np.int32)
        want = np.concatenate([np.arange(rank * block, (rank + 1) * block, dtype=np.int32) + 1000 * d
                               for d in members]).astype(np.int32)
        got = np.empty_like(sent)
        rows = [("MPI_Alltoall (one call)", timed(world, lambda: comm.Alltoall(sent, got), args.iters),
                 int(np.count_nonzero(got != want)))]
        for program in programs:
            result = {}
            runner = AllToAllRunner(world, groups, program)  # communicators and permutations made once
            result["out"] = runner(sent)  # the first call agrees on the buffer; the timed ones do not repeat it

            def run(runner=runner, result=result) -> None:
                result["out"] = runner(sent, check=False)

            seconds = timed(world, run, args.iters)
            rows.append((format_alltoall(program, " ; "), seconds, int(np.count_nonzero(result["out"] != want))))
        wrong = world.comm.allreduce(sum(w for _, _, w in rows))
        if world.rank == 0:
            base = rows[0][1]
            for text, seconds, _ in rows:
                print(f"{size:>9} {seconds * 1e3:>8.3f}ms {seconds / base:>6.2f} {wrong:>7}  {text}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
