"""``synth-reduce fit`` and ``synth-reduce validate``: learn the cost model's
parameters from measurements (bench records or NCCL corpus lines) and score its
accuracy."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from typing import Sequence

import numpy as np

from ..cost import Model, NetworkProfile, load_profile, profile_document, save_profile
from ..cost.fit import MIN_CASES, accuracy, fit_profile, load_measurements, split_cases
from ..documents import check_writable
from ..errors import SynthError
from ..planner.compute import (
    compute_profile_document,
    load_compute_profile,
    operation_profile_document,
    save_compute_profile,
    save_operation_profile,
)
from ..planner.operations import OperationProfile
from ..planner.stepfit import RecordCosts, fit_compute, fit_micro_batch_cost, predicted_step_s
from ..planner.steprecords import SCHEMA as STEP_SCHEMA
from ..planner.steprecords import first_schema, read_step_records
from ..topology import Topology, load_topology
from ..units import format_seconds
from .args import Parser


def _start(path: str | None, topology: Topology, default: str) -> NetworkProfile:
    """The profile to start from: ``path`` (checked against the topology), the
    prior (``path`` = ``prior``) or, without ``path``, ``default`` (``prior``,
    or ``shipped``: the shipped calibration)."""
    if path is None and default == "prior":
        path = "prior"
    return Model.load("nccl", path).profile_for(topology)


def _add_input_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("measurements", nargs="+",
                   help="JSON-lines files: 'synth-reduce bench --jsonl' records, or NCCL corpus lines "
                        "(data/nccl/*.jsonl, with --topology)")
    p.add_argument("--topology", help="the measured system for NCCL corpus lines (YAML file or shipped name); "
                                      "each line is a call over its first 'ranks' devices")
    p.add_argument("--efficiency", action="store_true",
                   help="also fit the MPI model's efficiency per collective (lower error, but on the emulated "
                        "cluster a worse ranking: docs/results.md); NCCL (algorithm, protocol) efficiencies are "
                        "always fitted")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")


def _load(args: argparse.Namespace):
    return load_measurements(args.measurements, load_topology(args.topology) if args.topology else None)


def run_fit(argv: Sequence[str]) -> int:
    p = Parser(prog="synth-reduce fit", description="Fit the cost model's parameters (per level bandwidth and "
                "latency, NCCL step latency per protocol and base latency per algorithm and protocol, NCCL "
                "efficiencies; with --efficiency per-collective efficiencies) to measurements. Parameters the "
                "measurements cannot identify keep their prior and are listed. Given step-time records (schema "
                "synth-reduce/step), fit the job planner's compute-efficiency curve instead.")
    _add_input_arguments(p)
    p.add_argument("-o", "--output", required=True, metavar="PROFILE.json", help="where to write the profile")
    p.add_argument("--profile", metavar="PROFILE.json", help="start from this profile instead of the topology's "
                   "numbers and NCCL's constants ('prior', the default) (step records: the communication profile "
                   "to predict their collectives with; default: the shipped calibration)")
    p.add_argument("--compute-profile", metavar="COMPUTE.json",
                   help="step records only: a per-operation compute profile (synth-reduce calibrate) whose fixed "
                        "cost per micro-batch the records fit, instead of fitting the efficiency curve")
    args = p.parse_args(argv)
    check_writable(args.output, "--output")  # before the fit, not after it
    if first_schema(args.measurements[0]) == STEP_SCHEMA:
        return _fit_steps(args)
    if args.compute_profile:
        raise SynthError("--compute-profile goes with step-time records (schema synth-reduce/step); these are "
                         "collective measurements")
    topology, measurements, skipped = _load(args)
    prior = _start(args.profile, topology, "prior")  # a user's own fit starts from the physics alone
    profile, report = fit_profile(measurements, prior, efficiency=args.efficiency)
    save_profile(args.output, profile, report.to_dict())
    if args.json:
        print(json.dumps(profile_document(profile, report.to_dict()), indent=1))
        return 0
    extra = f"; {skipped} corpus line(s) skipped (not a collective the model has)" if skipped else ""
    print(f"fitted {report.records} measurements of topology {topology.name} in {report.iterations} "
          f"iteration(s) -> {args.output}{extra}")
    print(f"{'level':<10} {'bandwidth_GBps':>15} {'(prior)':>10} {'latency_us':>11} {'(prior)':>9}  "
          f"NCCL step latency_us LL / LL128 / Simple (prior)")
    for i, name in enumerate(profile.level_names):
        steps = " / ".join(f"{v:.3g}" for v in profile.protocol_latency_us[i])
        steps0 = " / ".join(f"{v:.3g}" for v in prior.protocol_latency_us[i])
        print(f"{name:<10} {profile.bandwidth_GBps[i]:>15.4g} {prior.bandwidth_GBps[i]:>10.4g} "
              f"{profile.latency_us[i]:>11.4g} {prior.latency_us[i]:>9.4g}  {steps} ({steps0})")
    changed = [(k, e, prior.efficiency_of(k)) for k, e in profile.efficiency
               if not math.isclose(e, prior.efficiency_of(k), rel_tol=1e-9)]
    if changed:
        print("efficiency: " + ", ".join(f"{k} {e:.3g} ({e0:.3g})" for k, e, e0 in changed))
    base = [(k, v, prior.base_us(k)) for k, v in profile.base_latency_us
            if not math.isclose(v, prior.base_us(k), rel_tol=1e-9)]
    if base:
        print("NCCL base latency_us: " + ", ".join(f"{k} {v:.3g} ({v0:.3g})" for k, v, v0 in base))
    print(f"call overhead: {profile.call_overhead_us:.3g} us per collective call (prior {prior.call_overhead_us:.3g})")
    print(f"residuals: median {report.median_rel_error:.1%}, mean {report.mean_rel_error:.1%}, "
          f"max {report.max_rel_error:.1%} relative; RMSE {format_seconds(report.rmse_s)}")
    if report.not_identified:
        print("kept at the prior, not identified by these measurements: "
              + "; ".join(f"{name} ({why})" for name, why in report.not_identified))
    if report.at_zero:
        print("fitted at 0 (these measurements show no such latency): " + ", ".join(report.at_zero))
    print(f"kept at the prior, exercised by no measurement: {len(report.not_exercised)} parameter(s) "
          f"(--json lists them)")
    return 0


def _fit_steps(args: argparse.Namespace) -> int:
    """``fit`` on step-time records: the compute-efficiency curve (synth.planner.stepfit)."""
    if args.efficiency:
        raise SynthError("--efficiency fits collective efficiencies from measurements; step records fit the "
                         "compute curve only")
    if len(args.measurements) != 1 or args.topology:
        raise SynthError("step records are fitted from one file, without --topology (each record names its own)")
    path = args.measurements[0]
    if args.profile == "prior":
        raise SynthError("--profile prior: step records take a fitted communication profile (synth-reduce fit), or "
                         "none for the shipped calibration")
    records = read_step_records(path)
    profile = load_profile(args.profile) if args.profile else None
    costs = RecordCosts(profile, args.profile)
    if args.compute_profile:
        return _fit_fixed_cost(args, records, costs)
    fit, points = fit_compute(records, costs, source=f"synth-reduce fit {path}")
    predicted = [predicted_step_s(p.record, fit.profile, costs) for p in points]
    rel = [abs(q - p.record.step_s) / p.record.step_s for q, p in zip(predicted, points)]
    report = {"records": len(records), "step_median_rel_error": float(np.median(rel)),
              "step_max_rel_error": max(rel), "communication_profile": args.profile}
    save_compute_profile(args.output, fit, report)
    if args.json:
        print(json.dumps(compute_profile_document(fit, report), indent=1))
        return 0
    c = fit.profile
    print(f"fitted the compute-efficiency curve to {len(records)} step records -> {args.output}")
    print(f"efficiency(x) = {c.efficiency_max:.4f} x x / (x + {c.half_flops:.4g}), x = FLOPs per layer and "
          "micro-batch per device")
    print(f"{'line':>5} {'configuration':<26} {'x (FLOP)':>10} {'implied':>8} {'measured':>11} {'predicted':>11}")
    for p, q in zip(points, predicted):
        print(f"{p.record.line:>5} {p.record.config.describe():<26} {p.flops_per_layer:>10.3g} "
              f"{p.efficiency:>8.3f} {format_seconds(p.record.step_s):>11} {format_seconds(q):>11}")
    print(f"step time residuals: median {report['step_median_rel_error']:.1%}, "
          f"max {report['step_max_rel_error']:.1%}")
    return 0


def run_validate(argv: Sequence[str]) -> int:
    p = Parser(prog="synth-reduce validate", description="Score the cost model on measurements: top-k accuracy "
                "(is the measured fastest program among the k predicted fastest?) with 95% confidence intervals, "
                f"from at least {MIN_CASES} cases; Spearman correlation; relative error.")
    _add_input_arguments(p)
    p.add_argument("--profile", metavar="PROFILE.json", help="parameters to score: a fitted profile, or 'prior' "
                   "(the topology's numbers and NCCL's constants) (default: the shipped calibration)")
    p.add_argument("--holdout", type=float, metavar="FRACTION",
                   help="fit on the other cases (from --profile or the prior) and score this held-out fraction")
    p.add_argument("--seed", type=int, default=0, help="seed of the --holdout split (default 0)")
    args = p.parse_args(argv)
    topology, measurements, _ = _load(args)
    profile = _start(args.profile, topology, "shipped")
    scored, fitted_on = measurements, 0
    if args.efficiency and args.holdout is None:
        raise SynthError("--efficiency applies to the --holdout fit; give --holdout FRACTION")
    if args.holdout is not None:
        train, scored = split_cases(measurements, args.holdout, args.seed)
        profile, _ = fit_profile(train, profile, efficiency=args.efficiency)
        fitted_on = len(train)
    acc = accuracy(profile, scored)
    ranked = acc.enough_cases
    doc = {"cases": acc.cases, "records": acc.records, "fitted_on_records": fitted_on, "min_cases": MIN_CASES,
           "top_k": {str(k): v for k, v in acc.top_k.items()} if ranked else None,
           "top_k_ci95": {str(k): list(v) for k, v in acc.top_k_ci.items()} if ranked else None,
           "spearman_mean": acc.spearman_mean if ranked else None,
           "median_rel_error": acc.median_rel_error}
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    scope = (f"{acc.records} held-out measurements (fitted on {fitted_on})" if args.holdout is not None
             else f"{acc.records} measurements")
    print(f"scored {scope}: {acc.cases} case(s) (placement x reduction x size x algorithm) with >= 2 programs")
    if ranked:
        print("top-k accuracy (95% interval): " + "  ".join(
            f"top-{k} {v:.0%} ({lo:.0%}-{hi:.0%})" for (k, v), (lo, hi) in zip(acc.top_k.items(), acc.top_k_ci.values())))
        print(f"Spearman correlation per case (mean): {acc.spearman_mean:.3f}")
    else:
        print(f"top-k accuracy and Spearman: n/a ({acc.cases} case(s) with two or more programs measured; "
              f"at least {MIN_CASES} are needed)")
    print(f"median relative error of predicted times: {acc.median_rel_error:.1%}")
    return 0


def _fit_fixed_cost(args: argparse.Namespace, records, costs: RecordCosts) -> int:
    """``fit STEPS.jsonl --compute-profile OPS.json``: the per-operation
    profile's fixed cost per micro-batch fitted to the step records."""
    base = load_compute_profile(args.compute_profile)
    if not isinstance(base, OperationProfile):
        raise SynthError(f"--compute-profile {args.compute_profile}: an efficiency curve (version 1); give a "
                         "per-operation profile (version 2, synth-reduce calibrate), or leave --compute-profile out "
                         "to fit a curve")
    fitted = fit_micro_batch_cost(records, base, costs)
    predicted = [predicted_step_s(r, fitted, costs) for r in records]
    rel = [abs(q - r.step_s) / r.step_s for q, r in zip(predicted, records)]
    fitted = replace(fitted, fit={**fitted.fit, "steps": {
        "records": len(records), "source": args.measurements[0], "step_median_rel_error": float(np.median(rel)),
        "step_max_rel_error": max(rel), "communication_profile": args.profile}})
    save_operation_profile(args.output, fitted)
    if args.json:
        print(json.dumps(operation_profile_document(fitted), indent=1))
        return 0
    print(f"fitted the fixed cost per micro-batch of {args.compute_profile} to {len(records)} step records -> "
          f"{args.output}: {format_seconds(fitted.micro_batch_s)} (before: {format_seconds(base.micro_batch_s)})")
    print(f"{'line':>5} {'configuration':<26} {'measured':>11} {'predicted':>11}")
    for r, q in zip(records, predicted):
        print(f"{r.line:>5} {r.config.describe():<26} {format_seconds(r.step_s):>11} {format_seconds(q):>11}")
    print(f"step time residuals: median {np.median(rel):.1%}, max {max(rel):.1%}")
    return 0
