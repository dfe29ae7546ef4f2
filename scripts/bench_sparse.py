"""Sparse all-reduce against the dense default over a range of densities:
where sparse stops paying, measured beside predicted.

    python scripts/bench_sparse.py [--densities 0.01,0.05,0.1,0.2] [--emulate] [--size 64M]
                                   [--encoding coo] [--iters 5] [--top 8] [--skew uniform]
                                   [--out docs/results/sparse.jsonl]

For each density it runs ``synth-reduce bench --density D`` with 8 MPI ranks on
testbed-2x4 (dp=8), as one ``mpiexec`` on this machine or, with ``--emulate``,
inside ``synth-reduce emulate`` (two network namespaces, a shaped 1 Gbit/s link;
root only), and reads the bench's table: the dense default's median, the best
sparse program's median among the ``--top`` programs the model predicts fastest
(with its place in that ranking), their ratio, side by side from the same run,
and the bench's predicted crossover density. The measured crossover is where the ratio
crosses 1, interpolated in log density between the two densities around it.
Every bench row must report ``#wrong`` 0 (checked). Progress on stderr.
``--out`` appends one JSON line per density (scripts/evaluation_report.py
puts them in docs/results.md, section 5).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run from a checkout without installing
UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
ROW = re.compile(r"^\s*\d+\s+\S+ \S+\s+([\d.]+) (us|ms|s)\s+.*?([\d.]+)x\s+(\d+)\s+(.+)$")


def seconds(value: str, unit: str) -> float:
    return float(value) * UNITS[unit]


def bench(density: float, args: argparse.Namespace) -> tuple[float, float, str, int, float | None]:
    """(dense median, best sparse median, its program, its place in the model's
    ranking (1 = predicted fastest), predicted crossover) of one bench run."""
    python = sys.executable
    command = [python, "-m", "synth.cli", "bench", "--topology", "testbed-2x4", "--axes", "dp=8", "--density",
               f"{density:g}", "--sizes", args.size, "--iters", str(args.iters), "--warmup", "1", "--top",
               str(args.top), "--encoding", args.encoding, "--skew", args.skew, "--placement", "0"]
    if args.emulate:
        launcher = [python, "-m", "synth.cli", "emulate", "--topology", "testbed-2x4", "--"]
        command = launcher + [shutil.which("synth-reduce") or str(Path(python).parent / "synth-reduce")] + command[3:]
    else:
        mpiexec = shutil.which("mpiexec") or str(Path(python).parent / "mpiexec")
        command = [mpiexec, "-n", "8", "--oversubscribe", "--bind-to", "none"] + command
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
    if done.returncode != 0:
        raise SystemExit(f"bench_sparse: the bench at density {density:g} failed:\n{done.stdout}{done.stderr}")
    dense, best, program, predicted, rank, listed = None, math.inf, "", None, 0, 0
    for line in done.stdout.splitlines():
        m = ROW.match(line)
        if m:
            median, wrong, text = seconds(m.group(1), m.group(2)), int(m.group(4)), m.group(5)
            if wrong:
                raise SystemExit(f"bench_sparse: {wrong} wrong positions at density {density:g}: {line}")
            if text.startswith("dense default"):
                dense = median
                continue
            listed += 1  # the bench lists the sparse programs fastest predicted first
            if median < best:
                best, program, rank = median, text, listed
        c = re.search(r"predicted crossover density (> 1|[\d.e-]+)", line)
        if c:
            predicted = None if c.group(1) == "> 1" else float(c.group(1))
    if dense is None or not program:
        raise SystemExit(f"bench_sparse: no table in the bench's output at density {density:g}:\n{done.stdout}")
    return dense, best, program, rank, predicted


def crossover(points: list[tuple[float, float]]) -> str:
    """Where dense / sparse crosses 1 (synth.testbed.evaluation.crossover_density), as text."""
    from synth.testbed.evaluation import crossover_density

    found = crossover_density(points)
    if found is not None:
        return f"{found:.3g}"
    if all(r > 1 for _, r in points):
        return f"above {points[-1][0]:g} (sparse faster at every density measured)"
    return f"below {points[0][0]:g} (sparse slower at every density measured)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--densities", default="0.01,0.05,0.1,0.2")
    p.add_argument("--size", default="64M")
    p.add_argument("--encoding", default="coo", choices=("coo", "bitmap", "auto"))
    p.add_argument("--skew", default="uniform")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--top", type=int, default=8, help="time the N programs predicted fastest (default 8)")
    p.add_argument("--emulate", action="store_true", help="run inside synth-reduce emulate (root)")
    p.add_argument("--out", type=Path, help="append one JSON line per density to this file")
    args = p.parse_args()
    densities = sorted(float(d) for d in args.densities.split(","))
    where = "the emulated 2-node testbed (1 Gbit/s between nodes)" if args.emulate else "one box, shared memory"
    print(f"sparse-allreduce vs dense default: testbed-2x4 dp=8 (8 MPI ranks) on {where}, {args.size} per rank, "
          f"encoding {args.encoding}, indices {args.skew}, median of {args.iters} iterations")
    print(f"{'density':>8} {'dense':>10} {'best sparse':>12} {'dense/sparse':>12} {'predicted crossover':>20} "
          f"{'rank':>4}  program (rank: its place among the {args.top} programs predicted fastest)")
    points = []
    for d in densities:
        print(f"bench_sparse: density {d:g} ...", file=sys.stderr, flush=True)
        dense, best, program, rank, predicted = bench(d, args)
        points.append((d, dense / best))
        if args.out:
            record = {"setting": "emulated 2-node testbed" if args.emulate else "one box", "topology": "testbed-2x4",
                      "axes": "dp=8", "density": d, "size": args.size, "encoding": args.encoding,
                      "skew": args.skew, "iters": args.iters, "dense_median_s": dense, "sparse_median_s": best,
                      "program": program, "predicted_rank": rank, "top": args.top,
                      "predicted_crossover": predicted,
                      "date": datetime.date.today().isoformat()}
            with args.out.open("a") as f:
                f.write(json.dumps(record) + "\n")
        shown = "> 1" if predicted is None else f"{predicted:.3g}"
        print(f"{d:>8g} {dense * 1e3:>8.1f}ms {best * 1e3:>10.1f}ms {dense / best:>11.2f}x {shown:>20} {rank:>4}  "
              f"{program}", flush=True)
    print(f"measured crossover density: {crossover(points)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
