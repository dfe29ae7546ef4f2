"""``synth-reduce check FILE``: parse a hand-written program and verify that it
implements the reduction on one placement (``--matrix``) or on each."""

from __future__ import annotations

import json
from typing import Sequence

from ..documents import MAX_PROGRAM_BYTES, read_limited
from ..errors import SynthError
from ..synthesis.language import format_program, parse_program
from ..synthesis.lowering import lower
from ..synthesis.placement import Placement, parse_matrix
from ..synthesis.verify import verify_lowered
from .args import Parser, add_problem_arguments, problem_spec

MAX_PROGRAM_LINES = 1000  # instructions of a hand-written program (the search goes to 10)


def run(argv: Sequence[str]) -> int:
    p = Parser(
        prog="synth-reduce check",
        description="Parse a hand-written program and verify it implements the reduction.",
    )
    p.add_argument("file", help="program text file ('-' for standard input)")
    add_problem_arguments(p)
    p.add_argument("--matrix", metavar="MATRIX",
                   help="check on this placement only, one row per axis as the tables print it, e.g. "
                        "'dp:4,1 / mp:1,16' (the axis's split at each level, outermost first)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    args = p.parse_args(argv)
    problem = problem_spec(args).build()
    try:
        text = read_limited(args.file, "program", MAX_PROGRAM_BYTES)
    except OSError as exc:
        raise SynthError(f"{args.file}: cannot read program ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise SynthError(f"{args.file}: not a text file (a program is UTF-8 text, e.g. "
                         "'ReduceScatter(node, inside)' on its first line)") from None
    lines = sum(1 for line in text.splitlines() if line.strip())
    if lines > MAX_PROGRAM_LINES:
        raise SynthError(f"{args.file}: {lines:,} instructions; a program checked here has at most "
                         f"{MAX_PROGRAM_LINES:,} (synthesized ones have at most 10)")
    program = parse_program(text, args.file)
    if args.matrix:
        placements = [Placement(problem.topology, problem.axes, parse_matrix(args.matrix, problem.axes, problem.topology))]
    else:
        placements = problem.placements()
    rows, failures = [], []
    for i, placement in enumerate(placements):
        try:
            lowered = lower(program, problem.reduction(placement))
            v = verify_lowered(lowered)
            rows.append({"index": i, "matrix": [list(r) for r in placement.matrix], "valid": True,
                         "numpy_elements": v.elements_checked, "z3": v.proof.scope})
        except SynthError as exc:
            failures.append(f"{placement.describe()}: {exc}")
            rows.append({"index": i, "matrix": [list(r) for r in placement.matrix], "valid": False, "reason": str(exc)})
    if not any(r["valid"] for r in rows):
        where = failures[0] if len(failures) == 1 else f"any of {len(failures)} placements; first: {failures[0]}"
        raise SynthError(
            f"{args.file} does not implement {problem.goal.value} over {','.join(problem.reduce_axes)} on {where}"
        )
    if args.json:
        print(json.dumps({"file": args.file, "program": format_program(program), "placements": rows}, indent=1))
    else:
        print(f"{args.file}: {format_program(program, ' ; ')}")
        print(problem.describe())
        print(f"matrix rows are axes, columns are levels ({' '.join(problem.topology.level_names)})")
        for row, placement in zip(rows, placements):
            status = (
                f"valid (numpy: {row['numpy_elements']} elements exact; z3: proved, {row['z3']})"
                if row["valid"]
                else f"not valid: {row['reason']}"
            )
            print(f"  {row['index']:>3}  {placement.describe()}: {status}")
    return 0
