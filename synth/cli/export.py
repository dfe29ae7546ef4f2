"""``synth-reduce export PLAN --format F``: files and arguments other stacks take.

    synth-reduce export plan.json --format rank-map [--order tp-dp-pp] [--json]
    synth-reduce export job.json --format megatron      # Megatron-LM arguments + renumbering
    synth-reduce export job.json --format torchtitan    # [parallelism] TOML + overrides
    synth-reduce export plan.json --format jax [--hierarchical]

Text on stdout (or ``--out FILE``, written whole or not at all); ``--json``
prints one JSON document instead. The plan is loaded as for execution (its
stored steps checked against the derivation of its programs); every group an
export implies is checked against the plan before anything is printed.
"""

from __future__ import annotations

import json
from typing import Sequence

from ..documents import check_writable, write_text
from ..export.jax_mesh import jax_export, jax_text
from ..export.megatron import megatron_export, megatron_text
from ..export.rank_map import RankMap, launch_command, parse_order, rank_map
from ..export.torchtitan import torchtitan_export, torchtitan_text
from ..export.trainer import parse_axis_names
from ..plan import load_plan
from ..runtime.meshes import devices_per_node
from ..topology import Topology
from .args import Parser

FORMATS = ("rank-map", "megatron", "torchtitan", "jax")


def rank_map_text(ranks: RankMap, plan_path: str, topology: Topology, launch: str) -> str:
    per_node = devices_per_node(topology)
    lines = [f"# rank map of {plan_path}: order {ranks.order_text} (first fastest), sizes "
             + " ".join(f"{a}={s}" for a, s in zip(ranks.order, ranks.sizes)),
             "# rank r runs on device device_of_rank[r]; device d is node d // "
             f"{per_node}, local rank d % {per_node}",
             f"order = {ranks.order_text}",
             f"device_of_rank = {list(ranks.device_of_rank)}",
             f"rank_of_device = {list(ranks.rank_of_device)}"]
    if ranks.is_identity:
        lines.append("# the identity: torchrun's ranks already form the plan's groups")
    else:
        lines.append(f"# launch: {launch}")
    return "\n".join(lines) + "\n"


def run(argv: Sequence[str]) -> int:
    p = Parser(prog="synth-reduce export",
               description="Write what other stacks take from a plan: the rank map, Megatron-LM arguments, "
                           "torchtitan settings, a JAX device array.")
    p.add_argument("plan", help="plan JSON (synth-reduce --out, tune or plan)")
    p.add_argument("--format", required=True, choices=FORMATS, help="what to write")
    p.add_argument("--order", help="rank-map: axes in trainer rank order, first fastest, e.g. tp-dp-pp "
                                   "(default: Megatron's tp-cp-ep-dp-pp where the axes have those names, else the "
                                   "plan's last axis fastest)")
    p.add_argument("--axis-names", metavar="AXIS=NAME,...",
                   help="megatron, torchtitan: trainer names of the plan's axes, e.g. mp=tp")
    p.add_argument("--hierarchical", action="store_true", help="jax: one mesh axis per level an axis spans")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.add_argument("--out", help="write to this file instead of stdout")
    args = p.parse_args(argv)
    if args.out:
        check_writable(args.out, "--out")
    if args.order and args.format != "rank-map":
        p.error("--order applies to --format rank-map only")
    if args.axis_names and args.format not in ("megatron", "torchtitan"):
        p.error("--axis-names applies to --format megatron and torchtitan only")
    if args.hierarchical and args.format != "jax":
        p.error("--hierarchical applies to --format jax only")
    names = parse_axis_names(args.axis_names)
    plan = load_plan(args.plan)
    topology = plan.placement.topology
    if args.format == "rank-map":
        axes = [a.name for a in plan.placement.axes]
        ranks = rank_map(plan.placement, parse_order(args.order, axes) if args.order else None)
        launch = launch_command(topology, args.plan, "<script> <args>")
        doc, text = {"format": "rank-map", **ranks.to_dict()}, rank_map_text(ranks, args.plan, topology, launch)
    elif args.format == "megatron":
        export = megatron_export(plan, names)
        launch = launch_command(topology, args.plan, "pretrain_gpt.py <the arguments above>")
        doc, text = export.to_dict(), megatron_text(export, args.plan, launch)
    elif args.format == "torchtitan":
        export = torchtitan_export(plan, names)
        launch = launch_command(topology, args.plan, "<train script> <args>")
        doc, text = export.to_dict(), torchtitan_text(export, args.plan, launch)
    else:
        export = jax_export(plan, args.hierarchical)
        doc, text = export.to_dict(), jax_text(export, args.plan)
    out = json.dumps({"plan": args.plan, **doc}, indent=1) + "\n" if args.json else text
    if args.out:
        write_text(args.out, f"{args.format} export", out)
        print(f"wrote {args.format} export -> {args.out}")
    else:
        print(out, end="")
    return 0
