"""``synth-reduce calibrate``: measure this machine's GPU operation by operation
with PyTorch (or read such measurements) and fit a per-operation compute
profile (``synth-reduce/compute-profile`` version 2)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from ..documents import check_writable, write_text
from ..errors import SynthError
from ..planner.calibration import CPU_GRID, GPU_GRID, fit_host, fit_operation_profile, measure, op_lines, op_records
from ..planner.compute import operation_profile_document, save_operation_profile
from ..units import bounded_int
from .args import Parser

MAX_UNITS = 4096


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="synth-reduce calibrate",
               description="Measure GEMMs, causal attention and memory-bound passes on this machine's GPU with "
                           "PyTorch (the grid the shipped H100 profile was fitted on, a few minutes; a progress line "
                           "per family on stderr) and fit a per-operation compute profile for plan, fit and "
                           "compute (--compute-profile). With --records, fit measurements taken before instead.")
    p.add_argument("--out", required=True, metavar="PROFILE.json", help="where to write the profile")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="what to measure: the GPU (default) or, to try the mechanics, the CPU with a tiny grid")
    p.add_argument("--records", metavar="OPS.jsonl",
                   help="fit these operation records (the format of data/calibration/h100-ops.jsonl) "
                        "instead of measuring")
    p.add_argument("--layer-records", metavar="LAYERS.jsonl",
                   help="whole-layer records with eager and CUDA-graph times (scripts/layer_accuracy.py measure, "
                        "e.g. data/calibration/h100-layers.jsonl): fit the host's seconds per kernel launch from "
                        "the host-bound ones (without: not modelled)")
    p.add_argument("--records-out", metavar="OPS.jsonl", help="also keep the measured records (JSON lines)")
    p.add_argument("--units", type=lambda text: bounded_int(text, "--units", MAX_UNITS),
                   help="the GPU's streaming multiprocessors (default: what PyTorch reports, or the records' "
                        "'units'; needed with --records that lack it)")
    p.add_argument("--name", help="the profile's name (default: the --out file name without .compute.json)")
    p.add_argument("--device-name", action="append", default=[], metavar="NAME",
                   help="a device name the profile applies to, besides the measured one (e.g. a topology's "
                        "device.name); repeatable")
    p.add_argument("--json", action="store_true", help="print the profile document instead of text")
    return p


def _units(args: argparse.Namespace, recorded: set[int]) -> int:
    if args.units:
        return args.units
    if len(recorded) == 1:
        return recorded.pop()
    if len(recorded) > 1:
        raise SynthError(f"the records give several 'units' ({', '.join(map(str, sorted(recorded)))}): they come "
                         "from different GPUs; fit one GPU's records")
    raise SynthError("--units N: the records do not say how many streaming multiprocessors the GPU has "
                     "(H100 SXM: 132, A100: 108)")


def run(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    check_writable(args.out, "--out")  # before measuring, not after
    if args.records_out:
        if args.records:
            raise SynthError("--records-out keeps new measurements; with --records nothing is measured")
        check_writable(args.records_out, "--records-out")
    if args.records:
        source = f"synth-reduce calibrate --records {args.records}"
        lines = op_lines(args.records)
        records = op_records(lines)
        recorded = {v.get("units") for _, v in lines if isinstance(v, dict) and isinstance(v.get("units"), int)}
    else:
        measured: list[dict] = []
        grid = GPU_GRID if args.device == "cuda" else CPU_GRID
        if args.device == "cuda":
            _require_cuda()  # before saying what it measures
        print(f"calibrate: measuring on {args.device} ({len(grid.gemm_shapes())} GEMM shapes, "
              f"{len(grid.sequences) * len(grid.heads) * len(grid.batches)} attention shapes, "
              f"{4 * len(grid.elements)} elementwise passes)", file=sys.stderr, flush=True)
        measure(args.device, grid, measured.append)
        units = args.units or _device_units(args.device)
        for record in measured:
            record["units"] = units
        if args.records_out:
            write_text(args.records_out, "operation records", "".join(json.dumps(r) + "\n" for r in measured))
        records = op_records((f"measurement {i + 1}", r) for i, r in enumerate(measured))
        recorded = {units}
        source = f"synth-reduce calibrate --device {args.device}"
    name = args.name or Path(args.out).name.removesuffix(".json").removesuffix(".compute")
    devices = list(dict.fromkeys([*records.devices, *args.device_name]))
    if not devices:
        raise SynthError("the records name no device ('gpu' field): give --device-name NAME")
    profile = fit_operation_profile(records, _units(args, set(recorded)), name, devices, source)
    if args.layer_records:
        host, stats = fit_host(op_lines(args.layer_records))
        profile = replace(profile, host=host, source=f"{source} --layer-records {args.layer_records}",
                          fit={**profile.fit, "host": stats})
    save_operation_profile(args.out, profile)
    if args.json:
        print(json.dumps(operation_profile_document(profile), indent=1))
        return 0
    print(f"fitted {records.count} operation records -> {args.out} (profile '{name}' for {', '.join(devices)})")
    g, a, e = profile.gemm, profile.attention, profile.elementwise
    print(f"GEMM: {g.rate_flops / 1e12:.1f} TFLOP/s on full waves of {g.units} units, split-K pieces of at least "
          f"{g.split_k_min}, {g.floor_s * 1e6:.1f} us per call at least")
    print(f"attention: forward {a.forward_rate_flops / 1e12:.1f}, backward {a.backward_rate_flops / 1e12:.1f} "
          f"TFLOP/s; {a.row_blocks:g} blocks per query row; at least {a.forward_floor_s * 1e6:.1f} / "
          f"{a.backward_floor_s * 1e6:.1f} us per call")
    if profile.host.forward_launch_s:
        print(f"host: {profile.host.forward_launch_s * 1e6:.1f} us per kernel launch forward, "
              f"{profile.host.backward_launch_s * 1e6:.1f} backward (fitted on {profile.fit['host']['layers']} layers, "
              f"{profile.fit['host']['host_bound_forward']} and {profile.fit['host']['host_bound_backward']} of their "
              "phases host-bound)")
    print(f"memory-bound: {e.bandwidth_Bps / 1e9:.0f} GB/s (add); "
          + ", ".join(f"{p.name} {p.seconds_per_element * 1e12:.3g} ps per element" for p in e.passes))
    print(f"{'family':<20} {'points':>6} {'median':>7} {'p90':>7} {'max':>7}  (relative errors on these records)")
    for family, stats in profile.fit.items():
        if isinstance(stats, dict) and "median_rel_error" in stats:
            print(f"{family:<20} {stats['points']:>6} {stats['median_rel_error']:>7.1%} "
                  f"{stats['p90_rel_error']:>7.1%} {stats['max_rel_error']:>7.1%}")
    return 0


def _device_units(device: str) -> int:
    if device == "cpu":
        return os.cpu_count() or 1
    import torch

    return int(torch.cuda.get_device_properties(0).multi_processor_count)


def _require_cuda() -> None:
    """SynthError unless PyTorch sees a CUDA GPU (PyTorch missing: measure() says what to install)."""
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        raise SynthError("calibrate: no CUDA GPU visible to PyTorch; run it on the GPU machine, or pass "
                         "--device cpu to try the mechanics")
