"""``synth-reduce draw PLAN --out F.svg|png``: a picture of a plan (placement
and programs; synth.cli.drawing).

    synth-reduce draw plan.json --out plan.svg
    synth-reduce draw job.json --out job.png --size 64MiB

Needs matplotlib (``pip install matplotlib``, or the ``plots`` extra).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..documents import check_writable
from ..plan import load_plan
from ..units import parse_size
from .args import Parser, add_model_arguments, model_of
from .drawing import draw_plan

SUFFIXES = (".svg", ".png", ".pdf")


def run(argv: Sequence[str]) -> int:
    p = Parser(prog="synth-reduce draw",
               description="Draw a plan: each axis' groups on the hierarchy, each program as its steps on "
                           "sub-groups, a job plan's sizes and step split.")
    p.add_argument("plan", help="plan JSON (synth-reduce --out, tune or plan)")
    p.add_argument("--out", required=True, help="the picture: .svg, .png or .pdf")
    p.add_argument("--size", help="bytes per device the steps are drawn for (default: the size the plan's program "
                                  "was predicted for, else 256MiB)")
    add_model_arguments(p)
    args = p.parse_args(argv)
    if Path(args.out).suffix.lower() not in SUFFIXES:
        p.error(f"--out {args.out}: give a file ending in {', '.join(SUFFIXES)}")
    check_writable(args.out, "--out")
    size = parse_size(args.size, "--size") if args.size else None
    plan = load_plan(args.plan)
    draw_plan(plan, args.out, model_of(args), size)
    print(f"wrote {args.out}")
    return 0
