"""``synth-reduce fit`` and ``synth-reduce validate``: learn the cost model's
parameters from measurements and score its accuracy."""

from __future__ import annotations

import argparse
import json
from typing import Sequence

from ..cost import Model, Profile, profile_document, save_profile
from ..errors import SynthError
from ..fit import accuracy, fit_profile, load_samples, split_cases
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
                "'synth-reduce bench --jsonl').")
    p.add_argument("measurements", help="JSON-lines file of measurements")
    p.add_argument("-o", "--output", required=True, metavar="PROFILE.json", help="where to write the profile")
    p.add_argument("--profile", metavar="PROFILE.json", help="start from this profile instead of the topology's numbers")
    _add_efficiency_flag(p)
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    args = p.parse_args(argv)
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
