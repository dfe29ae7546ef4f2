"""How long the job planner takes to rank every configuration of a large job.

Runs ``synth.plan_job`` (what ``synth-reduce plan`` does, without proving the
listed programs) on the cases below, each ``--repeat`` times in this process:
the first run of a case starts from a cold synthesis cache
(``synth.synthesis.search.clear_cache()``), the others are warm (the synthesis cache
survives; collective costs are per run). It reports the configurations
(size assignments x micro-batches x placements) ranked, wall and CPU seconds
(``time.process_time``), configurations per CPU second, and the target of
<= 10 s for >= 1000 configurations.

    python scripts/bench_planner.py [--repeat 3] [--json] [--only TEXT]
    python scripts/bench_planner.py --baseline DIR [--repeat 3] [--only TEXT]

``--baseline DIR`` runs each case side by side with the planner of another
checkout (``DIR`` holds its ``synth`` package, e.g. ``git worktree add DIR
REV`` or ``git archive REV | tar -x -C DIR``): each repeat runs the case once
in a fresh process of each, alternating, and reports CPU seconds (the
process's own, which a loaded machine inflates less than the wall clock) and
their ratio. On a machine other work shares, compare the ratio, not the
seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

try:
    import synth  # noqa: F401
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synth.planner.activations import Recompute  # noqa: E402
from synth.planner.compute import shipped_profile_for  # noqa: E402
from synth.planner.configurations import plan_job  # noqa: E402
from synth.planner.modelspec import load_model  # noqa: E402
from synth.planner.request import JobRequest  # noqa: E402
from synth.planner.stepmodel import Sharding, Training  # noqa: E402
from synth.synthesis.placement import parse_axis_ranges  # noqa: E402
from synth.synthesis.search import clear_cache  # noqa: E402
from synth.topology import Device, load_topology  # noqa: E402

TARGET_S = 10.0
TARGET_CONFIGURATIONS = 1000

# every option searched (the frontier cases of docs/performance.md): uneven or even stages, every schedule, the least
# recomputation that fits, ZeRO-1
SEARCH_ALL = {"stages": "search", "schedule": "search", "recompute_search": True}
H800 = Device("NVIDIA H800 SXM5 80GB", 79.647, 989.4)  # docs/planner.md: the H100's memory assumed
# (label, topology, nodes, model, global batch, recompute, sharding, request options, device, axes)
CASES = (
    ("GPT-3 175B, 512 A100", "dgx-a100", 64, "gpt3-175b", 1536, Recompute.NONE, Sharding.NONE, {}, None, None),
    ("GPT-3 175B, 512 A100, full recomputation", "dgx-a100", 64, "gpt3-175b", 1536, Recompute.FULL, Sharding.NONE,
     {}, None, None),
    ("Llama 2 70B, 512 H100", "dgx-h100", 64, "llama2-70b", 1024, Recompute.SELECTIVE, Sharding.NONE, {}, None,
     None),
    ("Llama 3 405B, 16384 H100, all searched", "dgx-h100", 2048, "llama3-405b", 2048, Recompute.NONE,
     Sharding.ZERO1, SEARCH_ALL, None, None),
    ("DeepSeek-V3, 2048 H800, all searched", "dgx-h800", 256, "deepseek-v3", 15360, Recompute.NONE, Sharding.ZERO1,
     SEARCH_ALL, H800, None),
    # Meta's configuration space with context parallelism searched (docs/planner.md, "Llama 3 405B")
    ("Llama 3 405B, 16384 H100, cp searched", "dgx-h100", 2048, "llama3-405b", 2048, Recompute.NONE,
     Sharding.ZERO1, {"stages": "uneven", "schedule": "search"}, None, "tp,cp,dp,pp"),
    # the largest of Megatron-LM's README benchmarks (models/megatron-462b.yaml; run there at tp 8, pp 16, dp 48)
    ("Megatron-LM 462B, 6144 H100, all searched", "dgx-h100", 768, "megatron-462b", 3072, Recompute.NONE,
     Sharding.ZERO1, SEARCH_ALL, None, None),
)


def run_case(topology_name: str, nodes: int, model: str, batch: int, recompute: Recompute, sharding: Sharding,
             options: dict, device: Device | None, axes: str | None, cold: bool) -> dict:
    topology = load_topology(topology_name).scaled({"node": nodes})
    transformer = load_model(model)
    compute = shipped_profile_for("h100-sxm5-80gb") if device is H800 else None  # the same GH100 compute
    axes = axes or ("tp,ep,dp,pp" if transformer.moe else "tp,dp,pp")
    request = JobRequest(topology, device or topology.device, transformer,
                         Training(batch, sharding=sharding, recompute=recompute), parse_axis_ranges(axes),
                         compute=compute, **options)
    if cold:
        clear_cache()
    wall, cpu = time.perf_counter(), time.process_time()
    solution = plan_job(request)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    best = solution.best
    return {"wall_s": wall, "cpu_s": cpu, "configurations": solution.evaluated,
            "sizes_micro_batches": len(solution.candidates), "feasible": len(solution.feasible),
            "reductions_synthesized": solution.costs.reductions_synthesized, "rankings": solution.costs.rankings,
            "best": best.config.describe(), "best_step_s": best.predicted_step_s}


def run_isolated(synth_dir: str, label: str) -> dict:
    """One cold run of the case ``label`` in a fresh process whose ``synth``
    is the one in ``synth_dir``: its JSON row."""
    env = dict(os.environ, PYTHONPATH=synth_dir)
    command = [sys.executable, str(Path(__file__).resolve()), "--only", label, "--exact", "--repeat", "1", "--json"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=synth_dir)
    if done.returncode != 0:
        raise SystemExit(f"bench_planner: {label} under {synth_dir} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)["cases"][0]["cold"]


def side_by_side(args: argparse.Namespace) -> int:
    """Each case alternately under the baseline checkout and this one."""
    here = str(Path(__file__).resolve().parent.parent)
    print(f"1-minute load {os.getloadavg()[0]:.1f}; CPU seconds per cold run, baseline {args.baseline} vs {here}")
    print(f"{'case':<42} {'baseline CPU':>12} {'this CPU':>9} {'ratio':>6} {'baseline configs':>16} {'configs':>8}")
    for label, *_ in CASES:
        if args.only and args.only.casefold() not in label.casefold():
            continue
        base, this = [], []
        for _ in range(args.repeat):
            base.append(run_isolated(args.baseline, label))
            this.append(run_isolated(here, label))
        b, t = statistics.median(r["cpu_s"] for r in base), statistics.median(r["cpu_s"] for r in this)
        print(f"{label:<42} {b:>11.2f}s {t:>8.2f}s {t / b:>6.2f} {base[0]['configurations']:>16} "
              f"{this[0]['configurations']:>8}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3, help="runs per case; the first is cold (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument("--only", metavar="TEXT", help="run the cases whose label contains TEXT")
    p.add_argument("--exact", action="store_true", help="--only matches the whole label")
    p.add_argument("--baseline", metavar="DIR", help="run each case side by side with the synth package in DIR")
    args = p.parse_args()
    if args.baseline:
        return side_by_side(args)
    load_before = os.getloadavg()[0]
    rows = []
    for label, *case in CASES:
        if args.only and (label != args.only if args.exact else args.only.casefold() not in label.casefold()):
            continue
        runs = [run_case(*case, cold=i == 0) for i in range(args.repeat)]
        warm = runs[1:] or runs
        rows.append({"case": label, "cold": runs[0], "warm_median_wall_s": statistics.median(r["wall_s"] for r in warm),
                     "warm_median_cpu_s": statistics.median(r["cpu_s"] for r in warm)})
    doc = {"python": platform.python_version(), "cpus": os.cpu_count(), "load_before": load_before,
           "load_after": os.getloadavg()[0], "target_s": TARGET_S, "cases": rows}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"Python {doc['python']}, {doc['cpus']} CPUs, 1-minute load {load_before:.1f} before, "
          f"{doc['load_after']:.1f} after; target: >= {TARGET_CONFIGURATIONS} configurations in <= {TARGET_S:g} s")
    header = (f"{'case':<42} {'configs':>7} {'cold wall':>10} {'cold CPU':>9} {'warm wall':>10} {'warm CPU':>9} "
              f"{'configs/CPU s':>13}  best")
    print(header)
    print("-" * len(header))
    for r in rows:
        c = r["cold"]
        print(f"{r['case']:<42} {c['configurations']:>7} {c['wall_s']:>9.2f}s {c['cpu_s']:>8.2f}s "
              f"{r['warm_median_wall_s']:>9.2f}s {r['warm_median_cpu_s']:>8.2f}s "
              f"{c['configurations'] / c['cpu_s']:>13.0f}  {c['best']} ({c['best_step_s']:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
