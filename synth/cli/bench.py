"""``synth-reduce bench`` and ``synth-reduce tune`` (run under mpiexec, or
torchrun for ``--backend torch``): their arguments; the work is
:func:`synth.runtime.bench.run`."""

from __future__ import annotations

import argparse
from typing import Sequence

from ..errors import SynthError
from ..units import shown_number
from ..runtime.backends import BACKENDS
from ..runtime.bench import run
from ..runtime.bench_setup import BenchRequest, parse_sizes
from ..runtime.watchdog import arm, parse_timeout
from .args import Parser, add_problem_arguments, problem_spec, sparse_density


def parser(prog: str, plan_mode: bool, tune: bool) -> argparse.ArgumentParser:
    usage = (f"{prog} --topology T --axes AXES --out PLAN.json [options]" if tune else
             f"{prog} PLAN.json [options]\n       {prog} --topology T --axes AXES [options]")
    p = Parser(
        prog=prog,
        usage=usage,
        description=(
            f"Run under mpiexec (backends mpi, nccl) or torchrun (backend torch: "
            f"torchrun --nproc-per-node N -m synth.cli {prog.split()[-1]} --backend torch ...). "
            + ("" if tune else f"'{prog} PLAN.json' times the plan's programs and the default; ")
            + f"'{prog} --topology T --axes ...' synthesizes like the main command and times the default "
            "and the --top K predicted programs of every placement"
            + (", then writes to --out a plan for the placement of the measured winner at the largest size, "
               "with the measured winner of each size for the sizes around it." if tune else ".")
        ),
    )
    if plan_mode:
        p.add_argument("plan", help="plan JSON written by synth-reduce --out")
    else:
        add_problem_arguments(p)
        p.add_argument("--placement", type=int, metavar="I", help="only placement I (default: all)")
        p.add_argument("--top", type=int, default=5, metavar="K", help="predicted-best programs per placement (default 5)")
    p.add_argument("--backend", default="mpi", choices=BACKENDS,
                   help="collective library: mpi, nccl (CuPy), torch (NCCL on GPUs, gloo on CPUs) (default: mpi)")
    p.add_argument("--sizes", default="1M,16M", help="per-rank buffer sizes in bytes, e.g. 1M,16M,256M (1M = 2^20)")
    p.add_argument("--dtype", default="float32",
                   help="float32, float64, int32, int64; nccl and torch also float16, bfloat16")
    p.add_argument("--iters", type=at_most("--iters", MAX_ITERATIONS), default=20,
                   help="timed iterations per size (default 20)")
    p.add_argument("--warmup", type=at_most("--warmup", MAX_ITERATIONS), default=5,
                   help="untimed iterations first (default 5)")
    p.add_argument("--jsonl", metavar="FILE", help="append one measurement record per (placement, program, size)")
    p.add_argument("--timeout", metavar="S", help="end the job when this rank has made no progress (no program run, "
                   "no agreement) for S seconds, as NCCL's and torch's collective timeouts do: a stopped or dead "
                   "rank then ends the job (exit code 124) instead of leaving the others waiting (default: none)")
    p.add_argument("--no-nccl-log", dest="nccl_log", action="store_false",
                   help="on NCCL, do not log NCCL's tuning choices (NCCL_DEBUG=INFO) to record them")
    if not plan_mode and not tune:
        p.add_argument("--skew", metavar="uniform|zipf:S",
                       help="with --density: how the sparse gradient's indices are drawn (default: uniform)")
    if tune:
        p.add_argument("--out", required=True, metavar="PLAN.json", help="write the plan of the measured winner")
    else:
        p.add_argument("--pipelined", action="store_true",
                       help="also time each synthesized all-reduce as its MSCCL schedule, pipelined over MPI "
                            "point-to-point (rows marked ~p; --backend mpi; docs/nccl-programs.md)")
    return p


# iterations per size: each keeps its time on every rank (nccl-tests runs 20 by default); more is a typo
MAX_ITERATIONS = 10**6


def at_most(option: str, most: int):
    """An argparse type: an integer (argparse words a non-integer) of at most
    ``most``, else a SynthError naming the option and the cap (the lower
    bound is the request's check)."""

    def parse(text: str) -> int:
        value = int(text)
        if value > most:
            raise SynthError(f"{option} {shown_number(str(value))}: at most {most:,}")
        return value

    parse.__name__ = "int"  # argparse's word for a non-integer: "invalid int value"
    return parse


def request_of(argv: Sequence[str], tune: bool) -> BenchRequest:
    prog = "synth-reduce " + ("tune" if tune else "bench")
    plan_mode = not tune and bool(argv) and not argv[0].startswith("-")
    args = parser(prog, plan_mode, tune).parse_args(argv)
    arm(parse_timeout(args.timeout))  # this rank's watchdog, from here on (synth.runtime.watchdog)
    return BenchRequest(
        sizes=parse_sizes(args.sizes),
        plan_path=args.plan if plan_mode else None,
        problem=None if plan_mode else problem_spec(args),
        placement=None if plan_mode else args.placement,
        top=1 if plan_mode else args.top,
        backend=args.backend,
        dtype=args.dtype,
        iters=args.iters,
        warmup=args.warmup,
        jsonl=args.jsonl,
        out=getattr(args, "out", None),
        tune=tune,
        nccl_log=args.nccl_log,
        pipelined=getattr(args, "pipelined", False),
    )


def pipelined_schedule(reduction, lowered, member: int, size_bytes: int = 256 * 2**20):
    """A candidate's MSCCL schedule for ``member`` of its group: the file
    ``export --format msccl`` writes for the program at ``size_bytes``
    (synth.export.msccl.export_algorithm: its protocol range, pieces and
    channels per step), checked (synth.export.msccl_check) first; every rank
    compiles and checks the same file, so nothing runs unchecked."""
    from ..export.msccl import export_algorithm, schedule_of
    from ..export.msccl_check import check_algorithm

    algorithm = export_algorithm(lowered, reduction, size_bytes, "bench")
    check_algorithm(algorithm.xml(), f"the MSCCL schedule of {lowered.program}")
    return schedule_of(algorithm, member)


def run_bench(argv: Sequence[str]) -> int:
    plan_mode = bool(argv) and not argv[0].startswith("-")
    if not plan_mode:
        args = parser("synth-reduce bench", False, False).parse_args(argv)
        density = sparse_density(args)
        if density is not None:
            return _run_sparse_bench(args, density)
        if args.skew is not None:
            raise SynthError("--skew applies to a sparse gradient: add --density D")
    request = request_of(argv, tune=False)
    largest = max(request.sizes)  # the schedule of the file the export writes for the largest size
    return run(request, lambda reduction, lowered, member: pipelined_schedule(reduction, lowered, member, largest))


def _run_sparse_bench(args: argparse.Namespace, density: float) -> int:
    from ..runtime.backends import make_world
    from ..runtime.sparse_bench import SparseBenchRequest, run_sparse_bench
    from ..synthesis.hashing import Encoding
    from ..synthesis.sparse import Skew

    if args.backend not in ("mpi", "torch"):
        raise SynthError(f"bench --density runs on --backend mpi or torch (the sparse steps' byte messages), not "
                         f"{args.backend}")
    if args.jsonl:  # said, not dropped: fit's records describe dense collectives
        raise SynthError("--jsonl writes measurement records of dense collectives for fit; sparse-allreduce rows "
                         "are not such records: drop --jsonl (the table is the bench's output)")
    if args.pipelined:
        raise SynthError("--pipelined times MSCCL schedules of dense all-reduces; drop it with --density")
    if args.timeout is not None:
        raise SynthError("--timeout watches the dense programs' runs; it is not available with --density yet")
    request = SparseBenchRequest(problem=problem_spec(args), density=density, skew=Skew.parse(args.skew),
                                 encoding=Encoding.of(args.encoding), sizes=tuple(parse_sizes(args.sizes)),
                                 placement=args.placement, top=args.top, iters=args.iters, warmup=args.warmup,
                                 dtype=args.dtype)
    world = make_world(args.backend)
    try:
        run_sparse_bench(world, request)
    except SynthError:
        raise
    except BaseException:
        if world.size > 1:
            import traceback

            traceback.print_exc()
            world.abort(1)
        raise
    finally:
        # the torch backend's process groups, destroyed here as the dense bench does: left to the
        # interpreter's exit, a gloo group's teardown aborted rank 0 under torchrun on a loaded machine
        # ("terminate called without an active exception") after a complete, correct run
        getattr(world, "close", lambda: None)()
    return 0


def run_tune(argv: Sequence[str]) -> int:
    return run(request_of(argv, tune=True))
