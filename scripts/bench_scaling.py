#!/usr/bin/env python3
"""Scaling benchmark of the main command: CPU time and peak memory per point.

Each point is one ``synth-reduce`` command (the main command: placements,
synthesis, prediction, verification of the listed programs, output) run in a
fresh Python process; the parent reads the child's CPU time (user + system, z3's
threads included) and peak resident set size (``ru_maxrss``) from ``wait4``. A
point that runs past ``--timeout`` seconds is killed and reported as such. The
curves (docs/performance.md):

* ``axes``: ``--json`` (every program listed, lowered and verified) on p2-a100
  with three axes, dgx-a100 ``dp=16,mp=8``, and the README's table;
* ``devices``: dgx-a100 scaled to N nodes, ``dp=N,mp=8`` reduced over dp, and
  one axis over all 8N devices (tables: the top 3 programs per placement,
  verified);
* ``depth``: one axis over every device of an L-level hierarchy of 2s or 4s
  (generated topologies), 5 steps;
* ``steps``: rack (2x4x2x4), one axis over its 64 devices, ``--max-steps`` 5..8;
* ``targets``: the scale targets of docs/performance.md (dgx-h100 scaled to
  16,384 nodes with ``dp=16384,mp=8`` and with ``dp=131072``; five and six
  levels of 4, one axis).

Each tree's ``synth`` modules are compiled once before the first point
(``compileall``), as a wheel install does and as an editable install does on
its first run: where ``PYTHONDONTWRITEBYTECODE`` is set (these machines),
every command would otherwise compile synth's 40-odd modules again, about
0.1 s that an installed program does not spend.

``--baseline DIR`` runs every point also on another checkout (e.g. a ``git
worktree`` of an older commit), the two commands one after the other, point by
point, in one run, and prints the side-by-side table of docs/performance.md with
the ratio. ``--tree DIR`` runs the commands of another checkout alone; the
default is this one. Results go to stdout as a table and, with ``--json FILE``,
to a JSON file; ``--compare BEFORE.json AFTER.json`` prints the side-by-side
table of two such files.

    git worktree add /tmp/before <commit>
    python scripts/bench_scaling.py --baseline /tmp/before --json both.json
    python scripts/bench_scaling.py --json after.json --only devices
    python scripts/bench_scaling.py --compare before.json after.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

LEVEL = {"bandwidth_GBps": 25.0, "latency_us": 2.0}  # illustrative: the numbers do not change the work


def _topology(path: Path, name: str, sizes: list[int]) -> str:
    lines = [f"name: {name}", f"description: {len(sizes)} levels {'x'.join(map(str, sizes))}", "levels:"]
    for i, size in enumerate(sizes):
        lines += [f"  - name: l{i}", f"    count: {size}", f"    bandwidth_GBps: {LEVEL['bandwidth_GBps']}",
                  f"    latency_us: {LEVEL['latency_us']}"]
    file = path / f"{name}.yaml"
    file.write_text("\n".join(lines) + "\n")
    return str(file)


def points(workdir: Path) -> list[tuple[str, str, list[str]]]:
    """(curve, label, synth-reduce arguments) for every point."""
    out = [
        ("axes", "p2-a100 a=4,b=2,c=8 reduce a,c --json", ["--topology", "p2-a100", "--axes", "a=4,b=2,c=8",
                                                           "--reduce", "a,c", "--json"]),
        ("axes", "dgx-a100 dp=16,mp=8 --json", ["--topology", "dgx-a100", "--axes", "dp=16,mp=8", "--json"]),
        ("axes", "p2-a100 dp=4,mp=16 reduce dp (README table)", ["--topology", "p2-a100", "--axes", "dp=4,mp=16",
                                                                 "--reduce", "dp"]),
    ]
    for n in (16, 64, 256, 1024, 4096):
        out.append(("devices", f"dgx-a100 node={n} dp={n},mp=8 reduce dp ({8 * n} GPUs)",
                    ["--topology", "dgx-a100", "--scale", f"node={n}", "--axes", f"dp={n},mp=8", "--reduce", "dp"]))
    for n in (256, 1024, 4096):
        out.append(("devices", f"dgx-a100 node={n} dp={8 * n} ({8 * n} GPUs)",
                    ["--topology", "dgx-a100", "--scale", f"node={n}", "--axes", f"dp={8 * n}"]))
    for base in (2, 4):
        for depth in (3, 4, 5):
            sizes = [base] * depth
            n = base**depth
            topology = _topology(workdir, f"levels-{base}x{depth}", sizes)
            out.append(("depth", f"{depth} levels of {base} ({n} devices), one axis, 5 steps",
                        ["--topology", topology, "--axes", f"x={n}"]))
    # the scale targets (CPU seconds): 131,072 GPUs in 5 s, one axis over them in
    # 10 s, five levels of 4 in 5 s, six levels of 4 in 20 s
    out.append(("targets", "dgx-h100 node=16384 dp=16384,mp=8 (131072 GPUs; target 5 s)",
                ["--topology", "dgx-h100", "--scale", "node=16384", "--axes", "dp=16384,mp=8"]))
    out.append(("targets", "dgx-h100 node=16384 dp=131072 (target 10 s)",
                ["--topology", "dgx-h100", "--scale", "node=16384", "--axes", "dp=131072"]))
    for depth, target in ((5, 5), (6, 20)):
        topology = _topology(workdir, f"levels-4x{depth}", [4] * depth)
        out.append(("targets", f"{depth} levels of 4 ({4**depth} devices), one axis (target {target} s)",
                    ["--topology", topology, "--axes", f"x={4**depth}"]))
    for steps in (5, 6, 7, 8):
        out.append(("steps", f"rack 2x4x2x4 x=64 --max-steps {steps}",
                    ["--topology", "rack", "--axes", "x=64", "--max-steps", str(steps)]))
    return out


CHILD = (
    "import sys; sys.path.insert(0, {tree!r}); import synth; "
    "assert synth.__file__.startswith({tree!r}), synth.__file__; "
    "from synth import cli; sys.argv = ['synth-reduce'] + {argv!r}; "
    "sys.exit(getattr(cli, 'console', cli.main)())"  # the installed program's entry (older trees: main)
)


def run_point(tree: str, argv: list[str], timeout: float) -> dict:
    """One command in a fresh process: exit code, CPU seconds, peak RSS."""
    code = CHILD.format(tree=tree, argv=argv)
    started = time.monotonic()
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             start_new_session=True)
    timed_out = False
    while True:
        pid, status, usage = os.wait4(child.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - started > timeout:
            os.killpg(child.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(child.pid, 0)
            timed_out = True
            break
        time.sleep(0.05)
    stderr = child.stderr.read().decode(errors="replace") if child.stderr else ""
    child.returncode = os.waitstatus_to_exitcode(status)
    return {
        "exit": child.returncode,
        "timed_out": timed_out,
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "wall_s": round(time.monotonic() - started, 3),
        "peak_rss_bytes": usage.ru_maxrss * 1024,
        "error": "" if child.returncode == 0 or timed_out else stderr.strip().splitlines()[-1][:200],
    }


def _fmt_s(point: dict) -> str:
    if point["timed_out"]:
        return f"> {point['cpu_s']:.0f} s (killed at {point['wall_s']:.0f} s wall)"
    text = f"{point['cpu_s']:.2f} s"
    return text if point["exit"] == 0 else f"{text}, exit {point['exit']}"


def _fmt_mb(point: dict) -> str:
    return f"{point['peak_rss_bytes'] / 2**20:.0f} MiB"


def print_table(results: dict) -> None:
    print(f"# {results['label']}: {results['machine']}; load {results['load_start']} -> {results['load_end']}")
    for p in results["points"]:
        print(f"{p['curve']:<8} {p['label']:<60} {_fmt_s(p):>22} {_fmt_mb(p):>10}"
              + (f"  [{p['error']}]" if p["error"] else ""))


def compare(before: dict, after: dict) -> None:
    """The side-by-side table of docs/performance.md (markdown)."""
    print(f"before: {before['label']} ({before['code']}); after: {after['label']} ({after['code']})")
    print(f"machine: {after['machine']}; load average before run {before['load_start']} -> {before['load_end']}, "
          f"after run {after['load_start']} -> {after['load_end']}\n")
    print("| curve | point | before: CPU | before: peak RSS | after: CPU | after: peak RSS | CPU before / after |")
    print("|---|---|---|---|---|---|---|")
    by_label = {p["label"]: p for p in before["points"]}
    for p in after["points"]:
        b = by_label.get(p["label"])
        if b is None:
            continue
        ratio = ""
        if not p["timed_out"] and p["exit"] == 0 and p["cpu_s"] > 0:  # a killed point's CPU time is a lower bound
            ratio = f"{'>' if b['timed_out'] else ''}{b['cpu_s'] / p['cpu_s']:.1f}x"
        note = f" ({b['error']})" if b["error"] else ""
        print(f"| {p['curve']} | {p['label']} | {_fmt_s(b)}{note} | {_fmt_mb(b)} | {_fmt_s(p)} | {_fmt_mb(p)} | "
              f"{ratio} |")


def _code(tree: str) -> str:
    try:
        head = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "synth"], capture_output=True,
                               text=True).stdout.strip()
        return head + (" + uncommitted changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", default=str(REPO), help="checkout whose synth package runs (default: this one)")
    p.add_argument("--baseline", metavar="DIR", help="also run every point on this checkout, side by side")
    p.add_argument("--label", default=None, help="name of this run (default: the tree's commit)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds before a point is killed (default 150)")
    p.add_argument("--only", default="", help="comma-separated curves to run (axes, devices, depth, steps, targets)")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="print the side-by-side table")
    args = p.parse_args(argv)
    if args.compare:
        compare(*(json.loads(Path(f).read_text()) for f in args.compare))
        return 0
    trees = [str(Path(args.tree).resolve())]
    if args.baseline:
        trees.insert(0, str(Path(args.baseline).resolve()))
    curves = {c for c in args.only.split(",") if c}
    machine = (f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, Python "
               f"{platform.python_version()}")
    runs = [{"label": (args.label if args.label and tree == trees[-1] else None) or _code(tree), "code": _code(tree),
             "tree": tree, "machine": machine, "load_start": round(os.getloadavg()[0], 1), "points": []}
            for tree in trees]
    for tree in trees:  # as an installed program runs: its modules compiled once (see the module's docstring)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(tree) / "synth")], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        for curve, label, cmd in points(Path(tmp)):
            if curves and curve not in curves:
                continue
            for results in runs:  # the baseline first, then this tree: side by side, point by point
                print(f"{curve}: {label} [{results['label']}] ...", file=sys.stderr, flush=True)
                point = {"curve": curve, "label": label, "argv": cmd, **run_point(results["tree"], cmd, args.timeout)}
                results["points"].append(point)
                print(f"  {_fmt_s(point)}, {_fmt_mb(point)}", file=sys.stderr, flush=True)
    for results in runs:
        results["load_end"] = round(os.getloadavg()[0], 1)
        print_table(results)
    if len(runs) == 2:
        print()
        compare(*runs)
    if args.json:
        document = runs[0] if len(runs) == 1 else {"before": runs[0], "after": runs[1]}
        Path(args.json).write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
