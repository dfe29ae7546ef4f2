"""Accuracy of the per-operation compute model on operation timings it was not
fitted on: each GEMM token count and each attention sequence length left out in
turn (the model fitted on the rest, scored on it), and the fit's own residuals.

    python scripts/compute_accuracy.py [--records data/calibration/h100-ops.jsonl] [--units 132]

Prints a Markdown table (docs/planner.md, "The per-operation compute model").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synth.planner.calibration import fit_operation_profile, op_lines, op_records  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def _stats(predicted: np.ndarray, measured: np.ndarray) -> str:
    rel = np.abs(predicted / measured - 1)
    return f"{np.median(rel):.1%} | {np.quantile(rel, 0.9):.1%} | {len(rel)}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", default=str(REPO / "data" / "calibration" / "h100-ops.jsonl"))
    p.add_argument("--units", type=int, default=132)
    args = p.parse_args()
    lines = op_lines(args.records)
    print("| left out | fitted on | family | median error | p90 error | points |")
    print("| --- | --- | --- | --- | --- | --- |")
    for tokens in sorted({r["M"] for _, r in lines if r.get("op") == "gemm"}):
        train = op_records([(w, r) for w, r in lines if r.get("M") != tokens])
        held = op_records([(w, r) for w, r in lines if r.get("op") != "gemm" or r["M"] == tokens])
        profile = fit_operation_profile(train, args.units, "held-out", ["-"], "")
        m, k, n, measured = held.gemm.T
        print(f"| GEMMs at M = {tokens} | the other token counts | GEMM (fwd, dgrad, wgrad) | "
              f"{_stats(profile.gemm.seconds(m, k, n), measured)} |")
    for seq in sorted({r["seq"] for _, r in lines if r.get("op") == "attention"}):
        train = op_records([(w, r) for w, r in lines if r.get("seq") != seq])
        held = op_records([(w, r) for w, r in lines if r.get("op") != "attention" or r["seq"] == seq])
        profile = fit_operation_profile(train, args.units, "held-out", ["-"], "")
        b, h, s, d, _, forward, backward = held.attention.T
        a = profile.attention
        print(f"| attention at s = {seq} | the other lengths | forward | {_stats(a.forward_s(b, h, s, d), forward)} |")
        print(f"| attention at s = {seq} | the other lengths | backward | "
              f"{_stats(a.backward_s(b, h, s, d), backward)} |")
    whole = fit_operation_profile(op_records(lines), args.units, "all", ["-"], "")
    for family, stats in whole.fit.items():
        if isinstance(stats, dict):
            print(f"| nothing (own residuals) | all | {family} | {stats['median_rel_error']:.1%} | "
                  f"{stats['p90_rel_error']:.1%} | {stats['points']} |")


if __name__ == "__main__":
    main()
