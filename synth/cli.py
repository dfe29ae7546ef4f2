"""The ``synth-reduce`` command line.

    synth-reduce --topology T --axes dp=16,mp=8 [--reduce dp] [...]   placements, ranked programs
    synth-reduce --topology T --axes ... --workload SPEC              whole-job placement
    synth-reduce verify plan.json                                     re-prove a plan
    synth-reduce check FILE --topology T --axes ... [--matrix M]      check a program
    synth-reduce fit MEASUREMENTS -o PROFILE                          learn the cost model
    synth-reduce validate MEASUREMENTS [--holdout F]                  score the cost model
    mpiexec -n N synth-reduce bench|tune ...                          run on MPI / NCCL
    synth-reduce emulate [plan|down] ...                              emulated cluster

Bad input gives a one-line error on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from typing import Any, Sequence

from . import __version__
from .errors import SynthError
from .language import format_program, parse_program
from .lowering import lower
from .placement import Placement, parse_matrix
from .cost import ALGORITHMS, Profile, Ranked, default_program, rank
from .fit import accuracy, fit_profile, load_measurements, load_profile, profile_document, save_profile, split_cases
from .plan import load_plan, plan_document, program_document, verify_lowered, verify_plan, write_plan
from .search import synthesize_placements
from .problem import Parser, Problem, add_problem_arguments, placements_of, problem_from_args
from .topology import Topology
from .units import format_seconds, format_size, parse_size
from .workload import parse_workload, rank_placements

EXIT_USAGE = 2


def _add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algo", default="ring", choices=ALGORITHMS,
                   help="collective algorithm to model: NCCL ring or tree, or the MPI testbed's (default: ring)")
    p.add_argument("--profile", metavar="PROFILE.json", help="fitted parameters (synth-reduce fit); default: the topology's numbers")


def _main_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="synth-reduce",
        description=(
            "Enumerate every placement of parallelism axes on a hierarchical cluster and every "
            "verified program implementing a reduction over some axes, ranked by predicted time. "
            "Subcommands: 'verify PLAN' re-proves a plan; 'check FILE' checks a hand-written "
            "program; 'fit' and 'validate' learn and score the cost model from measurements."
        ),
    )
    add_problem_arguments(p)
    _add_model_arguments(p)
    p.add_argument("--size", help="bytes per device to reduce, e.g. 256MiB, 1M, 64KB (default: 256MiB)")
    p.add_argument(
        "--workload",
        metavar="AXES:GOAL:SIZE[*REPS],...",
        help="rank placements for a whole job, e.g. dp:allreduce:1GiB,mp:allreduce:64MiB*48 "
        "(replaces --reduce, --collective and --size)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.add_argument("--out", metavar="PLAN.json", help="write a plan (one placement and one program)")
    p.add_argument("--placement", type=int, metavar="I",
                   help="placement (its # column) for --out (default: the best predicted)")
    p.add_argument("--program", type=int, default=0, metavar="J",
                   help="program rank within the placement for --out (default 0, the fastest predicted)")
    p.add_argument(
        "--top", "--show", dest="top", type=int, metavar="K",
        help="programs listed per placement, fastest first (default: 3 in the table, all in --json)",
    )
    p.add_argument("--no-verify", action="store_true", help="skip the numpy and z3 verification of the listed programs")
    p.add_argument("--version", action="version", version=f"synth-reduce {__version__}")
    return p


def _load_profile(path: str | None, topology: Topology) -> Profile | None:
    if path is None:
        return None
    profile = load_profile(path)
    profile.check_matches(topology, path)
    return profile


def _progress(message: str) -> None:
    if sys.stderr.isatty():
        print(f"\r{message}\033[K", end="", file=sys.stderr, flush=True)


def _program_document(ranked: Ranked, position: int, problem: Problem, verify: bool) -> dict[str, Any]:
    result = ranked.result
    program = result.programs[ranked.order[position]]
    lowered = lower(program, result.placement, problem.reduce_axes, problem.goal)
    doc = program_document(lowered)
    doc["predicted_s"] = ranked.predicted_s[position]
    if verify:
        v = verify_lowered(lowered)
        doc["verified"] = {"numpy_elements": v.elements_checked, "z3": v.proof.scope}
    return doc


def _run_synthesis(argv: Sequence[str]) -> int:
    args = _main_parser().parse_args(argv)
    if args.top is not None and args.top < 0:
        raise SynthError(f"--top {args.top}: must be >= 0")
    if args.workload:
        return _run_workload(args)
    problem = problem_from_args(args)
    size_bytes = parse_size(args.size or "256MiB")
    profile = _load_profile(args.profile, problem.topology)
    started = time.perf_counter()
    placements = placements_of(problem)
    results = synthesize_placements(placements, problem.reduce_axes, problem.goal, problem.max_steps)
    synth_s = time.perf_counter() - started
    started = time.perf_counter()
    ranked = [rank(r, problem.reduce_axes, problem.goal, size_bytes, args.algo, profile) for r in results]
    predict_s = time.perf_counter() - started
    by_speed = sorted(range(len(ranked)), key=lambda i: (ranked[i].best_s, i))
    limit = args.top if args.top is not None else (None if args.json else 3)
    verify = not args.no_verify
    listed = {}
    for n, i in enumerate(by_speed):
        _progress(f"verifying placement {n + 1}/{len(by_speed)}")
        count = len(ranked[i].order) if limit is None else min(limit, len(ranked[i].order))
        listed[i] = [_program_document(ranked[i], j, problem, verify) for j in range(count)]
    _progress("")
    if args.out:
        written = _write_selected_plan(args, problem, ranked, by_speed[0])
    context = dict(size_bytes=size_bytes, algo=args.algo, profile=args.profile, synth_s=synth_s,
                   predict_s=predict_s, verify=verify)
    if args.json:
        print(json.dumps(_json_document(problem, ranked, by_speed, listed, context), indent=1))
    else:
        _print_table(problem, ranked, by_speed, listed, context)
        if args.out:
            print(f"\nwrote plan: placement {written[0]}, program {written[1]} -> {args.out}")
    return 0


def _write_selected_plan(args: argparse.Namespace, problem: Problem, ranked: list[Ranked], best: int) -> tuple[int, int]:
    """Write the chosen plan; returns (placement #, program rank)."""
    index = best if args.placement is None else args.placement
    if not 0 <= index < len(ranked):
        raise SynthError(f"--placement {index}: choose 0..{len(ranked) - 1}")
    chosen = ranked[index]
    if not chosen.order:
        raise SynthError(
            f"--placement {index} has no program of at most {problem.max_steps} steps; raise --max-steps"
        )
    if not 0 <= args.program < len(chosen.order):
        raise SynthError(f"--program {args.program}: placement {index} has programs 0..{len(chosen.order) - 1}")
    program = chosen.result.programs[chosen.order[args.program]]
    lowered = lower(program, chosen.result.placement, problem.reduce_axes, problem.goal)
    verify_lowered(lowered)  # never write an unproved plan
    document = plan_document(chosen.result.placement, problem.reduce_axes, lowered)
    document["predicted_s"] = chosen.predicted_s[args.program]
    write_plan(args.out, document)
    return index, args.program


def _model_document(context: dict[str, Any]) -> dict[str, Any]:
    return {"size_bytes": context["size_bytes"], "algo": context["algo"], "profile": context["profile"]}


def _json_document(problem, ranked, by_speed, listed, context) -> dict[str, Any]:
    return {
        "topology": problem.topology.to_dict(),
        "axes": [{"name": a.name, "size": a.size} for a in problem.axes],
        "reduce": list(problem.reduce_axes),
        "collective": problem.goal.value,
        "constraints": [str(c) for c in problem.constraints],
        "max_steps": problem.max_steps,
        "model": _model_document(context),
        "synthesis_s": round(context["synth_s"], 6),
        "prediction_s": round(context["predict_s"], 6),
        "verified": context["verify"],
        "placements": [
            {
                "index": i,
                "rank": n,
                "matrix": [list(row) for row in ranked[i].result.placement.matrix],
                "mesh": ranked[i].result.placement.mesh.tolist(),
                "synthesis_hierarchy": [
                    {"name": name, "size": size}
                    for name, size in zip(ranked[i].result.hierarchy.names, ranked[i].result.hierarchy.sizes)
                ],
                "crosses": list(ranked[i].result.hierarchy.names),
                "num_programs": len(ranked[i].order),
                "default": {
                    "text": format_program(default_program(problem.goal)),
                    "predicted_s": ranked[i].default_s,
                },
                "best_predicted_s": ranked[i].best_s if ranked[i].order else None,
                "predicted_speedup": ranked[i].speedup,
                "programs": listed[i],
            }
            for n, i in enumerate(by_speed)
        ],
    }


def _model_line(context: dict[str, Any]) -> str:
    algo = {"ring": "NCCL ring", "tree": "NCCL tree", "mpi": "MPI (OpenMPI tuned defaults)"}[context["algo"]]
    source = f"profile {context['profile']}" if context["profile"] else "topology's numbers as priors"
    return f"predicted for {format_size(context['size_bytes'])} per device, {algo} model, {source}"


def _print_table(problem, ranked, by_speed, listed, context) -> None:
    total = sum(len(r.order) for r in ranked)
    print(problem.describe())
    print(_model_line(context))
    print(
        f"{len(ranked)} placement(s), {total} program(s) of at most {problem.max_steps} steps; "
        f"synthesized in {context['synth_s'] * 1e3:.0f} ms, predicted in {context['predict_s'] * 1e3:.0f} ms"
        + ("; listed programs verified (numpy reference + z3)" if context["verify"] else "")
    )
    print(f"\nmatrix rows are axes, columns are levels ({' '.join(problem.topology.level_names)}); "
          "default = one AllReduce over each whole reduction group")
    header = (f"{'rank':>4} {'#':>3}  {'matrix':<22} {'reduction crosses':<22} {'progs':>5} "
              f"{'default':>11} {'best':>11} {'speedup':>7}  programs, fastest first")
    print(header)
    print("-" * len(header))
    for n, i in enumerate(by_speed):
        r = ranked[i]
        crosses = r.result.hierarchy.describe() if r.result.hierarchy.names else "(nothing: k=1)"
        docs = listed[i]
        first = docs[0] if docs else None
        print(
            f"{n + 1:>4} {i:>3}  {r.result.placement.matrix_text():<22} {crosses:<22} "
            f"{len(r.order):>5} {format_seconds(r.default_s):>11} "
            f"{format_seconds(r.best_s) if r.order else '-':>11} {r.speedup:>6.2f}x  "
            + (first["text"].replace(chr(10), " ; ") if first else "(none within the step limit)")
        )
        for doc in docs[1:]:
            print(f"{'':>4} {'':>3}  {'':<22} {'':<22} {'':>5} {'':>11} {format_seconds(doc['predicted_s']):>11} "
                  f"{'':>7}  {doc['text'].replace(chr(10), ' ; ')}")


def _run_workload(args: argparse.Namespace) -> int:
    if args.reduce is not None or args.collective is not None or args.size is not None:
        raise SynthError("--workload replaces --reduce, --collective and --size; give one or the other")
    problem = problem_from_args(args)
    workload = parse_workload(args.workload, problem.axes)
    profile = _load_profile(args.profile, problem.topology)
    started = time.perf_counter()
    costs = rank_placements(placements_of(problem), workload, problem.max_steps, args.algo, profile)
    elapsed_s = time.perf_counter() - started
    verify = not args.no_verify
    best_docs = []
    for cost in costs:
        docs = []
        for item, ranked in zip(workload, cost.items):
            docs.append(_program_document(ranked, 0, replace(problem, reduce_axes=item.reduce_axes, goal=item.goal), verify)
                        if ranked.order else None)
        best_docs.append(docs)
    if args.json:
        print(json.dumps({
            "topology": problem.topology.to_dict(),
            "axes": [{"name": a.name, "size": a.size} for a in problem.axes],
            "workload": [{"reduce": list(w.reduce_axes), "collective": w.goal.value, "size_bytes": w.size_bytes,
                          "repetitions": w.repetitions} for w in workload],
            "model": {"algo": args.algo, "profile": args.profile},
            "elapsed_s": round(elapsed_s, 6),
            "placements": [
                {
                    "index": c.index, "rank": n,
                    "matrix": [list(row) for row in c.placement.matrix],
                    "mesh": c.placement.mesh.tolist(),
                    "total_predicted_s": c.total_s(workload),
                    "default_total_predicted_s": c.default_total_s(workload),
                    "items": [
                        {"reduce": list(w.reduce_axes), "collective": w.goal.value, "size_bytes": w.size_bytes,
                         "repetitions": w.repetitions, "default_predicted_s": r.default_s,
                         "best_predicted_s": r.best_s if r.order else None, "best_program": doc}
                        for w, r, doc in zip(workload, c.items, docs)
                    ],
                }
                for n, (c, docs) in enumerate(zip(costs, best_docs))
            ],
        }, indent=1))
        return 0
    items = ", ".join(f"{'+'.join(w.reduce_axes)} {w.goal.value} {format_size(w.size_bytes)}"
                      + (f" x{w.repetitions}" if w.repetitions > 1 else "") for w in workload)
    print(f"topology {problem.topology.name} ({problem.topology.num_devices} devices); "
          f"axes {' '.join(f'{a.name}={a.size}' for a in problem.axes)}")
    print(f"workload per step: {items}")
    print(_model_line({"size_bytes": 0, "algo": args.algo, "profile": args.profile}).split(", ", 1)[1])
    print(f"{len(costs)} placement(s) ranked in {elapsed_s * 1e3:.0f} ms; each reduction uses its best predicted program"
          + ("; those programs verified (numpy reference + z3)" if verify else ""))
    print()
    header = (f"{'rank':>4} {'#':>3}  {'matrix':<22} {'total':>11} {'with default':>13}  "
              "best program per reduction")
    print(header)
    print("-" * len(header))
    for n, (c, docs) in enumerate(zip(costs, best_docs)):
        print(f"{n + 1:>4} {c.index:>3}  {c.placement.matrix_text():<22} "
              f"{format_seconds(c.total_s(workload)):>11} {format_seconds(c.default_total_s(workload)):>13}  "
              + " | ".join(
                  f"{'+'.join(w.reduce_axes)}: " + (d["text"].replace(chr(10), " ; ") if d else "-")
                  for w, d in zip(workload, docs)))
    return 0


# ---------------------------------------------------------------- verify / check


def _run_verify(argv: Sequence[str]) -> int:
    p = Parser(prog="synth-reduce verify", description="Re-prove a plan file (numpy reference and z3).")
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
    p = Parser(
        prog="synth-reduce check",
        description="Parse a hand-written program and verify it implements the reduction.",
    )
    p.add_argument("file", help="program text file ('-' for standard input)")
    add_problem_arguments(p)
    p.add_argument("--matrix", help="check on this placement only, rows=axes separated by ';', e.g. '4,1;1,16'")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    problem = problem_from_args(args)
    try:
        text = sys.stdin.read() if args.file == "-" else open(args.file).read()
    except OSError as exc:
        raise SynthError(f"{args.file}: cannot read program ({exc.strerror})") from None
    program = parse_program(text, args.file)
    if args.matrix:
        placements = [Placement(problem.topology, problem.axes, parse_matrix(args.matrix, problem.axes, problem.topology))]
    else:
        placements = placements_of(problem)
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


def _add_efficiency_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--efficiency", action="store_true",
                   help="also fit one efficiency per collective (lower error, but on the emulated cluster a worse "
                        "ranking: docs/results.md); default: keep the starting profile's")


def _run_fit(argv: Sequence[str]) -> int:
    p = Parser(prog="synth-reduce fit", description="Fit per-level bandwidth and latency and the per-call "
                "overhead (with --efficiency also per-collective efficiencies) to measurements (JSON lines from "
                "'synth-reduce bench --jsonl').")
    p.add_argument("measurements", help="JSON-lines file of measurements")
    p.add_argument("-o", "--output", required=True, metavar="PROFILE.json", help="where to write the profile")
    p.add_argument("--profile", metavar="PROFILE.json", help="start from this profile instead of the topology's numbers")
    _add_efficiency_flag(p)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    topology, measurements = load_measurements(args.measurements)
    prior = _load_profile(args.profile, topology) or Profile.prior(topology)
    profile, report = fit_profile(measurements, prior, efficiency=args.efficiency)
    save_profile(args.output, profile, report.to_dict())
    if args.json:
        print(json.dumps(profile_document(profile, report.to_dict()), indent=1))
        return 0
    print(f"fitted {report.records} measurements of topology {topology.name} in {report.iterations} iteration(s) -> {args.output}")
    print(f"{'level':<10} {'bandwidth_GBps':>15} {'(prior)':>10} {'latency_us':>11} {'(prior)':>9}")
    for name, bw, lat, bw0, lat0 in zip(profile.level_names, profile.bandwidth_GBps, profile.latency_us,
                                        prior.bandwidth_GBps, prior.latency_us):
        print(f"{name:<10} {bw:>15.4g} {bw0:>10.4g} {lat:>11.4g} {lat0:>9.4g}")
    print("efficiency: " + ", ".join(f"{c} {e:.3g}" for c, e in profile.efficiency))
    print(f"call overhead: {profile.call_overhead_us:.3g} us per collective call (prior {prior.call_overhead_us:.3g})")
    print(f"residuals: median {report.median_rel_error:.1%}, mean {report.mean_rel_error:.1%}, "
          f"max {report.max_rel_error:.1%} relative; RMSE {format_seconds(report.rmse_s)}")
    return 0


def _run_validate(argv: Sequence[str]) -> int:
    p = Parser(prog="synth-reduce validate", description="Score the cost model on measurements: top-k accuracy "
                "(is the measured fastest program among the k predicted fastest?), Spearman correlation, relative error.")
    p.add_argument("measurements", help="JSON-lines file of measurements")
    p.add_argument("--profile", metavar="PROFILE.json", help="parameters to score (default: the topology's numbers)")
    p.add_argument("--holdout", type=float, metavar="FRACTION",
                   help="fit on the other cases (from --profile or the prior) and score this held-out fraction")
    p.add_argument("--seed", type=int, default=0, help="seed of the --holdout split (default 0)")
    _add_efficiency_flag(p)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    topology, measurements = load_measurements(args.measurements)
    profile = _load_profile(args.profile, topology) or Profile.prior(topology)
    scored, fitted_on = measurements, 0
    if args.efficiency and args.holdout is None:
        raise SynthError("--efficiency applies to the --holdout fit; give --holdout FRACTION")
    if args.holdout is not None:
        train, scored = split_cases(measurements, args.holdout, args.seed)
        profile, _ = fit_profile(train, profile, efficiency=args.efficiency)
        fitted_on = len(train)
    acc = accuracy(profile, scored)
    ranked = acc.cases > 0  # top-k and Spearman need a case with two programs
    doc = {"cases": acc.cases, "records": acc.records, "fitted_on_records": fitted_on,
           "top_k": {str(k): v for k, v in acc.top_k.items()} if ranked else None,
           "spearman_mean": acc.spearman_mean if ranked else None,
           "median_rel_error": acc.median_rel_error}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    scope = (f"{acc.records} held-out measurements (fitted on {fitted_on})" if args.holdout is not None
             else f"{acc.records} measurements")
    print(f"scored {scope}: {acc.cases} case(s) (placement x reduction x size x algorithm) with >= 2 programs")
    if ranked:
        print("top-k accuracy: " + "  ".join(f"top-{k} {v:.0%}" for k, v in acc.top_k.items()))
        print(f"Spearman correlation per case (mean): {acc.spearman_mean:.3f}")
    else:
        print("top-k accuracy and Spearman: n/a (no case has two programs measured)")
    print(f"median relative error of predicted times: {acc.median_rel_error:.1%}")
    return 0


# The runtime's and the testbed's commands import their modules on use: the
# main command never loads mpi4py or touches network namespaces.


def _run_bench(argv: Sequence[str]) -> int:
    from .bench import bench_main

    return bench_main(list(argv))


def _run_tune(argv: Sequence[str]) -> int:
    from .bench import tune_main

    return tune_main(list(argv))


def _run_emulate(argv: Sequence[str]) -> int:
    from .testbed import emulate_main

    return emulate_main(list(argv))


COMMANDS = {
    "fit": _run_fit,
    "validate": _run_validate,
    "verify": _run_verify,
    "check": _run_check,
    "bench": _run_bench,
    "tune": _run_tune,
    "emulate": _run_emulate,
}


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
