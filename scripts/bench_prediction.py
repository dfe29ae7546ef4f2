"""How long the cost model takes to predict every program of a configuration.

A configuration is (topology, axis sizes, reduction axes). For every 3-axis
configuration of p2-a100 (64 devices: ordered factorisations into three axes of
size >= 2, every non-empty subset of axes reduced, allreduce) this script
synthesizes all placements and programs (not timed), then times predicting and
ranking all programs of all placements at one size with fresh predictors (no
memoised step costs carried over between configurations or repetitions). It
reports the median of ``--repeat`` runs per configuration, and the distribution
over configurations, against the 20 ms target (P2: 0.009-3.09 s). Several
models (``--algo nccl,ring``, the default) are timed side by side in one run:
their repetitions alternate, and the memoised NCCL choices and group shapes are
cleared before every timed run, so each run predicts from cold. Both the wall
time and the process's CPU time (``time.process_time``) are recorded: on a
shared machine the CPU time is the one other processes disturb less.

    python scripts/bench_prediction.py [--topology p2-a100] [--algo nccl,ring] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

try:
    import synth  # noqa: F401
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synth.cost import Model, rank  # noqa: E402
from synth.cost.predict import clear_caches  # noqa: E402
from synth.synthesis.placement import Axis, enumerate_placements  # noqa: E402
from synth.synthesis.reduction import Reduction  # noqa: E402
from synth.synthesis.search import synthesize_reduction  # noqa: E402
from synth.synthesis.semantics import Goal  # noqa: E402
from synth.topology import load_topology  # noqa: E402

TARGET_S = 0.020


def three_axis_sizes(n: int) -> list[tuple[int, int, int]]:
    return [(a, b, n // (a * b)) for a in range(2, n + 1) for b in range(2, n + 1)
            if n % (a * b) == 0 and n // (a * b) >= 2]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topology", default="p2-a100")
    p.add_argument("--algo", default="nccl,ring", help="models to time side by side, comma-separated")
    p.add_argument("--size", type=int, default=256 << 20, help="bytes per device (default 256 MiB)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    topology = load_topology(args.topology)
    algos = [a.strip() for a in args.algo.split(",") if a.strip()]
    models = {a: Model.load(a) for a in algos}
    rows = []
    for sizes in three_axis_sizes(topology.num_devices):
        axes = tuple(Axis(f"a{i}", s) for i, s in enumerate(sizes))
        placements = enumerate_placements(topology, axes)
        for r in range(1, 4):
            for reduce_axes in itertools.combinations([a.name for a in axes], r):
                results = [synthesize_reduction(Reduction.of(p, reduce_axes, Goal.ALLREDUCE), 5) for p in placements]
                runs: dict[str, list[float]] = {a: [] for a in algos}
                cpu: dict[str, list[float]] = {a: [] for a in algos}
                for _ in range(args.repeat):
                    for algo in algos:  # alternate, so that load changes hit every model alike
                        clear_caches()
                        started, started_cpu = time.perf_counter(), time.process_time()
                        for result in results:
                            rank(result, args.size, models[algo])
                        runs[algo].append(time.perf_counter() - started)
                        cpu[algo].append(time.process_time() - started_cpu)
                rows.append({
                    "axes": list(sizes), "reduce": list(reduce_axes), "placements": len(results),
                    "programs": sum(len(x.programs) for x in results),
                    **{f"{a}_median_s": statistics.median(runs[a]) for a in algos},
                    **{f"{a}_min_s": min(runs[a]) for a in algos},
                    **{f"{a}_cpu_median_s": statistics.median(cpu[a]) for a in algos},
                })
    summary = {
        "topology": topology.name, "algos": algos, "size_bytes": args.size, "configurations": len(rows),
        "target_s": TARGET_S, "python": platform.python_version(),
        "machine": platform.processor() or platform.machine(),
    }
    for a in algos:
        times = [r[f"{a}_median_s"] for r in rows]
        cpu_times = [r[f"{a}_cpu_median_s"] for r in rows]
        slowest = max(rows, key=lambda r: r[f"{a}_median_s"])
        summary[a] = {"median_s": statistics.median(times), "max_s": max(times),
                      "within_target": sum(t <= TARGET_S for t in times),
                      "cpu_median_s": statistics.median(cpu_times), "cpu_max_s": max(cpu_times),
                      "cpu_within_target": sum(t <= TARGET_S for t in cpu_times),
                      "slowest": f"{'x'.join(map(str, slowest['axes']))} reducing {'+'.join(slowest['reduce'])}, "
                                 f"{slowest['programs']} programs"}
    if len(algos) > 1:
        ratios = [r[f"{algos[0]}_median_s"] / r[f"{algos[1]}_median_s"] for r in rows]
        summary["ratio"] = {"of": f"{algos[0]}/{algos[1]}", "median": statistics.median(ratios), "max": max(ratios)}
    if args.json:
        print(json.dumps({"summary": summary, "configurations": rows}, indent=1))
        return 0
    print(f"{'axes':<12} {'reduce':<12} {'placements':>10} {'programs':>9} "
          + " ".join(f"{a + ' ms':>10}" for a in algos))
    for r in rows:
        print(f"{'x'.join(map(str, r['axes'])):<12} {'+'.join(r['reduce']):<12} {r['placements']:>10} "
              f"{r['programs']:>9} " + " ".join(f"{r[f'{a}_median_s'] * 1e3:>10.2f}" for a in algos))
    print()
    for a in algos:
        s = summary[a]
        print(f"{summary['configurations']} configurations of {topology.name}, algo {a}: median "
              f"{s['median_s'] * 1e3:.2f} ms, max {s['max_s'] * 1e3:.2f} ms ({s['slowest']}); "
              f"{s['within_target']}/{len(rows)} within {TARGET_S * 1e3:.0f} ms (P2: 9-3090 ms); CPU time median "
              f"{s['cpu_median_s'] * 1e3:.2f} ms, max {s['cpu_max_s'] * 1e3:.2f} ms, "
              f"{s['cpu_within_target']}/{len(rows)} within")
    if "ratio" in summary:
        print(f"{summary['ratio']['of']} per configuration, measured side by side: median "
              f"{summary['ratio']['median']:.2f}, max {summary['ratio']['max']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
