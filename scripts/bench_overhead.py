"""Overhead of the runtime's executor over the same collectives called directly.

    mpiexec -n 8 --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 \\
        python scripts/bench_overhead.py [--sizes 8,16MiB] [--iters 40,40]

On testbed-2x4 with dp=8 over both nodes, two programs: the default
``AllReduce(root, inside)`` (1 step) and BlueConnect (ReduceScatter inside the
node, AllReduce across nodes, AllGather inside the node: 3 steps). "Direct" is
the same program written by hand in mpi4py on the same kind of
sub-communicators (``Comm.Split``), on a buffer whose length the hand-written
code chose divisible by 8 (the executor takes the caller's length and pads).
Both use the same buffer (the executor the first ``size`` bytes of it), so that
page placement (e.g. transparent huge pages), which moved 16 MiB timings by
10-20% between two buffers on the 2-core box, favours neither:

    default:     world.Allreduce(IN_PLACE, buf)
    BlueConnect: node.Reduce_scatter_block(buf, part); cross.Allreduce(IN_PLACE, part);
                 node.Allgather(part, buf)

Executor and direct samples alternate in a shuffled order (the same on every
rank), so background load and ordering effects hit both alike; a
sample is a barrier, then ``min(100, max(1, 1MiB / size))`` back-to-back calls (which
amortises the barrier's exit skew at small sizes) timed on every rank, and its
time per call is the maximum over ranks; the medians are compared. The executor runs with
``check=False`` (its hot-loop mode); the cost of the collective buffer check
(``check=True``) is reported on its own. Rank 0 prints the table (and ``--json``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synth.runtime.backends import MPIWorld  # noqa: E402
from synth.runtime.executor import Executor  # noqa: E402
from synth.synthesis.language import parse_program  # noqa: E402
from synth.synthesis.lowering import lower  # noqa: E402
from synth.synthesis.placement import Placement, parse_axes  # noqa: E402
from synth.synthesis.reduction import Reduction  # noqa: E402
from synth.synthesis.semantics import Goal  # noqa: E402
from synth.topology import load_topology  # noqa: E402
from synth.units import parse_size  # noqa: E402

PROGRAMS = {
    "default": "AllReduce(root, inside)",
    "blueconnect": "ReduceScatter(node, inside)\nAllReduce(node, parallel(root))\nAllGather(node, inside)",
}


def direct_runner(name: str, world: MPIWorld, buf: np.ndarray):
    """The program hand-written in mpi4py on ``buf`` (length divisible by 8)."""
    MPI, comm = world.MPI, world.comm
    if name == "default":
        whole = comm.Split(0, world.rank)
        return lambda: whole.Allreduce(MPI.IN_PLACE, buf)
    node = comm.Split(world.rank // 4, world.rank % 4)
    cross = comm.Split(world.rank % 4, world.rank // 4)
    part = np.empty(buf.size // 4, dtype=np.float32)

    def run() -> None:
        node.Reduce_scatter_block(buf, part)
        cross.Allreduce(MPI.IN_PLACE, part)
        node.Allgather(part, buf)

    return run


def timed(world: MPIWorld, run, inner: int) -> float:
    """Seconds per call of ``inner`` back-to-back calls after a barrier."""
    world.barrier()
    start = world.wtime()
    for _ in range(inner):
        run()
    return (world.wtime() - start) / inner


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="8,16MiB", help="bytes per rank (default 8,16MiB)")
    p.add_argument("--iters", default="40,40", help="samples per size, one number per size (default 40,40)")
    p.add_argument("--programs", default=",".join(PROGRAMS), help=f"some of {','.join(PROGRAMS)}")
    p.add_argument("--json", help="write the results here (rank 0)")
    args = p.parse_args()
    sizes = [parse_size(s, "--sizes") for s in args.sizes.split(",")]
    iters = [int(s) for s in args.iters.split(",")]
    world = MPIWorld()
    if world.size != 8:
        raise SystemExit("run with mpiexec -n 8 (testbed-2x4)")
    placement = Placement(load_topology("testbed-2x4"), parse_axes("dp=8"), ((2, 4),))
    results = []
    for name in args.programs.split(","):
        lowered = lower(parse_program(PROGRAMS[name]), Reduction.of(placement, ("dp",), Goal.ALLREDUCE))
        executor = Executor(lowered, world)
        for size, n_iters in zip(sizes, iters):
            count = size // 4
            # one allocation for both, so that page placement favours neither;
            # zeros: the sums stay 0, no reset between calls
            shared = np.zeros(-(-count // 8) * 8, dtype=np.float32)
            buffer = shared[:count]
            direct = direct_runner(name, world, shared)
            runs = {
                "executor": lambda: executor(buffer, check=False),
                "checked": lambda: executor(buffer, check=True),
                "direct": direct,
            }
            inner = min(100, max(1, (1 << 20) // size))  # amortise the barrier at small sizes
            times = {key: [] for key in runs}
            order = random.Random(size)  # the same shuffles on every rank
            for _ in range(n_iters + 3):  # the first 3 are warmup
                for key in order.sample(list(runs), len(runs)):
                    times[key].append(timed(world, runs[key], inner))
            gathered = world.allgather(times)
            med = {key: statistics.median(np.max([g[key][3:] for g in gathered], axis=0)) for key in runs}
            steps = len(lowered.steps)
            results.append({
                "program": name, "steps": steps, "size_bytes": size, "iters": n_iters,
                "direct_s": med["direct"], "executor_s": med["executor"], "checked_s": med["checked"],
                "overhead_pct": 100 * (med["executor"] / med["direct"] - 1),
                "overhead_per_step_us": 1e6 * (med["executor"] - med["direct"]) / steps,
                "check_us": 1e6 * (med["checked"] - med["executor"]),
            })
    if world.rank == 0:
        print(f"{'program':<12} {'steps':>5} {'size(B)':>10} {'direct':>12} {'executor':>12} "
              f"{'overhead':>9} {'per step':>10} {'check':>9}")
        for r in results:
            print(f"{r['program']:<12} {r['steps']:>5} {r['size_bytes']:>10} {r['direct_s'] * 1e6:>10.1f}us "
                  f"{r['executor_s'] * 1e6:>10.1f}us {r['overhead_pct']:>8.1f}% {r['overhead_per_step_us']:>8.1f}us "
                  f"{r['check_us']:>7.1f}us")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
