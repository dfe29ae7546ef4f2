"""``synth-reduce launch PLAN -- SCRIPT ARGS...``: run a training script under
torchrun with its rank renumbered by the plan's rank map, so that a trainer
forming groups from rank order (Megatron-LM, torchtitan) forms the plan's.

    torchrun --nnodes N --nproc-per-node P --node-rank I -m synth.cli launch job.json -- pretrain_gpt.py ...
    torchrun --nproc-per-node 8 -m synth.cli launch plan.json --order tp-dp-pp -- -m my.trainer ...

Node rank = the plan's node index, as for every launch of a plan; a launch of
another shape than the plan's nodes x devices per node is refused (every rank on
one host passes: a test). The process
on device ``d`` (torchrun's rank) gets ``RANK = rank_of_device[d]``
(:func:`synth.export.rank_map.launch_environment`), then the script runs in
this process as ``__main__`` (``-m MODULE`` runs a module). Nothing of torch
is imported here.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Sequence

from ..errors import SynthError
from ..export.rank_map import launch_environment, parse_order, rank_map
from ..plan import load_plan
from ..runtime.meshes import launch_shape_problem
from .args import Parser


def run(argv: Sequence[str]) -> int:
    argv = list(argv)
    script = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    p = Parser(prog="synth-reduce launch",
               description="Run a training script under torchrun with RANK renumbered by the plan's rank map.",
               epilog="everything after -- is the script (or -m MODULE) and its arguments")
    p.add_argument("plan", help="plan JSON (synth-reduce --out, tune or plan)")
    p.add_argument("--order", help="axes in the trainer's rank order, first fastest (default as export --format "
                                   "rank-map: tp-cp-ep-dp-pp)")
    args = p.parse_args(own)
    if not script or script == ["-m"]:
        p.error("give the script after --, e.g. synth-reduce launch plan.json -- train.py --steps 10")
    plan = load_plan(args.plan)
    shape = launch_shape_problem(plan.placement.topology, os.environ)
    if shape is not None:
        raise SynthError(shape)
    axes = [a.name for a in plan.placement.axes]
    ranks = rank_map(plan.placement, parse_order(args.order, axes) if args.order else None)
    os.environ.update(launch_environment(ranks, os.environ))
    if script[0] == "-m":
        sys.argv = [script[1], *script[2:]]
        runpy.run_module(script[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(script)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script[0])))  # as python SCRIPT does
        runpy.run_path(script[0], run_name="__main__")
    return 0
