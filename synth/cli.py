"""The ``synth-reduce`` command line.

    synth-reduce --topology T --axes dp=16,mp=8 [--reduce dp] [...]   synthesize
    synth-reduce verify plan.json                                     re-prove a plan
    synth-reduce check FILE --topology T --axes ... [--matrix M]      check a program

Bad input gives a one-line error on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

from . import __version__
from .errors import SynthError
from .language import format_program, parse_program
from .lowering import lower
from .placement import (
    Placement,
    check_axes_fit,
    enumerate_placements,
    parse_axes,
    parse_constraint,
    parse_matrix,
    parse_reduce,
)
from .plan import load_plan, plan_document, program_document, verify_lowered, verify_plan, write_plan
from .search import PlacementPrograms, synthesize_placements
from .semantics import Goal
from .topology import Topology, load_topology, parse_scale

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, like SynthError
        raise SynthError(f"{message} (see '{self.prog} --help')")


def _add_problem_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", required=True, help="topology YAML file, or a shipped name (e.g. dgx-a100)")
    p.add_argument("--axes", required=True, help="parallelism axes with sizes, e.g. dp=16,mp=8")
    p.add_argument("--reduce", help="reduction axes, e.g. dp or dp,mp (default: the first axis)")
    p.add_argument(
        "--collective",
        default="allreduce",
        choices=[g.value for g in Goal],
        help="the reduction to implement (default: allreduce)",
    )
    p.add_argument(
        "--constrain",
        action="append",
        default=[],
        metavar="AXIS@LEVEL{=,>=,<=}N",
        help="constrain a matrix entry, e.g. mp@node=1 (mp stays inside a node); repeatable",
    )
    p.add_argument("--scale", default="", metavar="LEVEL=COUNT", help="override level counts, e.g. node=2")
    p.add_argument("--max-steps", type=int, default=5, help="longest program to search (default: 5)")


def _main_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="synth-reduce",
        description=(
            "Enumerate every placement of parallelism axes on a hierarchical cluster and every "
            "verified program implementing a reduction over some axes. Subcommands: "
            "'verify PLAN' re-proves a plan file; 'check FILE' checks a hand-written program."
        ),
    )
    _add_problem_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument("--out", metavar="PLAN.json", help="write a plan (one placement and one program)")
    p.add_argument("--placement", type=int, default=0, metavar="I", help="placement index for --out (default 0)")
    p.add_argument("--program", type=int, default=0, metavar="J", help="program index for --out (default 0, the shortest)")
    p.add_argument(
        "--show",
        type=int,
        metavar="N",
        help="programs listed per placement (default: 3 in the table, all in --json)",
    )
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the numpy and z3 verification of the listed programs",
    )
    p.add_argument("--version", action="version", version=f"synth-reduce {__version__}")
    return p


@dataclass(frozen=True)
class Problem:
    topology: Topology
    axes: tuple
    reduce_axes: tuple[str, ...]
    goal: Goal
    constraints: tuple
    max_steps: int

    def describe(self) -> str:
        axes = " ".join(f"{a.name}={a.size}" for a in self.axes)
        levels = " > ".join(f"{lv.name} x{lv.count}" for lv in self.topology.levels)
        return (
            f"topology {self.topology.name}: {levels} ({self.topology.num_devices} devices); "
            f"axes {axes}; {self.goal.value} over {','.join(self.reduce_axes)}"
        )


def _problem(args: argparse.Namespace) -> Problem:
    topology = load_topology(args.topology)
    if args.scale:
        topology = topology.scaled(parse_scale(args.scale))
    axes = parse_axes(args.axes)
    check_axes_fit(axes, topology)
    if args.max_steps < 1:
        raise SynthError(f"--max-steps {args.max_steps}: must be >= 1")
    return Problem(
        topology=topology,
        axes=axes,
        reduce_axes=parse_reduce(args.reduce, axes),
        goal=Goal(args.collective),
        constraints=tuple(parse_constraint(c, axes, topology) for c in args.constrain),
        max_steps=args.max_steps,
    )


def _placements(problem: Problem) -> list[Placement]:
    placements = enumerate_placements(problem.topology, problem.axes, problem.constraints)
    if not placements:
        given = ", ".join(str(c) for c in problem.constraints)
        raise SynthError(
            f"no placement satisfies the constraints ({given}); relax or remove a --constrain"
        )
    return placements


def _progress(message: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{message}\033[K", end="", file=sys.stderr, flush=True)


def _verified_documents(
    result: PlacementPrograms, problem: Problem, limit: int | None, verify: bool
) -> list[dict[str, Any]]:
    docs = []
    for program in result.programs[:limit]:
        lowered = lower(program, result.placement, problem.reduce_axes, problem.goal)
        doc = program_document(lowered)
        if verify:
            v = verify_lowered(lowered)
            doc["verified"] = {"numpy_elements": v.elements_checked, "z3": v.proof.scope}
        docs.append(doc)
    return docs


def _run_synthesis(argv: Sequence[str]) -> int:
    args = _main_parser().parse_args(argv)
    if args.show is not None and args.show < 0:
        raise SynthError(f"--show {args.show}: must be >= 0")
    problem = _problem(args)
    started = time.perf_counter()
    placements = _placements(problem)
    results = synthesize_placements(placements, problem.reduce_axes, problem.goal, problem.max_steps)
    synth_s = time.perf_counter() - started
    limit = args.show if args.show is not None else (None if args.json else 3)
    verify = not args.no_verify
    listed = []
    for i, result in enumerate(results):
        _progress(f"verifying placement {i + 1}/{len(results)}")
        listed.append(_verified_documents(result, problem, limit, verify))
    _progress("")
    if args.out:
        _write_selected_plan(args, problem, results)
    if args.json:
        print(json.dumps(_json_document(problem, results, listed, synth_s, verify), indent=1))
    else:
        _print_table(problem, results, listed, synth_s, verify, limit)
        if args.out:
            print(f"\nwrote plan: placement {args.placement}, program {args.program} -> {args.out}")
    return 0


def _write_selected_plan(args: argparse.Namespace, problem: Problem, results: list[PlacementPrograms]) -> None:
    if not 0 <= args.placement < len(results):
        raise SynthError(f"--placement {args.placement}: choose 0..{len(results) - 1}")
    result = results[args.placement]
    if not result.programs:
        raise SynthError(
            f"--placement {args.placement} has no program of at most {problem.max_steps} steps; "
            "raise --max-steps"
        )
    if not 0 <= args.program < len(result.programs):
        raise SynthError(f"--program {args.program}: placement {args.placement} has programs 0..{len(result.programs) - 1}")
    lowered = lower(result.programs[args.program], result.placement, problem.reduce_axes, problem.goal)
    verify_lowered(lowered)  # never write an unproved plan
    write_plan(args.out, plan_document(result.placement, problem.reduce_axes, lowered))


def _json_document(problem, results, listed, synth_s, verify) -> dict[str, Any]:
    return {
        "topology": problem.topology.to_dict(),
        "axes": [{"name": a.name, "size": a.size} for a in problem.axes],
        "reduce": list(problem.reduce_axes),
        "collective": problem.goal.value,
        "constraints": [str(c) for c in problem.constraints],
        "max_steps": problem.max_steps,
        "synthesis_s": round(synth_s, 6),
        "verified": verify,
        "placements": [
            {
                "index": i,
                "matrix": [list(row) for row in r.placement.matrix],
                "mesh": r.placement.mesh.tolist(),
                "synthesis_hierarchy": [{"name": n, "size": s} for n, s in zip(r.hierarchy.names, r.hierarchy.sizes)],
                "crosses": list(r.hierarchy.names),
                "num_programs": len(r.programs),
                "programs": docs,
            }
            for i, (r, docs) in enumerate(zip(results, listed))
        ],
    }


def _print_table(problem, results, listed, synth_s, verify, limit) -> None:
    total = sum(len(r.programs) for r in results)
    print(problem.describe())
    print(
        f"{len(results)} placement(s), {total} program(s) of at most {problem.max_steps} steps, "
        f"synthesized in {synth_s * 1e3:.0f} ms"
        + ("; listed programs verified (numpy reference + z3 proof)" if verify else "")
    )
    levels = problem.topology.level_names
    print()
    print("matrix rows are axes, columns are levels: " + " ".join(levels))
    header = f"{'#':>3}  {'matrix':<24} {'reduction crosses':<24} {'programs':>8}  shortest programs"
    print(header)
    print("-" * len(header))
    for i, (r, docs) in enumerate(zip(results, listed)):
        matrix = " / ".join(
            f"{a.name}:" + ",".join(str(v) for v in row) for a, row in zip(problem.axes, r.placement.matrix)
        )
        crosses = r.hierarchy.describe() if r.hierarchy.names else "(nothing: k=1)"
        texts = [d["text"].replace("\n", " ; ") for d in docs] or ["(none within the step limit)"]
        print(f"{i:>3}  {matrix:<24} {crosses:<24} {len(r.programs):>8}  {texts[0]}")
        for text in texts[1:]:
            print(f"{'':>3}  {'':<24} {'':<24} {'':>8}  {text}")


# ---------------------------------------------------------------- verify / check


def _run_verify(argv: Sequence[str]) -> int:
    p = _Parser(prog="synth-reduce verify", description="Re-prove a plan file (numpy reference and z3).")
    p.add_argument("plan", help="plan JSON written by synth-reduce --out")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    plan = load_plan(args.plan)
    v = verify_plan(plan, args.plan)
    summary = {
        "plan": args.plan,
        "verified": True,
        "collective": plan.goal.value,
        "reduce": list(plan.reduce_axes),
        "program": format_program(plan.program),
        "numpy_elements": v.elements_checked,
        "z3": v.proof.scope,
        "z3_obligations": v.proof.obligations,
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(
            f"{args.plan}: verified {plan.goal.value} over {','.join(plan.reduce_axes)} on "
            f"{plan.placement.describe()}\n  program: {format_program(plan.program, ' ; ')}\n"
            f"  numpy reference: {v.elements_checked} output elements exact; "
            f"z3: proved for all inputs ({v.proof.scope}, {v.proof.obligations} obligations)"
        )
    return 0


def _run_check(argv: Sequence[str]) -> int:
    p = _Parser(
        prog="synth-reduce check",
        description="Parse a hand-written program and verify it implements the reduction.",
    )
    p.add_argument("file", help="program text file ('-' for standard input)")
    _add_problem_arguments(p)
    p.add_argument("--matrix", help="check on this placement only, rows=axes separated by ';', e.g. '4,1;1,16'")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    problem = _problem(args)
    try:
        text = sys.stdin.read() if args.file == "-" else open(args.file).read()
    except OSError as exc:
        raise SynthError(f"{args.file}: cannot read program ({exc.strerror})") from None
    program = parse_program(text, args.file)
    if args.matrix:
        placements = [Placement(problem.topology, problem.axes, parse_matrix(args.matrix, problem.axes, problem.topology))]
    else:
        placements = _placements(problem)
    rows, failures = [], []
    for i, placement in enumerate(placements):
        try:
            lowered = lower(program, placement, problem.reduce_axes, problem.goal)
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
        for row, placement in zip(rows, placements):
            status = (
                f"valid (numpy: {row['numpy_elements']} elements exact; z3: proved, {row['z3']})"
                if row["valid"]
                else f"not valid: {row['reason']}"
            )
            print(f"  {row['index']:>3}  {placement.describe()}: {status}")
    return 0


COMMANDS = {"verify": _run_verify, "check": _run_check}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in COMMANDS:
            return COMMANDS[argv[0]](argv[1:])
        return _run_synthesis(argv)
    except SynthError as exc:
        print(f"synth-reduce: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("synth-reduce: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
