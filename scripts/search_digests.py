#!/usr/bin/env python3
"""The search alone on a fixed set of hierarchies: states, programs, a digest of the programs, CPU seconds.

Each search runs cold in a fresh process (``synth.synthesis.search.search``,
no placement, no cost model) on the checkout ``--tree``, and, with
``--baseline DIR``, on that checkout too, alternating search by search. The
table says whether the two give the same programs: the digest is the SHA-256
of the program count and every program with its loads, in the search's
order. The states can differ, since a stronger lookahead keeps fewer. The
CPU seconds cover the search and listing its programs (for the digest), and
the ratio is before / after, measured side by side, shown from 0.1 s
(docs/performance.md, "The search alone"). Exit status 1 when some search's programs differ.

Usage::

    python scripts/search_digests.py                          # this checkout
    python scripts/search_digests.py --baseline /tmp/before   # and a baseline, side by side
    python scripts/search_digests.py --quick                  # the searches under a second or so
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_scaling import _code  # noqa: E402

#: (sizes, goal, max steps, quick): 30 to 4,096 devices, the three goals, device, chunk and absolute frames
SEARCHES = [
    ((8, 8, 8), "allreduce", 5, True),
    ((4, 4, 4, 4, 2), "allreduce", 5, False),
    ((16, 32), "allreduce", 6, True),
    ((64, 8), "reducescatter", 5, True),
    ((8, 8, 8), "reducescatter", 5, True),
    ((4, 4, 4, 4, 4), "allreduce", 4, False),
    ((2, 4, 2, 4, 4), "allreduce", 5, False),
    ((8, 8, 16), "allreduce", 4, True),
    ((512, 2), "allreduce", 5, True),
    ((4, 4, 4, 4, 4), "reducescatter", 4, False),
    ((16, 8, 8), "allgather", 4, True),
    ((1024,), "allreduce", 6, True),
    ((4, 4, 4, 4, 4), "allreduce", 5, False),
]

CHILD = """
import hashlib, json, resource, sys, time
sys.path.insert(0, {tree!r})
import synth
assert synth.__file__.startswith({tree!r}), synth.__file__
from synth.synthesis.search import search
from synth.synthesis.semantics import Goal
started = time.process_time()
found = search({sizes!r}, Goal({goal!r}), {steps!r})
digest = hashlib.sha256(repr((found.count, found.indices)).encode()).hexdigest()[:16]
print(json.dumps({{"states": found.states, "programs": found.count, "digest": digest,
                  "cpu_s": round(time.process_time() - started, 2),
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}}))
"""


def run(tree: str, sizes: tuple[int, ...], goal: str, steps: int, timeout: float) -> dict:
    """One cold search in a fresh process; ``{"error": ...}`` if it fails or runs past ``timeout``."""
    code = CHILD.format(tree=tree, sizes=sizes, goal=goal, steps=steps)
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONHASHSEED": "0"})
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout:g} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1][:120]}
    return json.loads(done.stdout)


def _cell(r: dict) -> str:
    if "error" in r:
        return f"{r['error']} | | | "
    return f"{r['states']} | {r['programs']} | {r['digest']} | {r['cpu_s']} s, {r['peak_rss_mib']} MiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tree", default=str(REPO), help="checkout whose synth package runs (default: this one)")
    p.add_argument("--baseline", metavar="DIR", help="also run every search on this checkout, side by side")
    p.add_argument("--quick", action="store_true", help="only the searches that take about a second or less")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a search is given up (default 300)")
    args = p.parse_args(argv)
    trees = [args.tree] + ([args.baseline] if args.baseline else [])
    print("# " + "; ".join(f"{name}: {_code(t)}" for name, t in zip(("after", "before"), trees)))
    head = "| search | states | programs | digest | CPU, peak RSS |"
    if args.baseline:
        head += " before: states | programs | digest | CPU, peak RSS | same programs | CPU before / after |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    same_everywhere = True
    for sizes, goal, steps, quick in SEARCHES:
        if args.quick and not quick:
            continue
        results = []
        for tree in trees:
            results.append(run(tree, sizes, goal, steps, args.timeout))
            print(f"{'x'.join(map(str, sizes))} {goal} {steps} steps [{tree}]: {_cell(results[-1])}", file=sys.stderr,
                  flush=True)
        row = f"| {'x'.join(map(str, sizes))} {goal}, {steps} steps | {_cell(results[0])} |"
        if args.baseline:
            after, before = results
            same = "error" not in after and "error" not in before and after["digest"] == before["digest"]
            same_everywhere &= same
            timed = same and min(after["cpu_s"], before["cpu_s"]) >= 0.1  # a ratio of hundredths says nothing
            ratio = f"{before['cpu_s'] / after['cpu_s']:.1f}x" if timed else ""
            row += f" {_cell(before)} | {'yes' if same else 'NO'} | {ratio} |"
        print(row, flush=True)
    return 0 if same_everywhere else 1


if __name__ == "__main__":
    sys.exit(main())
