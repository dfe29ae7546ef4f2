"""A program run step by step (one MPI collective per step, synth.Executor)
beside the same program as its pipelined MSCCL schedule (non-blocking
point-to-point, synth.runtime.pipelined) and the default all-reduce
(MPI_Allreduce), measured side by side in one run under mpiexec.

    mpiexec -n 8 python scripts/bench_pipelined.py [--topology testbed-2x4] [--axes dp=8]
        [--sizes 1M,16M,64M] [--iters 10] [--program N] [--pieces P] [--instances I] [--uplink-gbit R]
        [--predict]

Prints, per size, the median of the per-iteration maximum over ranks of each
variant and the ratios, and checks every result exactly (int32 data; #wrong).
docs/nccl-programs.md records a run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synth.cost.model import Algorithm, Model  # noqa: E402
from synth.cost.pipeline import predict_pipelined  # noqa: E402
from synth.cost.predict import Predictor, lowered_loads  # noqa: E402
from synth.export.msccl import compile_program, schedule_of  # noqa: E402
from synth.export.msccl_check import check_algorithm  # noqa: E402
from synth.runtime.backends import MPIWorld  # noqa: E402
from synth.runtime.bench_setup import parse_sizes  # noqa: E402
from synth.runtime.executor import Executor  # noqa: E402
from synth.runtime.pipelined import allreduce  # noqa: E402
from synth.synthesis.language import format_program  # noqa: E402
from synth.synthesis.lowering import lower  # noqa: E402
from synth.synthesis.placement import enumerate_placements, parse_axes  # noqa: E402
from synth.synthesis.reduction import Reduction  # noqa: E402
from synth.synthesis.search import synthesize_reduction  # noqa: E402
from synth.synthesis.semantics import Goal  # noqa: E402
from synth.topology import load_topology  # noqa: E402


def rank_input(rank: int, n: int) -> np.ndarray:
    """Rank ``rank``'s int32 data: small values, different on every rank."""
    return ((np.arange(n, dtype=np.int64) * (2 * rank + 1) + 7 * rank) % 1999 - 999).astype(np.int32)


def timed(world: MPIWorld, run, data: np.ndarray, expected: np.ndarray, iters: int) -> tuple[float, int]:
    buffer = data.copy()
    run(buffer)  # warm-up, and checked
    wrong = int((buffer != expected).sum())
    times = []
    for _ in range(iters):
        buffer[...] = data
        world.barrier()
        start = world.wtime()
        run(buffer)
        times.append(world.wtime() - start)
        wrong += int((buffer != expected).sum())
    everyone = world.allgather((times, wrong))
    per_iteration = [max(t[i] for t, _ in everyone) for i in range(iters)]
    return statistics.median(per_iteration), sum(w for _, w in everyone)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", default="testbed-2x4")
    p.add_argument("--axes", default="dp=8")
    p.add_argument("--sizes", default="1M,16M,64M")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--pieces", type=int, default=None, help="sub-chunks per chunk (default: the most that fit)")
    p.add_argument("--instances", type=int, default=1,
                   help="channels per step: piece p runs on the (p mod N)-th (default 1)")
    p.add_argument("--uplink-gbit", type=float, default=None,
                   help="the node uplink's shaped rate (emulate's): adds the NIC bound, the least time any "
                        "all-reduce takes, 2 (N-1)/N x size per direction of each of N nodes' uplinks, and each "
                        "variant's ratio to it")
    p.add_argument("--predict", action="store_true",
                   help="also print the cost model's times, with the topology's parameters (its node uplink at "
                        "--uplink-gbit when given): step by step with the MPI model (what the executor runs), "
                        "pipelined with synth.cost.pipeline (rings, as the schedule runs them); and their errors "
                        "against the measured times")
    p.add_argument("--program", type=int, default=None,
                   help="index of the program among those synthesized (default: the first with 3 steps)")
    args = p.parse_args()
    world = MPIWorld()
    topology = load_topology(args.topology)
    placement = enumerate_placements(topology, parse_axes(args.axes))[0]
    reduction = Reduction.of(placement, placement.axes[0].name, Goal.ALLREDUCE)
    programs = synthesize_reduction(reduction, 5).programs
    index = args.program if args.program is not None else next(
        i for i, prog in enumerate(programs) if len(prog.instructions) == 3)
    program = programs[index]
    algorithm = compile_program(program, reduction, "bench", pieces=args.pieces, instances=args.instances)
    check_algorithm(algorithm.xml(), "bench")
    groups = [tuple(int(d) for d in g) for g in reduction.reduction_groups]
    group = next(g for g in groups if world.rank in g)
    nodes = len({d // topology.levels[-1].count for d in group})  # nodes the reduction group spans
    comm = world.mpi_split(groups)
    schedule = schedule_of(algorithm, group.index(world.rank))
    lowered = lower(program, reduction)  # device groups only: the same on the topology the model prices
    priced = None
    if args.predict:  # the same program on the topology as the model sees it (the node uplink as shaped)
        seen = topology
        if args.uplink_gbit:
            node = topology.levels[-2]
            levels = list(topology.levels)
            levels[-2] = replace(node, bandwidth_GBps=args.uplink_gbit / 8 / node.ports)
            seen = replace(topology, levels=tuple(levels))
        priced = Reduction.of(enumerate_placements(seen, parse_axes(args.axes))[0], placement.axes[0].name,
                              Goal.ALLREDUCE)
        # step by step runs MPI's collectives: priced with the MPI model; pipelined, rings (predict_pipelined)
        mpi = Predictor(priced, Model(Algorithm.MPI))
    executor = Executor(lowered, world)
    if world.rank == 0:
        print(f"{args.topology} {args.axes}, {placement.describe()}; program {index}: "
              f"{format_program(program, ' ; ')}; MSCCL schedule: {algorithm.pieces} pieces per chunk, "
              f"{len(algorithm.thread_blocks[0])} streams on rank 0; {world.size} MPI ranks, int32, median of "
              f"{args.iters}" + (f"; NIC bound at {args.uplink_gbit:g} Gbit/s over {nodes} nodes"
                                 if args.uplink_gbit else ""))
        print(f"{'size':>8} {'default':>10} {'steps':>10} {'pipelined':>10} {'steps/def':>10} {'pipe/def':>9} "
              f"{'pipe/steps':>10} {'#wrong':>7}" + (f" {'bound':>10} {'def/bnd':>8} {'steps/bnd':>9} {'pipe/bnd':>8}"
                                                     if args.uplink_gbit else "")
              + (f" {'model:steps':>11} {'model:pipe':>10} {'err:steps':>9} {'err:pipe':>8}" if args.predict else ""))
    for size in parse_sizes(args.sizes):
        n = size // 4
        data = rank_input(world.rank, n)
        expected = np.zeros(n, dtype=np.int32)
        for member in group:  # every member's data is known here: no gather of the inputs
            expected += rank_input(member, n)
        default_s, w1 = timed(world, lambda b: comm.Allreduce(world.MPI.IN_PLACE, b, op=world.MPI.SUM), data,
                              expected, args.iters)
        steps_s, w2 = timed(world, lambda b: executor(b, check=False), data, expected, args.iters)
        pipe_s, w3 = timed(world, lambda b: allreduce(schedule, comm, b), data, expected, args.iters)
        if world.rank == 0:
            row = (f"{size:>8} {default_s * 1e3:>8.2f}ms {steps_s * 1e3:>8.2f}ms {pipe_s * 1e3:>8.2f}ms "
                   f"{steps_s / default_s:>10.2f} {pipe_s / default_s:>9.2f} {pipe_s / steps_s:>10.2f} "
                   f"{w1 + w2 + w3:>7}")
            if args.uplink_gbit:
                bound_s = 2 * (nodes - 1) / nodes * size * 8 / (args.uplink_gbit * 1e9)
                row += (f" {bound_s * 1e3:>8.2f}ms {default_s / bound_s:>8.3f} {steps_s / bound_s:>9.3f} "
                        f"{pipe_s / bound_s:>8.3f}")
            if args.predict:
                model_steps_s = mpi.program(lowered.program, lowered_loads(lowered), float(size))
                model_pipe_s = predict_pipelined(lowered, priced, size, algorithm.pieces).pipelined_s
                row += (f" {model_steps_s * 1e3:>9.2f}ms {model_pipe_s * 1e3:>8.2f}ms "
                        f"{model_steps_s / steps_s - 1:>+9.1%} {model_pipe_s / pipe_s - 1:>+8.1%}")
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
