"""``synth-reduce verify PLAN``: check a plan file against the derivation of its
programs and prove every program (numpy reference and z3). ``synth-reduce
verify FILE.xml``: check an MSCCL algorithm XML (any, not only ours) with the
chunk-level interpreter (:mod:`synth.export.msccl_check`)."""

from __future__ import annotations

import json
from typing import Sequence

from ..plan import load_plan, verify_plan
from ..synthesis.language import format_program
from .args import Parser


def run(argv: Sequence[str]) -> int:
    p = Parser(prog="synth-reduce verify", description="Re-prove a plan file (numpy reference and z3), or check an "
               "MSCCL algorithm XML (.xml) by running it on symbolic chunks: its format as the MSCCL executor reads "
               "it, connections, dependencies, deadlock, and the collective's result in every mode it declares.")
    p.add_argument("plan", help="plan JSON written by synth-reduce --out, tune or plan; or an MSCCL XML (.xml)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    args = p.parse_args(argv)
    if args.plan.endswith(".xml"):
        return _verify_xml(args.plan, args.json)
    plan = load_plan(args.plan)
    verifications = iter(verify_plan(plan, args.plan))
    rows = []
    for planned in plan.reductions:
        for program in planned.programs:
            v = next(verifications)
            rows.append({
                "collective": planned.reduction.goal.value,
                "reduce": list(planned.reduction.axes),
                "min_bytes": program.min_bytes,
                "max_bytes": program.max_bytes,
                "program": format_program(program.program),
                "numpy_elements": v.elements_checked,
                "numpy": v.numpy_scope,
                "z3": v.proof.scope,
                "z3_obligations": v.proof.obligations,
            })
    if args.json:
        summary = {"plan": args.plan, "verified": True, "programs": rows}
        if len(rows) == 1:  # a plan of one program: its fields at the top level too
            summary.update({k: v for k, v in rows[0].items() if k not in ("min_bytes", "max_bytes")})
        print(json.dumps(summary, indent=1))
        return 0
    placement = plan.placement.describe()
    for row in rows:
        sizes = "" if len(rows) == 1 else (
            f" for buffers of {row['min_bytes']}..{row['max_bytes'] if row['max_bytes'] is not None else 'any'} bytes")
        print(
            f"{args.plan}: verified {row['collective']} over {','.join(row['reduce'])} on {placement}{sizes}\n"
            f"  program: {row['program'].replace(chr(10), ' ; ')}\n"
            f"  numpy reference: {row['numpy_elements']} output elements exact ({row['numpy']}); "
            + (f"z3: {row['z3']}" if row["z3"].startswith("skipped") else
               f"z3: proved for all inputs ({row['z3']}, {row['z3_obligations']} obligations)")
        )
    return 0


def _verify_xml(path: str, as_json: bool) -> int:
    from ..export.msccl_check import check_file

    result = check_file(path)
    if as_json:
        print(json.dumps({"file": path, "verified": True, **result.to_dict()}, indent=1))
        return 0
    high = "unbounded" if not result.max_bytes else f"{result.max_bytes} B"
    print(f"{path}: verified {result.coll} on {result.ngpus} gpus ({' and '.join(result.modes)}): every output chunk "
          f"holds each contribution exactly once; no deadlock, flow control interpreted at {len(result.flow_sizes)} "
          f"size(s) of its range; {result.thread_blocks} thread blocks, "
          f"{result.steps} steps, {result.nchunksperloop} chunks per loop, {result.proto}, "
          f"{result.min_bytes} B..{high}")
    return 0
