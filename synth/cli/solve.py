"""The main command: placements and ranked programs of a reduction, or
placements ranked for a whole workload (``--workload``), as a table or JSON."""

from __future__ import annotations

import argparse
import sys
import time
from json.encoder import encode_basestring_ascii
from typing import Any, Callable, Sequence, TextIO

from ..version import __version__
from ..api import SizesSolution, Solution, WorkloadSolution, rank_problem_placements, solve_problem, solve_sizes
from ..api.results import Column
from ..cost import default_program
from ..documents import check_writable
from ..errors import SynthError
from ..plan import program_document, write_plan
from ..planner.workload import parse_workload
from ..synthesis.alltoall import ALLTOALL, format_alltoall
from ..synthesis.language import format_program
from ..synthesis.placement import axes_have_sizes
from ..synthesis.sparse import format_sparse
from ..units import format_size, parse_size
from .args import Parser, add_model_arguments, add_problem_arguments, model_of, problem_spec, sparse_density
from .commands import commands_text


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="synth-reduce",
        usage="synth-reduce --topology T --axes AXES [options]\n       synth-reduce COMMAND [options]  "
              "(synth-reduce COMMAND --help)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Enumerate every placement of parallelism axes on a hierarchical cluster and every\n"
            "verified program implementing a reduction over some axes, ranked by predicted time;\n"
            "with --workload, rank placements for a whole training step."
        ),
        epilog=f"commands:\n{commands_text()}\n\n"
               "A placement (parallelism matrix) is written one row per axis, AXIS: and the axis's split at\n"
               "each level, outermost first, rows separated by ' / ': dp:2,2 / mp:2,8 on levels node, gpu.",
    )
    add_problem_arguments(p)
    add_model_arguments(p)
    p.add_argument("--size", help="bytes per device to reduce, e.g. 256MiB, 1M, 64KB (default: 256MiB)")
    p.add_argument(
        "--workload",
        metavar="AXES:GOAL:SIZE[*REPS],...",
        help="rank placements for a whole job, e.g. dp:allreduce:1GiB,mp:allreduce:64MiB*48 "
        "(replaces --reduce, --collective and --size)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument("--out", metavar="PLAN.json",
                   help="write a plan: one placement and its program (with --workload: the best program of each "
                        "workload item)")
    p.add_argument("--placement", type=int, metavar="I",
                   help="placement (its # column) for --out (default: the best predicted)")
    p.add_argument("--program", type=int, metavar="J",
                   help="program rank within the placement for --out (default 0, the fastest predicted; "
                        "not with --workload)")
    p.add_argument(
        "--top", "--show", dest="top", type=int, metavar="K",
        help="programs listed per placement, fastest first (default: 3 in the table, all in --json; "
             "not with --workload, which lists the best program of each item)",
    )
    p.add_argument("--no-verify", action="store_true", help="skip the numpy and z3 verification of the listed programs")
    p.add_argument("--version", action="version", version=f"synth-reduce {__version__}")
    return p


class ProgressLine:
    """Progress messages on ``stream`` (stderr). On a terminal one status line,
    rewritten in place; otherwise (CI jobs, batch logs) a plain line at most
    every ``interval_s`` seconds, the first after ``interval_s``, so that long
    work shows up in logs and short runs print nothing. ``clock`` (seconds,
    monotonic) is a parameter for the tests. Call with ``""`` when done."""

    def __init__(self, stream: TextIO | None = None, interval_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()
        self.interval_s = interval_s
        self.clock = clock
        self._last = clock()

    def __call__(self, message: str) -> None:
        if self.tty:
            print(f"\r{message}\033[K", end="", file=self.stream, flush=True)
            return
        now = self.clock()
        if message and now - self._last >= self.interval_s:
            print(message, file=self.stream, flush=True)
            self._last = now


def run(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    if args.top is not None and args.top < 0:
        raise SynthError(f"--top {args.top}: must be >= 0")
    if args.collective == ALLTOALL:
        return _run_alltoall(args)
    if not axes_have_sizes(args.axes):
        return _run_sizes(args)
    density = sparse_density(args)
    if density is not None:
        return _run_sparse(args, density)
    if args.out:
        check_writable(args.out, "--out")  # before the work, not after it
    if args.workload:
        return _run_workload(args)
    problem = problem_spec(args).build()
    size_bytes = parse_size(args.size or "256MiB")
    model = model_of(args)
    top = args.top if args.top is not None else (None if args.json else 3)
    progress = ProgressLine()
    solution = solve_problem(problem, model, size_bytes, verify=not args.no_verify, top=top, progress=progress)
    progress("")
    program = 0 if args.program is None else args.program
    if args.out:
        written = solution.best.index if args.placement is None else args.placement
        write_plan(args.out, solution.plan(written, program))
    if args.json:
        print(dumps(solution_document(solution)))
    else:
        print_table(solution)
        if args.out:
            print(f"\nwrote plan: placement {written}, program {program} -> {args.out}")
    return 0


# ---------------------------------------------------------------- JSON


def dumps(doc: Any) -> str:
    """``json.dumps(doc, indent=1)``, the same text, several times faster on
    documents made mostly of lists of integers (the lowered steps of every
    program): the standard encoder formats indented output one item at a time
    in Python."""
    return _dumps(doc, "\n")


def _dumps(value: Any, newline: str) -> str:
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if value is None or value is True or value is False:
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"
        return float.__repr__(value)
    inner = newline + " "
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{" + inner + ("," + inner).join(
            f"{_dumps(str(k) if not isinstance(k, str) else k, inner)}: {_dumps(v, inner)}" for k, v in value.items()
        ) + newline + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        if all(type(v) is int for v in value):
            return "[" + inner + ("," + inner).join(map(int.__repr__, value)) + newline + "]"
        return "[" + inner + ("," + inner).join(_dumps(v, inner) for v in value) + newline + "]"
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _program_document(result) -> dict[str, Any]:
    doc = program_document(result.lowered)
    doc["predicted_s"] = result.predicted_s
    if result.verification is not None:
        v = result.verification
        doc["verified"] = {"numpy_elements": v.elements_checked, "numpy": v.numpy_scope, "z3": v.proof.scope}
    return doc


def _model_document(solution: Solution) -> dict[str, Any]:
    return {"size_bytes": solution.size_bytes, "algo": solution.model.algorithm.value,
            "profile": solution.model.profile_path}


def solution_document(solution: Solution) -> dict[str, Any]:
    """What ``--json`` prints: every placement, fastest first, with its listed programs."""
    problem = solution.problem
    return {
        "topology": problem.topology.to_dict(),
        "axes": [{"name": a.name, "size": a.size} for a in problem.axes],
        "reduce": list(problem.reduce_axes),
        "collective": problem.goal.value,
        "constraints": [str(c) for c in problem.constraints],
        "max_steps": problem.max_steps,
        "model": _model_document(solution),
        "synthesis_s": round(solution.synthesis_s, 6),
        "prediction_s": round(solution.prediction_s, 6),
        "verified": solution.verified,
        "placements": [
            {
                "index": p.index,
                "rank": n,
                "matrix": [list(row) for row in p.matrix],
                "mesh": p.mesh.tolist(),
                "synthesis_hierarchy": [
                    {"name": name, "size": size} for name, size in zip(p.hierarchy.names, p.hierarchy.sizes)
                ],
                "crosses": list(p.hierarchy.names),
                "num_programs": p.num_programs,
                "default": {
                    "text": format_program(default_program(problem.goal)),
                    "predicted_s": p.default_s,
                },
                "best_predicted_s": p.best_s if p.num_programs else None,
                "predicted_speedup": p.speedup,
                "programs": [_program_document(r) for r in p.programs],
            }
            for n, p in enumerate(solution.by_speed)
        ],
    }


# ---------------------------------------------------------------- table


def _model_line(solution: Solution) -> str:
    return f"predicted for {format_size(solution.size_bytes)} per device, {solution.model.describe()}"


def _steps(n: int) -> str:
    return f"{n} step" + ("" if n == 1 else "s")


def print_ranked(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> None:
    """The one printer of ranking tables (every collective's
    :meth:`~synth.api.results.RankedSolution.table`): the column heads, a rule
    as long as them, then the rows; each cell aligned in its column (a ``fit``
    column as wide as its widest cell), the last column as it is, each line
    without trailing spaces."""
    widths = [max([c.width, len(c.header)] + [len(r[i]) for r in rows]) if c.fit else c.width
              for i, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        last = len(columns) - 1
        return "".join(c.gap + (text if i == last else f"{text:{c.align}{w}}")
                       for i, (c, text, w) in enumerate(zip(columns, cells, widths))).rstrip()

    header = line([c.header for c in columns])
    print(header)
    print("-" * len(header))
    for row in rows:
        print(line(row))


def print_table(solution: Solution) -> None:
    problem = solution.problem
    placements = solution.by_speed
    total = sum(p.num_programs for p in placements)
    print(problem.describe())
    print(_model_line(solution))
    print(
        f"{len(placements)} placement(s), {total} program(s) of at most {_steps(problem.max_steps)}; "
        f"synthesized in {solution.synthesis_s * 1e3:.0f} ms, predicted in {solution.prediction_s * 1e3:.0f} ms"
        + ("; listed programs verified (numpy reference + z3)" if solution.verified else "")
    )
    default = default_program(problem.goal).instructions[0].collective.value
    print(f"\nmatrix rows are axes, columns are levels ({' '.join(problem.topology.level_names)}); "
          f"default = one {default} over each whole reduction group")
    print_ranked(*solution.table())


# ---------------------------------------------------------------- sparse all-reduce


def _run_sparse(args: argparse.Namespace, density: float) -> int:
    from ..api import solve_sparse_problem

    if args.workload is not None:
        raise SynthError(WORKLOAD_REPLACES)
    if args.out is not None:
        raise SynthError(f"--out: {PLANS_ARE_DENSE}")
    if args.program is not None:
        raise SynthError("--program is not available for sparse-allreduce yet; run 'synth-reduce bench --density D' "
                         "to time its programs")
    size_bytes = parse_size(args.size or "256MiB")
    model = model_of(args)
    top = args.top if args.top is not None else 3
    progress = ProgressLine()
    solution = solve_sparse_problem(problem_spec(args).build(), model, size_bytes, density, args.encoding,
                                    verify=not args.no_verify, top=top, progress=progress)
    progress("")
    if args.json:
        print(dumps(sparse_document(solution)))
        return 0
    problem, spec = solution.problem, solution.spec
    print(f"sparse-allreduce over {','.join(problem.reduce_axes)}: density {density:g} per rank of "
          f"{format_size(size_bytes)} ({spec.n} values of {spec.value_bytes} bytes), encoding {spec.encoding.value}")
    _preamble(solution, "listed programs verified: dense form proved (numpy reference + z3), sparse form exact "
              "against the dense sum (uniform and zipf integer data)",
              "dense = one AllReduce of the dense buffer; crossover = density where the best sparse program meets "
              "it (predicted)")
    print_ranked(*solution.table())
    return 0


def _preamble(solution, proved: str, legend: str) -> None:
    """The lines between a goal's title and its table: the model, what the
    listed programs were checked by (when they were), and the columns."""
    print(f"predicted with {solution.model.describe()}")
    if solution.verified:
        print(proved)
    print(f"\nmatrix rows are axes, columns are levels ({' '.join(solution.problem.topology.level_names)}); {legend}")


def sparse_document(solution) -> dict:
    """The ``--json`` document of a sparse all-reduce."""
    spec = solution.spec
    return {
        "version": __version__,
        "collective": "sparse-allreduce",
        "density": spec.density,
        "encoding": spec.encoding.value,
        "values": spec.n,
        "value_bytes": spec.value_bytes,
        "algo": solution.model.algorithm.value,
        "verified": solution.verified,
        "placements": [{
            "index": p.index,
            "matrix": [list(row) for row in p.matrix],
            "dense_default_s": p.ranking.dense_default_s,
            "dense_best_s": p.ranking.dense_best_s,
            "crossover_density": p.ranking.crossover_density,
            "crossover_density_vs_best_dense": p.ranking.crossover_best_density,
            "programs": [{"text": format_sparse(program), "dense_text": format_program(program),
                          "predicted_s": seconds, **({"checked_entries": p.checked[i]} if p.checked else {})}
                         for i, (program, seconds) in enumerate(zip(p.listed, p.ranking.predicted_s))],
        } for p in solution.by_speed],
    }


# ---------------------------------------------------------------- all-to-all


def _run_alltoall(args: argparse.Namespace) -> int:
    from ..api import solve_alltoall_problem

    for option, given in (("--workload", args.workload), ("--density", getattr(args, "density", None)),
                          ("--program", args.program), ("--placement", args.placement)):
        if given is not None:
            raise SynthError(f"{option} does not apply to --collective alltoall; drop it")
    if args.out is not None:
        raise SynthError("--out: a plan holds reductions; --collective alltoall lists and prices all-to-all programs "
                         "(the planner prices expert parallelism's all-to-alls with them: synth-reduce plan)")
    if not axes_have_sizes(args.axes):
        raise SynthError(f"--collective alltoall needs axis sizes (e.g. --axes ep=64); --axes {args.axes} leaves "
                         "them to choose")
    size_bytes = parse_size(args.size or "256MiB")
    model = model_of(args)
    top = args.top if args.top is not None else (None if args.json else 3)
    progress = ProgressLine()
    solution = solve_alltoall_problem(problem_spec(args, alltoall=True).build(), model, size_bytes,
                                      verify=not args.no_verify, top=top, progress=progress)
    progress("")
    if args.json:
        print(dumps(alltoall_document(solution)))
        return 0
    problem = solution.problem
    print(f"alltoall over {','.join(problem.reduce_axes)}: {format_size(size_bytes)} per device, 1/k of it to each "
          f"of the k members of its group")
    _preamble(solution, "listed programs proved: run once on distinct block labels (programs move blocks without "
              "reading them, so one run decides every input)",
              "direct = one all-to-all over each group (NCCL: grouped sends to every peer)")
    print_ranked(*solution.table())
    return 0


def alltoall_document(solution) -> dict:
    """The ``--json`` document of an all-to-all."""
    return {
        "version": __version__,
        "collective": ALLTOALL,
        "axes": list(solution.problem.reduce_axes),
        "size_bytes": solution.size_bytes,
        "algo": solution.model.algorithm.value,
        "verified": solution.verified,
        "placements": [{
            "index": p.index,
            "matrix": [list(row) for row in p.matrix],
            "direct_s": p.direct_s,
            "best_s": p.best_s,
            "speedup": p.speedup,
            "programs_found": p.programs_found,
            "programs": [{"text": format_alltoall(program), "predicted_s": seconds,
                          **({"checked_blocks": p.checked[i]} if p.checked else {})}
                         for i, (program, seconds) in enumerate(zip(p.listed, p.predicted_s))],
        } for p in solution.by_speed],
    }


# ---------------------------------------------------------------- axes without sizes


def _run_sizes(args: argparse.Namespace) -> int:
    for option, given in (("--workload", args.workload), ("--out", args.out), ("--placement", args.placement)):
        if given is not None:
            raise SynthError(f"{option} needs axis sizes (e.g. --axes dp=16,mp=8); --axes {args.axes} leaves them "
                             "to choose")
    spec = problem_spec(args)
    progress = ProgressLine()
    solution = solve_sizes(
        spec.load_topology(), args.axes, args.reduce, args.collective or "allreduce", model_of(args), args.max_steps,
        spec.constraints, not args.no_verify, parse_size(args.size or "256MiB"),
        1 if args.top is None else args.top, progress=progress,
    )
    progress("")
    if args.json:
        print(dumps(sizes_document(solution)))
    else:
        print_sizes_table(solution)
    return 0


def sizes_document(solution: SizesSolution) -> dict[str, Any]:
    """What ``--json`` prints for axes without sizes: every size assignment,
    fastest first, each with the document the sized command prints for it."""
    first = solution.solutions[0]
    return {
        "topology": solution.topology.to_dict(),
        "axes": [str(a) for a in solution.axes],
        "reduce": list(first.problem.reduce_axes),
        "collective": first.problem.goal.value,
        "skipped": [[{"name": a.name, "size": a.size} for a in axes] for axes in solution.skipped],
        "assignments": [dict(solution_document(s), rank=n) for n, s in enumerate(solution.by_speed)],
    }


def print_sizes_table(solution: SizesSolution) -> None:
    solutions = solution.by_speed
    first = solutions[0]
    problem = first.problem
    topology = solution.topology
    levels = " > ".join(f"{lv.name} x{lv.count}" for lv in topology.levels)
    print(f"topology {topology.name}: {levels} ({topology.num_devices} devices); axes "
          f"{','.join(map(str, solution.axes))} without sizes; {problem.goal.value} over "
          f"{','.join(problem.reduce_axes)}")
    print(_model_line(first))
    placements = sum(len(s.placements) for s in solutions)
    programs = sum(p.num_programs for s in solutions for p in s.placements)
    synthesis = sum(s.synthesis_s for s in solutions)
    prediction = sum(s.prediction_s for s in solutions)
    print(f"{len(solutions)} size assignment(s), {placements} placement(s), {programs} program(s) of at most "
          f"{problem.max_steps} steps; synthesized in {synthesis * 1e3:.0f} ms, predicted in {prediction * 1e3:.0f} ms"
          + ("; listed programs verified (numpy reference + z3)" if first.verified else ""))
    if solution.skipped:
        print(f"{len(solution.skipped)} assignment(s) have no placement under the constraints: "
              + ", ".join(" ".join(f"{a.name}={a.size}" for a in axes) for axes in solution.skipped))
    print(f"\nbest placement per size assignment; matrix rows are axes, columns are levels "
          f"({' '.join(topology.level_names)})")
    print_ranked(*solution.table())
    outside = _spread_others(solutions)
    if outside:
        axis, level = outside
        print(f"\nthe best matrices are chosen for the {','.join(problem.reduce_axes)} reduction alone: some put {axis} "
              f"across {level}s, where {axis}'s own traffic is not priced; keep it inside with --constrain "
              f"{axis}@{level}=1, or plan the whole job with synth-reduce plan")


def _spread_others(solutions: Sequence[Solution]) -> tuple[str, str] | None:
    """(axis, outermost level) when a listed best matrix spreads an axis that
    is not reduced over the outermost level although another placement of
    that assignment keeps it inside; None otherwise. Not for an axis a
    constraint places (the user chose) nor for ``pp``, whose point-to-point
    traffic is what goes across nodes by design."""
    for s in solutions:
        best, reduced = s.best, set(s.problem.reduce_axes)
        placed = {c.axis for c in s.problem.constraints}
        if best.reduction.k == 1:
            continue
        for a, axis in enumerate(best.placement.axes):
            if axis.name in reduced | placed | {"pp"} or best.placement.matrix[a][0] == 1:
                continue
            if any(p.placement.matrix[a][0] == 1 for p in s.placements):
                return axis.name, best.placement.topology.level_names[0]
    return None


# ---------------------------------------------------------------- workload


PLANS_ARE_DENSE = ("a plan holds dense programs: write the dense all-reduce's plan (without --density or the "
                   "sparse item) and run its program in sparse form with synth.torch.comm_hook(plan, sparse=True) "
                   "(docs/sparse.md)")
WORKLOAD_REPLACES = ("--workload replaces --reduce, --collective, --size and --density (a sparse item takes its "
                     "density after its size: dp:sparse-allreduce:256MiB@0.01); give one or the other")


def _run_workload(args: argparse.Namespace) -> int:
    if args.reduce is not None or args.collective is not None or args.size is not None or args.density is not None:
        raise SynthError(WORKLOAD_REPLACES)
    for option, value in (("--top", args.top), ("--program", args.program)):
        if value is not None:
            raise SynthError(f"{option} lists or picks programs of one reduction; with --workload every item uses "
                             "its best predicted program (leave out --workload to list the programs of one)")
    problem = problem_spec(args).build()
    workload = parse_workload(args.workload, problem.axes)
    if args.out and any(item.sparse for item in workload):
        raise SynthError(f"--out: the workload has a sparse-allreduce item; {PLANS_ARE_DENSE}")
    model = model_of(args)
    progress = ProgressLine()
    solution = rank_problem_placements(problem, workload, model, verify=not args.no_verify, progress=progress)
    progress("")
    if args.out:
        plan = solution.plan(args.placement)
        write_plan(args.out, plan)
    if args.json:
        print(dumps(workload_document(solution)))
    else:
        print_workload_table(solution)
        if args.out:
            programs = sum(len(r.programs) for r in plan.reductions)
            print(f"\nwrote plan: placement {plan.placement.matrix_text()}, {len(plan.reductions)} reduction(s), "
                  f"{programs} program(s) -> {args.out}")
    return 0


def workload_document(solution: WorkloadSolution) -> dict[str, Any]:
    return {
        "topology": solution.topology.to_dict(),
        "axes": [{"name": a.name, "size": a.size} for a in solution.axes],
        "workload": [{"reduce": list(w.reduce_axes), "collective": w.collective, "size_bytes": w.size_bytes,
                      "repetitions": w.repetitions, **({"density": w.density} if w.sparse else {})}
                     for w in solution.workload],
        "model": {"algo": solution.model.algorithm.value, "profile": solution.model.profile_path},
        "elapsed_s": round(solution.elapsed_s, 6),
        "placements": [
            {
                "index": c.index, "rank": n,
                "matrix": [list(row) for row in c.matrix],
                "mesh": c.placement.mesh.tolist(),
                "total_predicted_s": c.total_s,
                "default_total_predicted_s": c.default_total_s,
                "items": [
                    {"reduce": list(r.item.reduce_axes), "collective": r.item.collective,
                     "size_bytes": r.item.size_bytes, "repetitions": r.item.repetitions,
                     **({"density": r.item.density, "best_sparse_program": format_sparse(r.best.program, " ; ")}
                        if r.item.sparse and r.best else {}),
                     "default_predicted_s": r.default_s, "best_predicted_s": r.best_s,
                     "best_program": _program_document(r.best) if r.best else None}
                    for r in c.items
                ],
            }
            for n, c in enumerate(solution.placements)
        ],
    }


def print_workload_table(solution: WorkloadSolution) -> None:
    items = ", ".join(f"{'+'.join(w.reduce_axes)} {w.collective} {format_size(w.size_bytes)}"
                      + (f" at density {w.density:g}" if w.sparse else "")
                      + (f" x{w.repetitions}" if w.repetitions > 1 else "") for w in solution.workload)
    print(f"topology {solution.topology.name} ({solution.topology.num_devices} devices); "
          f"axes {' '.join(f'{a.name}={a.size}' for a in solution.axes)}")
    print(f"workload per step: {items}")
    print(solution.model.describe())
    print(f"{len(solution.placements)} placement(s) ranked in {solution.elapsed_s * 1e3:.0f} ms; each reduction "
          "uses its best predicted program" + ("; those programs verified (numpy reference + z3)"
                                               if solution.verified else ""))
    print()
    print_ranked(*solution.table())
