#!/usr/bin/env python3
"""The measured evaluation (docs/results.md), one command, as root:

    python scripts/run_evaluation.py                 # measure everything, then report
    python scripts/run_evaluation.py --report-only   # re-make docs/results.md from the data
    python scripts/run_evaluation.py --quick         # a few minutes: one cluster, fewer cases

For every emulated cluster (``synth-reduce emulate``: 2 nodes x 4 ranks, 4 x 4, and
2 racks x 2 nodes x 2 ranks), every shape of one, two and three axes and every
reduction (each axis; for three axes also each pair), one MPI job runs
``synth-reduce bench`` for every case in turn: every placement, the default
all-reduce and the --top K programs the simulator predicts fastest, at --sizes,
--iters timed iterations each. Records go to ``<data>/<cluster>-<baseline>.jsonl``
(the ``synth-reduce/measurement`` lines that ``fit`` and ``validate`` read), the
bench tables to ``<data>/<cluster>-<baseline>.log``.

Three baselines (BASELINES), because what "the default all-reduce" is depends on
OpenMPI's configuration: ``flat`` (``OMPI_MCA_coll=^han``: the ``tuned``
component, whose all-reduce above 8 KiB is Rabenseifner's) over the whole case
list with the --top K programs; ``han`` (OpenMPI's default components:
``coll/han``, itself hierarchical) and ``ring`` (tuned forced to a ring
all-reduce, the algorithm of NCCL's default and so of P2's baseline) with fewer
programs per placement.

Then scripts/evaluation_report.py makes docs/results.md and its plots.
Measuring everything took 68.8 minutes on 2 cores (flat 38.5, han 14.4, ring
15.9; testbed-2x2x2 alone 38.2); ``--baselines flat,ring`` takes about 55. Keep
the machine otherwise idle: all ranks share its cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "results" / "data"
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from synth.testbed.evaluation import CLUSTERS, cases  # noqa: E402


@dataclass(frozen=True)
class Baseline:
    """How OpenMPI runs the default all-reduce (and every step) in one set of runs."""

    env: dict[str, str]
    top: int | None  # programs per placement besides the default (None: --top)


BASELINES = {
    # OpenMPI's tuned algorithms (Rabenseifner above 8 KiB): the whole case list
    "flat": Baseline({"OMPI_MCA_coll": "^han"}, None),
    # OpenMPI's default components: coll/han, a hierarchical all-reduce
    "han": Baseline({}, 3),
    # tuned forced to a ring all-reduce, the algorithm NCCL's default uses (P2's baseline)
    "ring": Baseline({"OMPI_MCA_coll": "^han", "OMPI_MCA_coll_tuned_use_dynamic_rules": "1",
                      "OMPI_MCA_coll_tuned_allreduce_algorithm": "4"}, 4),
}


def worker(args: argparse.Namespace) -> int:
    """Runs on every rank under mpiexec: bench every case in one MPI job."""
    from mpi4py import MPI

    from synth.cli.bench import run_bench
    from synth.errors import SynthError
    from synth.topology import load_topology

    rank = MPI.COMM_WORLD.Get_rank()
    todo = cases(load_topology(args.cluster).num_devices, args.quick)
    log = open(args.log, "a") if rank == 0 else open(os.devnull, "w")
    failed = 0
    for i, (axes, reduce) in enumerate(todo, 1):
        start = time.monotonic()
        argv = ["--topology", args.cluster, "--axes", axes, "--reduce", reduce, "--top", str(args.top),
                "--sizes", args.sizes, "--iters", str(args.iters), "--warmup", str(args.warmup),
                "--jsonl", args.jsonl]
        try:
            with contextlib.redirect_stdout(log):
                run_bench(argv)
        except SynthError as exc:  # raised alike on every rank: skip the case everywhere
            failed += 1
            print(f"synth-reduce bench {' '.join(argv)}: {exc}", file=log)
        log.flush()
        if rank == 0:
            print(f"  [{i}/{len(todo)}] {args.cluster} {args.baseline}: axes {axes}, reduce {reduce} "
                  f"({time.monotonic() - start:.0f} s)", file=sys.stderr, flush=True)
    return 1 if failed else 0


def measure(cluster: str, baseline: str, args: argparse.Namespace) -> float:
    """One emulated cluster, one MPI job over all its cases; returns the seconds it took."""
    stem = args.data / f"{cluster}-{baseline}"
    for suffix in (".jsonl", ".log"):
        stem.with_suffix(suffix).unlink(missing_ok=True)
    top = BASELINES[baseline].top or args.top
    job = [sys.executable, str(Path(__file__).resolve()), "--worker", "--cluster", cluster, "--baseline", baseline,
           "--jsonl", str(stem.with_suffix(".jsonl")), "--log", str(stem.with_suffix(".log")),
           "--top", str(top), "--sizes", args.sizes, "--iters", str(args.iters), "--warmup", str(args.warmup)]
    if args.quick:
        job.append("--quick")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_MCA_coll")}
    env.update(BASELINES[baseline].env)
    emulate = [sys.executable, "-m", "synth.cli", "emulate", "--topology", cluster, "--", *job]
    print(f"{cluster}, baseline {baseline}: {' '.join(f'{k}={v}' for k, v in BASELINES[baseline].env.items())} "
          f"synth-reduce emulate --topology {cluster} -- ...", file=sys.stderr, flush=True)
    start = time.monotonic()
    code = subprocess.run(emulate, env=env, cwd=ROOT).returncode
    seconds = time.monotonic() - start
    print(f"{cluster}, baseline {baseline}: done in {seconds:.0f} s (exit {code})", file=sys.stderr, flush=True)
    if code != 0:
        raise SystemExit(f"run_evaluation: {cluster} ({baseline}) failed with exit code {code}; "
                         f"see {stem.with_suffix('.log')}")
    return seconds


def write_run_info(args: argparse.Namespace, clusters: list[str], baselines: list[str], minutes: float,
                   seconds: dict[str, float]) -> None:
    """``<data>/run.json``: what was run, where and how long it took (the report quotes it)."""
    from synth.testbed import find_mpiexec

    def output(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip().splitlines()[0]
        except (OSError, IndexError):
            return "unknown"

    info = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "minutes": round(minutes, 1),
        "clusters": clusters, "baselines": baselines, "sizes": args.sizes, "iters": args.iters,
        "warmup": args.warmup, "top": args.top, "cpus": os.cpu_count(),
        "mpi": output([find_mpiexec(), "--version"]), "python": sys.version.split()[0],
        "commit": output(["git", "rev-parse", "--short", "HEAD"]),
        "seconds": {run: round(t) for run, t in seconds.items()},
    }
    (args.data / "run.json").write_text(json.dumps(info, indent=2) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clusters", default=",".join(CLUSTERS), help=f"topologies to emulate (default {','.join(CLUSTERS)})")
    p.add_argument("--baselines", default=",".join(BASELINES), help=f"any of {', '.join(BASELINES)} (default all)")
    p.add_argument("--sizes", default="64K,1M,4M", help="per-rank sizes (default 64K,1M,4M)")
    p.add_argument("--iters", type=int, default=10, help="timed iterations per measurement (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations first (default 2)")
    p.add_argument("--top", type=int, default=12, help="predicted-best programs per placement in the flat runs (default 12)")
    p.add_argument("--data", type=Path, default=DATA, help=f"where the JSON lines go (default {DATA.relative_to(ROOT)})")
    p.add_argument("--quick", action="store_true", help="testbed-2x4 only, shapes of one and two axes")
    p.add_argument("--report-only", action="store_true", help="skip measuring; report on the data there")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cluster", help=argparse.SUPPRESS)
    p.add_argument("--baseline", help=argparse.SUPPRESS)
    p.add_argument("--jsonl", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    clusters = ["testbed-2x4"] if args.quick else args.clusters.split(",")
    baselines = args.baselines.split(",")
    for b in baselines:
        if b not in BASELINES:
            p.error(f"--baselines {b}: choose from {', '.join(BASELINES)}")
    if not args.report_only:
        args.data.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        seconds = {f"{c}-{b}": measure(c, b, args) for c in clusters for b in baselines}
        minutes = (time.monotonic() - start) / 60
        write_run_info(args, clusters, baselines, minutes, seconds)
        print(f"measured in {minutes:.1f} min", file=sys.stderr)
    report = [sys.executable, str(ROOT / "scripts" / "evaluation_report.py"), "--data", str(args.data)]
    return subprocess.run(report, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
