"""``synth-reduce fit`` and ``synth-reduce validate``: learn the cost model's
parameters from measurements and score its accuracy."""

from __future__ import annotations

import argparse
import json
from typing import Sequence

import numpy as np

from ..compute import compute_profile_document, save_compute_profile
from ..cost import Model, Profile, load_profile, profile_document, save_profile
from ..errors import SynthError
from ..fit import accuracy, fit_profile, load_samples, split_cases
from ..stepfit import RecordCosts, fit_compute, predicted_step_s
from ..steprecords import SCHEMA as STEP_SCHEMA
from ..steprecords import first_schema, read_step_records
from ..topology import Topology
from ..units import format_seconds
from .args import Parser


def _start(path: str | None, topology: Topology) -> Profile:
    """The profile to start from: ``path`` (checked against the topology) or the prior."""
    return Model.load("ring", path).profile_for(topology)


def _add_efficiency_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--efficiency", action="store_true",
                   help="also fit one efficiency per collective (lower error, but on the emulated cluster a worse "
                        "ranking: docs/results.md); default: keep the starting profile's")


def run_fit(argv: Sequence[str]) -> int:
    p = Parser(prog="synth-reduce fit", description="Fit per-level bandwidth and latency and the per-call "
                "overhead (with --efficiency also per-collective efficiencies) to measurements (JSON lines from "
                "'synth-reduce bench --jsonl'); or, given step-time records (schema synth-reduce/step), the job "
                "planner's compute-efficiency curve.")
    p.add_argument("measurements", help="JSON-lines file of measurements or of step-time records")
    p.add_argument("-o", "--output", required=True, metavar="PROFILE.json", help="where to write the profile")
    p.add_argument("--profile", metavar="PROFILE.json", help="start from this profile instead of the topology's "
                   "numbers (step records: the communication profile to predict their collectives with)")
    _add_efficiency_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    args = p.parse_args(argv)
    if first_schema(args.measurements) == STEP_SCHEMA:
        return _fit_steps(args)
    topology, measurements = load_samples(args.measurements)
    prior = _start(args.profile, topology)
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


def _fit_steps(args: argparse.Namespace) -> int:
    """``fit`` on step-time records: the compute-efficiency curve (synth.stepfit)."""
    if args.efficiency:
        raise SynthError("--efficiency fits collective efficiencies from measurements; step records fit the "
                         "compute curve only")
    records = read_step_records(args.measurements)
    profile = load_profile(args.profile) if args.profile else None
    costs = RecordCosts(profile, args.profile)
    fit, points = fit_compute(records, costs, source=f"synth-reduce fit {args.measurements}")
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
                "(is the measured fastest program among the k predicted fastest?), Spearman correlation, relative error.")
    p.add_argument("measurements", help="JSON-lines file of measurements")
    p.add_argument("--profile", metavar="PROFILE.json", help="parameters to score (default: the topology's numbers)")
    p.add_argument("--holdout", type=float, metavar="FRACTION",
                   help="fit on the other cases (from --profile or the prior) and score this held-out fraction")
    p.add_argument("--seed", type=int, default=0, help="seed of the --holdout split (default 0)")
    _add_efficiency_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    args = p.parse_args(argv)
    topology, measurements = load_samples(args.measurements)
    profile = _start(args.profile, topology)
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
