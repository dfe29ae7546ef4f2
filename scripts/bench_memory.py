"""The benchmark's memory estimate (``synth.runtime.bench_setup.memory_bytes``, which
``bench`` and ``tune`` check against the machine's available memory before any
work) against the memory real runs use.

    python scripts/bench_memory.py [--json]

Each case runs ``synth-reduce bench`` under ``mpiexec`` (OpenMPI, the mpi
backend). Every rank records the estimate and its peak resident set size
(``getrusage`` ``ru_maxrss``) when the estimate is made (after synthesis, before
any buffer exists) and at the end; "used" is the growth between the two, the
memory the buffers, the executors and the library took. The table shows, per
case, the largest estimate and the largest use over ranks and their ratio
(estimate / used, >= 1 when the estimate is an upper bound).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# (ranks, bench arguments)
CASES = [
    (4, ["--topology", "testbed-2x4", "--scale", "node=1", "--axes", "dp=4", "--sizes", "64M"]),
    (4, ["--topology", "testbed-2x4", "--scale", "node=1", "--axes", "dp=4", "--sizes", "64M",
         "--collective", "reducescatter"]),
    (4, ["--topology", "testbed-2x4", "--scale", "node=1", "--axes", "dp=4", "--sizes", "64M",
         "--collective", "allgather", "--dtype", "float64"]),
    (8, ["--topology", "testbed-2x4", "--axes", "dp=8", "--sizes", "1M,16M"]),
    (8, ["--topology", "testbed-2x4", "--axes", "dp=4,mp=2", "--sizes", "16M", "--placement", "1"]),
]

# runs on every rank: bench, with the estimate and the peak RSS recorded
RANK = """
import json, resource, sys
from mpi4py import MPI
import synth.runtime.bench_setup as bench
from synth.cli import main

marks = []
estimate = bench.memory_bytes

def recorded(*args, **kwargs):
    marks.append((estimate(*args, **kwargs), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
    return marks[-1][0]

bench.memory_bytes = recorded
code = main(sys.argv[1:])
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
(need, before), = marks
print("MEMORY " + json.dumps({"rank": MPI.COMM_WORLD.Get_rank(), "estimate": need, "used": peak - before}),
      flush=True)
sys.exit(code)
"""


def run_case(ranks: int, argv: list[str]) -> dict:
    launcher = Path(sys.executable).parent / "mpiexec"
    launcher = str(launcher) if launcher.exists() else shutil.which("mpiexec")
    if not launcher:
        raise SystemExit("no mpiexec: pip install '.[mpi]'")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    command = [launcher, "-n", str(ranks), "--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle",
               "1", sys.executable, "-c", RANK, "bench", *argv, "--iters", "2", "--warmup", "0", "--top", "2"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    marks = [json.loads(line[len("MEMORY "):]) for line in done.stdout.splitlines() if line.startswith("MEMORY ")]
    estimate, used = max(m["estimate"] for m in marks), max(m["used"] for m in marks)
    return {"ranks": ranks, "arguments": " ".join(argv), "estimate_bytes": estimate, "used_bytes": used,
            "ratio": estimate / used}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    args = p.parse_args()
    rows = []
    for ranks, argv in CASES:
        rows.append(run_case(ranks, argv))
        if not args.json:
            r = rows[-1]
            print(f"{r['ranks']} ranks  {r['arguments']:<90} estimate {r['estimate_bytes'] / 2**20:7.1f} MiB  "
                  f"used {r['used_bytes'] / 2**20:7.1f} MiB  ratio {r['ratio']:.2f}", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
