#!/usr/bin/env python3
"""Speed and memory benchmark of placement enumeration and program synthesis.

Three measurements (see docs/performance.md for the results and the machine):

1. P2 configurations. A configuration is (topology, axis sizes, reduction axes,
   goal). For ``p2-a100`` (4 x 16 = 64 devices) and ``p2-v100`` (4 x 8 = 32
   devices) we take every ordered factorisation of the device count into 1, 2 or
   3 axes of size >= 2 (axes named a0, a1, a2), every non-empty subset of the
   axes as the reduction, and each goal. One run of a configuration is the full
   pipeline from a cold search cache: ``enumerate_placements`` followed by
   ``synthesize_reduction(..., max_steps=5)`` for all placements. Each
   configuration is run ``--repeats`` times; its time is the MEDIAN of the runs
   (the worst single run is reported as well). The process makes one warm-up
   call (an enumeration + a small search) before any timing: the first call in a
   process pays a one-off start-up cost that is not part of a configuration.
   (The ``z3_seconds`` fields are the placement enumeration's time; the name is
   kept for the reports that read them.)

2. ``rack.yaml`` ([rack x2, node x4, cpu x2, gpu x4] = 64 devices), one axis of
   size 64, so the reduction spans all four levels (synthesis hierarchy 2,4,2,4);
   max 5 steps; each goal.

3. A 4096-device cluster ``[node x512, gpu x8]`` (``dgx-a100`` scaled to 512
   nodes), one axis of size 4096 reduced over every device; max 5 steps.

Cases 2 and 3 each run in a fresh subprocess, so that peak memory is clean:
the child imports the package, makes the warm-up call, records ``ru_maxrss``,
runs the case once and records ``ru_maxrss`` again (Linux reports KiB). With
``--tracemalloc`` the child also reports the tracemalloc peak of the case (this
slows Python down, so its time is measured separately and not reported).

Usage::

    python scripts/bench_synthesis.py            # full run, human-readable tables
    python scripts/bench_synthesis.py --quick    # a subset, a few seconds
    python scripts/bench_synthesis.py --json     # machine-readable output only
    python scripts/bench_synthesis.py --json out.json   # tables, and the JSON in out.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

if importlib.util.find_spec("synth") is None:  # not installed: use the repository checkout
    sys.path.insert(0, str(REPO_ROOT))

from synth.synthesis.placement import Axis, enumerate_placements  # noqa: E402
from synth.synthesis.reduction import Reduction  # noqa: E402
from synth.synthesis.search import clear_cache, synthesize_reduction  # noqa: E402
from synth.synthesis.semantics import Goal  # noqa: E402
from synth.topology import load_topology  # noqa: E402

MAX_STEPS = 5
TARGET_CONFIG_S = 0.050
TARGET_RACK_S = 5.0
TARGET_RACK_BYTES = 2 * 10**9
P2_SECONDS_PER_CONFIG = 1.16
GOALS = (Goal.ALLREDUCE, Goal.REDUCESCATTER, Goal.ALLGATHER)


# ---------------------------------------------------------------- configurations


def ordered_factorisations(n: int, parts: int, smallest: int = 2):
    """Ordered tuples of ``parts`` integers >= ``smallest`` whose product is ``n``."""
    if parts == 1:
        if n >= smallest:
            yield (n,)
        return
    for d in range(smallest, n + 1):
        if n % d == 0:
            for rest in ordered_factorisations(n // d, parts - 1, smallest):
                yield (d, *rest)


def configurations(num_devices: int, goals, quick: bool):
    """(sizes, reduce_axes, goal) for every factorisation into 1..3 axes and every
    non-empty subset of axes. ``quick`` keeps, for 3 axes, only the reductions
    over the first axis and over all axes."""
    for parts in (1, 2, 3):
        for sizes in ordered_factorisations(num_devices, parts):
            names = [f"a{i}" for i in range(parts)]
            subsets = [
                tuple(c)
                for r in range(1, parts + 1)
                for c in itertools.combinations(names, r)
            ]
            if quick and parts == 3:
                subsets = [s for s in subsets if s == ("a0",) or len(s) == 3]
            for reduce_axes in subsets:
                for goal in goals:
                    yield sizes, reduce_axes, goal


def synthesize_all(placements, reduce_axes, goal):
    """Every placement's programs, listed (placements of one hierarchy shape share
    a search; the search gives its programs on demand, so they are asked for here
    to time the same work as before: every valid program)."""
    results = [synthesize_reduction(Reduction.of(p, reduce_axes, goal), MAX_STEPS) for p in placements]
    for result in results:
        result.programs  # noqa: B018 - lists them
    return results


def warm_up() -> None:
    """One placement enumeration and one small search, so that one-off start-up costs
    (first imports, numpy) are not charged to a configuration."""
    topology = load_topology("testbed-2x4")
    placements = enumerate_placements(topology, [Axis("w", 8)])
    synthesize_all(placements, ("w",), Goal.ALLREDUCE)
    clear_cache()


def run_configuration(topology, sizes, reduce_axes, goal):
    """One cold run of the full pipeline; returns (wall s, z3 wall s, search wall s,
    results, CPU s of this process)."""
    axes = [Axis(f"a{i}", s) for i, s in enumerate(sizes)]
    clear_cache()
    c0 = time.process_time()
    t0 = time.perf_counter()
    placements = enumerate_placements(topology, axes)
    t1 = time.perf_counter()
    results = synthesize_all(placements, reduce_axes, goal)
    t2 = time.perf_counter()
    c2 = time.process_time()
    return t2 - t0, t1 - t0, t2 - t1, results, c2 - c0


def bench_topology(name: str, goals, repeats: int, quick: bool) -> dict:
    topology = load_topology(name)
    rows = []
    for sizes, reduce_axes, goal in configurations(topology.num_devices, goals, quick):
        runs = [run_configuration(topology, sizes, reduce_axes, goal) for _ in range(repeats)]
        results = runs[0][3]
        rows.append(
            {
                "sizes": list(sizes),
                "reduce": list(reduce_axes),
                "goal": goal.value,
                "seconds": statistics.median(r[0] for r in runs),
                "seconds_worst_run": max(r[0] for r in runs),
                "cpu_seconds": statistics.median(r[4] for r in runs),
                "z3_seconds": statistics.median(r[1] for r in runs),
                "search_seconds": statistics.median(r[2] for r in runs),
                "placements": len(results),
                "max_programs": max((len(r.programs) for r in results), default=0),
                "total_programs": sum(len(r.programs) for r in results),
                "max_states": max((r.stats.states for r in results), default=0),
            }
        )
    return {
        "topology": name,
        "counts": list(topology.counts),
        "level_names": list(topology.level_names),
        "devices": topology.num_devices,
        "repeats": repeats,
        "configurations": rows,
    }


def summarise(bench: dict, goal: str) -> dict | None:
    rows = [r for r in bench["configurations"] if r["goal"] == goal]
    if not rows:
        return None
    times = [r["seconds"] for r in rows]
    slowest = max(rows, key=lambda r: r["seconds"])
    return {
        "topology": bench["topology"],
        "goal": goal,
        "configurations": len(rows),
        "median_s": statistics.median(times),
        "max_s": max(times),
        "worst_single_run_s": max(r["seconds_worst_run"] for r in rows),
        "median_cpu_s": statistics.median(r["cpu_seconds"] for r in rows),
        "max_cpu_s": max(r["cpu_seconds"] for r in rows),
        "slowest": slowest,
        "max_programs": max(r["max_programs"] for r in rows),
        "max_states": max(r["max_states"] for r in rows),
        "all_within_50ms": all(t <= TARGET_CONFIG_S for t in times),
        "over_50ms": sum(t > TARGET_CONFIG_S for t in times),
    }


# ---------------------------------------------------------------- large cases


def case_topology(case: str):
    if case == "rack":
        return load_topology("rack"), [Axis("a0", 64)]
    if case == "4096":
        return load_topology("dgx-a100").scaled({"node": 512}), [Axis("a0", 4096)]
    raise SystemExit(f"unknown case {case!r}")


def child_case(case: str, goal_name: str, use_tracemalloc: bool) -> None:
    """Body of the subprocess: measure one large case, print one JSON line."""
    goal = Goal(goal_name)
    topology, axes = case_topology(case)
    warm_up()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    c0 = time.process_time()
    t0 = time.perf_counter()
    placements = enumerate_placements(topology, axes)
    t1 = time.perf_counter()
    results = synthesize_all(placements, [a.name for a in axes], goal)
    t2 = time.perf_counter()
    c2 = time.process_time()
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {
        "case": case,
        "goal": goal.value,
        "topology": topology.name,
        "counts": list(topology.counts),
        "level_names": list(topology.level_names),
        "devices": topology.num_devices,
        "axes": {a.name: a.size for a in axes},
        "hierarchy": list(results[0].hierarchy.sizes),
        "placements": len(results),
        "seconds": t2 - t0,
        "z3_seconds": t1 - t0,
        "search_seconds": t2 - t1,
        "cpu_seconds": c2 - c0,
        "states": results[0].stats.states,
        "transitions": results[0].stats.transitions,
        "programs": results[0].stats.programs,
        "shortest_program_steps": min((len(p) for p in results[0].programs), default=None),
        "peak_rss_bytes": rss_after * 1024,
        "rss_before_bytes": rss_before * 1024,
        "rss_delta_bytes": (rss_after - rss_before) * 1024,
    }
    if use_tracemalloc:
        import tracemalloc

        clear_cache()
        tracemalloc.start()
        placements = enumerate_placements(topology, axes)
        synthesize_all(placements, [a.name for a in axes], goal)
        out["tracemalloc_peak_bytes"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    print(json.dumps(out))


def run_case(case: str, goal: Goal, use_tracemalloc: bool, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_case", case, goal.value]
    if use_tracemalloc:
        cmd.append("--tracemalloc")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"case": case, "goal": goal.value, "error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"case": case, "goal": goal.value, "error": f"exit {proc.returncode}: {' | '.join(tail)}"}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["subprocess_wall_s"] = time.perf_counter() - t0
    return result


def kxk_bits_bytes(k: int, devices: int) -> int:
    """Bytes of one state stored as a k x k bit matrix per device (P2's encoding)."""
    return k * k * devices // 8


# ---------------------------------------------------------------- output


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def describe_config(row: dict) -> str:
    sizes = ",".join(f"a{i}={s}" for i, s in enumerate(row["sizes"]))
    return f"axes {sizes} reduce {'+'.join(row['reduce'])}"


def table(header, rows) -> str:
    cells = [list(map(str, header))] + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine_info() -> dict:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_1min": os.getloadavg()[0],
    }


def code_info() -> dict:
    """Which code was measured: a digest of the sources of the synth modules the
    benchmark loads (other modules do not affect it) and, in a git checkout, the
    commit and whether those files have uncommitted changes."""
    import synth

    package = Path(synth.__file__).resolve().parent
    files = sorted(
        Path(module.__file__).resolve()
        for name, module in list(sys.modules.items())
        if (name == "synth" or name.startswith("synth.")) and getattr(module, "__file__", None)
    )
    digest = hashlib.sha256()
    for source in files:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    info = {
        "package": str(package),
        "modules": [f.name for f in files],
        "sources_sha256": digest.hexdigest()[:16],
    }
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=package, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *map(str, files)], cwd=package, capture_output=True, text=True, timeout=10
        )
        if head.returncode == 0:
            info["commit"] = head.stdout.strip()
            info["uncommitted_changes"] = bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def print_report(report: dict) -> None:
    m = report["machine"]
    c = report["code"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, Python {m['python']} ({m['platform']})")
    print(
        f"code: {c['package']} ({', '.join(c['modules'])}), sources sha256 {c['sources_sha256']}"
        + (f", commit {c['commit']}" if "commit" in c else "")
        + (" with uncommitted changes" if c.get("uncommitted_changes") else "")
    )
    if c.get("changed_during_run"):
        print("WARNING: the synth sources changed during the run; rerun for consistent numbers")
    print(
        f"1-min load average: {m['loadavg_1min']:.2f} at start, {report['loadavg_1min_end']:.2f} at end "
        "(other processes on the machine inflate wall-clock times; CPU time is this process only)"
    )
    print(
        f"max_steps={MAX_STEPS}; per configuration: median of {report['repeats']} cold runs "
        "(search cache cleared), placement enumeration + synthesis; one warm-up call first\n"
    )
    summaries = report["summaries"]
    rows = []
    for s in summaries:
        slow = s["slowest"]
        rows.append(
            [
                s["topology"],
                s["goal"],
                s["configurations"],
                fmt_ms(s["median_s"]),
                fmt_ms(s["max_s"]),
                fmt_ms(s["worst_single_run_s"]),
                f"{fmt_ms(s['median_cpu_s'])} / {fmt_ms(s['max_cpu_s'])}",
                f"{describe_config(slow)} ({slow['placements']} placements)",
                s["max_programs"],
                "yes" if s["all_within_50ms"] else f"NO ({s['over_50ms']} over)",
            ]
        )
    print("P2 configurations (all placements, all programs, max 5 steps)")
    print(
        table(
            ["topology", "goal", "configs", "median", "max", "worst run", "CPU median / max",
             "slowest configuration",
             "max programs/placement", "all <= 50 ms"],
            rows,
        )
    )
    print(
        f"\nP2 reported up to {P2_SECONDS_PER_CONFIG} s per configuration; slowest here: "
        f"{fmt_ms(max(s['max_s'] for s in summaries))}\n"
    )
    rows = []
    for c in report["large_cases"]:
        name = "rack 2x4x2x4" if c["case"] == "rack" else "node x512, gpu x8"
        if "error" in c:
            rows.append([name, c["goal"], "-", "-", "-", "-", "-", c["error"]])
            continue
        mem = fmt_bytes(c["rss_delta_bytes"])
        if "tracemalloc_peak_bytes" in c:
            mem += f" (tracemalloc {fmt_bytes(c['tracemalloc_peak_bytes'])})"
        rows.append(
            [
                name,
                c["goal"],
                "x".join(map(str, c["hierarchy"])),
                f"{c['seconds']:.2f} s (CPU {c['cpu_seconds']:.2f} s)",
                c["states"],
                c["programs"],
                mem,
                fmt_bytes(c["peak_rss_bytes"]),
            ]
        )
    print("Large cases (fresh subprocess each, one run, max 5 steps)")
    print(
        table(
            ["case", "goal", "hierarchy", "time", "states", "programs", "peak RSS delta",
             "peak RSS (process)"],
            rows,
        )
    )
    for c in report["large_cases"]:
        if c["case"] == "4096" and "error" not in c:
            per_state = kxk_bits_bytes(c["devices"], c["devices"])
            print(
                f"\n4096 {c['goal']}: k x k bits per device would be "
                f"{c['devices']}*{c['devices']} bits * {c['devices']} devices = "
                f"{fmt_bytes(per_state)} per state, {fmt_bytes(per_state * c['states'])} for "
                f"its {c['states']} states; measured peak RSS delta {fmt_bytes(c['rss_delta_bytes'])}"
            )


# ---------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a subset: allreduce only, fewer configurations and runs")
    parser.add_argument(
        "--json", nargs="?", const="-", metavar="FILE",
        help="machine output: alone, print one JSON document instead of the tables; "
        "with FILE, write it there and print the tables too",
    )
    parser.add_argument("--repeats", type=int, default=None, help="runs per configuration (default 5, quick 2)")
    parser.add_argument("--tracemalloc", action="store_true", help="also report the tracemalloc peak of the large cases")
    parser.add_argument("--case-timeout", type=float, default=600, help="seconds allowed per large case")
    parser.add_argument("--_case", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args._case:
        child_case(args._case[0], args._case[1], args.tracemalloc)
        return 0

    repeats = args.repeats or (2 if args.quick else 5)
    goals = (Goal.ALLREDUCE,) if args.quick else GOALS
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    machine = machine_info()
    code = code_info()
    warm_up()
    benches = []
    for name in ("p2-a100", "p2-v100"):
        log(f"timing {name} configurations ...")
        benches.append(bench_topology(name, goals, repeats, args.quick))
    summaries = [s for b in benches for g in goals if (s := summarise(b, g.value))]

    large = []
    cases = [("rack", g) for g in goals] + [("4096", g) for g in goals]
    for case, goal in cases:
        log(f"running {case} {goal.value} in a subprocess ...")
        large.append(run_case(case, goal, args.tracemalloc, args.case_timeout))

    if code_info()["sources_sha256"] != code["sources_sha256"]:
        code["changed_during_run"] = True
    report = {
        "machine": machine,
        "code": code,
        "command": " ".join(["python", "scripts/bench_synthesis.py", *(argv if argv is not None else sys.argv[1:])]),
        "max_steps": MAX_STEPS,
        "repeats": repeats,
        "statistic": "median over repeats per configuration",
        "summaries": summaries,
        "large_cases": large,
        "loadavg_1min_end": os.getloadavg()[0],
        "targets": {
            "p2_config_s": TARGET_CONFIG_S,
            "rack_s": TARGET_RACK_S,
            "rack_bytes": TARGET_RACK_BYTES,
            "p2_paper_s_per_config": P2_SECONDS_PER_CONFIG,
        },
        "configurations": benches,
    }
    if args.json == "-":
        print(json.dumps(report, indent=1))
        return 0
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
