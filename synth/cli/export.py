"""``synth-reduce export PLAN --format F``: files and arguments other stacks take.

    synth-reduce export plan.json --format rank-map [--order tp-dp-pp] [--json]
    synth-reduce export job.json --format megatron      # Megatron-LM arguments + renumbering
    synth-reduce export job.json --format torchtitan    # [parallelism] TOML + overrides
    synth-reduce export plan.json --format jax [--hierarchical]
    synth-reduce export plan.json --format msccl --out DIR   # MSCCL algorithm XMLs, each checked
    synth-reduce export plan.json --format nccl-tuner [--out rules.csv]   # NCCL example tuner plugin rules
    synth-reduce export plan.json --format nccl-env     # NCCL_ALGO / NCCL_PROTO per collective

Text on stdout (or ``--out FILE``, written whole or not at all); ``--json``
prints one JSON document instead. The plan is loaded as for execution (its
stored steps checked against the derivation of its programs); every group an
export implies is checked against the plan before anything is printed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from ..cost.pipeline import predict_pipelined
from ..documents import check_writable, write_text
from ..errors import SynthError
from ..export.jax_mesh import jax_export, jax_text
from ..export.megatron import megatron_export, megatron_text
from ..export.msccl import plan_files, shadowed
from ..export.msccl_check import check_algorithm
from ..export.nccl_tuner import check_tuner_csv, nccl_env, plan_rules, tuner_csv
from ..export.rank_map import RankMap, launch_command, parse_order, rank_map
from ..export.torchtitan import torchtitan_export, torchtitan_text
from ..export.trainer import parse_axis_names
from ..plan import load_plan
from ..runtime.meshes import devices_per_node
from ..topology import Topology
from ..units import format_seconds, format_size
from .args import Parser, add_model_arguments, model_of

FORMATS = ("rank-map", "megatron", "torchtitan", "jax", "msccl", "nccl-tuner", "nccl-env")


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
    p.add_argument("--reduce", metavar="AXES", help="msccl: export only the reductions over these axes (e.g. dp)")
    p.add_argument("--instances", type=int, default=None, metavar="N",
                   help="msccl: channels per step, pieces dealt over them (thread blocks in parallel; default: the "
                        "count the cost model prices cheapest for each file)")
    add_model_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.add_argument("--out", help="write to this file instead of stdout (msccl: the folder for the XML files)")
    args = p.parse_args(argv)
    if args.out and args.format != "msccl":
        check_writable(args.out, "--out")
    if args.format == "msccl" and not args.out:
        p.error("--format msccl writes one XML per reduction and size range: give --out DIR")
    if args.order and args.format != "rank-map":
        p.error("--order applies to --format rank-map only")
    if args.axis_names and args.format not in ("megatron", "torchtitan"):
        p.error("--axis-names applies to --format megatron and torchtitan only")
    if args.reduce and args.format != "msccl":
        p.error("--reduce applies to --format msccl only")
    if args.instances is not None and args.format != "msccl":
        p.error("--instances applies to --format msccl only")
    if args.hierarchical and args.format != "jax":
        p.error("--hierarchical applies to --format jax only")
    names = parse_axis_names(args.axis_names)
    if args.format == "msccl":
        return _msccl(args)
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
    elif args.format in ("nccl-tuner", "nccl-env"):
        rules = plan_rules(plan, model_of(args))
        csv = tuner_csv(rules, args.plan)
        check_tuner_csv(csv, f"{args.format} export")  # as the plugin reads it, before anything is written
        env = nccl_env(rules)
        doc = {"format": args.format, "rules": [r.to_dict() for r in rules], "env": env}
        text = csv if args.format == "nccl-tuner" else "".join(f"export {k}=\"{v}\"\n" for k, v in env.items())
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


def _msccl(args) -> int:
    """``--format msccl --out DIR``: one MSCCL algorithm XML per reduction and
    size range (synth.export.msccl), each run by the independent checker
    (synth.export.msccl_check) before anything is written."""
    folder = Path(args.out)
    if folder.exists() and not folder.is_dir():
        raise SynthError(f"--out {args.out}: not a folder (--format msccl writes one file per algorithm)")
    if not folder.exists() and not folder.parent.is_dir():
        raise SynthError(f"--out {args.out}: its parent folder {folder.parent} does not exist")
    plan = load_plan(args.plan)
    model = model_of(args)
    files = plan_files(plan, [a.strip() for a in args.reduce.split(",")] if args.reduce else None, model,
                       args.instances)
    checked = [check_algorithm(f.algorithm.xml(), f.name) for f in files]  # all of them before writing any
    folder.mkdir(exist_ok=True)
    for f in files:
        check_writable(folder / f.name, "--out")
    for f in files:
        write_text(folder / f.name, "MSCCL XML", f.algorithm.xml())
    prices = [predict_pipelined(f.lowered, f.reduction, f.size_bytes, f.algorithm.pieces, model) for f in files]
    if args.json:
        print(json.dumps({"plan": args.plan, "format": "msccl", "folder": str(folder), "files": [
            {**f.to_dict(), "checked": c.to_dict(), "predicted": {
                "size_bytes": f.size_bytes, "step_by_step_s": price.step_by_step_s,
                "pipelined_s": price.pipelined_s, "as_written_s": f.price.seconds}}
            for f, c, price in zip(files, checked, prices)]}, indent=1))
        return 0
    for f, c, price in zip(files, checked, prices):
        a = f.algorithm
        high = "unbounded" if not a.max_bytes else f"{a.max_bytes} B"
        print(f"wrote {folder / f.name}: {a.coll} on {a.ngpus} ranks, {a.proto}, {a.min_bytes} B..{high}, "
              f"{a.pieces} piece(s) per chunk on {a.instances} channel(s) per step, nchunksperloop "
              f"{a.nchunksperloop}, {c.thread_blocks} thread blocks, {c.steps} steps; checked "
              f"{' and '.join(c.modes)} and its flow control at {len(c.flow_sizes)} size(s); predicted at "
              f"{format_size(f.size_bytes)}: {format_seconds(f.price.seconds)} as written, "
              f"{format_seconds(price.pipelined_s)} pipelined on NCCL's channels, "
              f"{format_seconds(price.step_by_step_s)} step by step")
    print(f"load with: NCCL_MSCCL_ENABLE=1 MSCCL_ALGO_DIR={folder} (the MSCCL executor build of NCCL; "
          "docs/nccl-programs.md)")
    for first, other in shadowed(files):
        print(f"warning: {first.name} and {other.name} are both {first.algorithm.coll} on {first.algorithm.ngpus} "
              f"ranks over overlapping sizes; the executor takes {first.name} for both communicators (export one "
              "reduction per folder with --reduce, and give each process the folder of its busiest communicator)",
              file=sys.stderr)
    return 0
