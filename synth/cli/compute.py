"""``synth-reduce compute``: one transformer layer's forward and backward time
on one device by the per-operation compute model, operation by operation (the
numbers the planner uses)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any, Sequence

from ..errors import SynthError
from ..planner.compute import shipped_profile_for
from ..planner.layercompute import layer_compute
from ..planner.modelspec import load_model
from ..planner.operations import OperationProfile
from ..planner.optimes import Shard
from ..units import MAX_COUNT, bounded_int, format_seconds
from .args import Parser, compute_profile_argument


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="synth-reduce compute",
               description="One layer's forward and backward seconds on one device (no recomputation), with the "
                           "per-operation breakdown: GEMMs, attention, memory-bound passes. The job planner uses "
                           "the same numbers.")
    p.add_argument("--device", help="a shipped profile's name or device name (e.g. h100-sxm5-80gb, or "
                                    "'NVIDIA H100 80GB HBM3'); optional with --compute-profile")
    p.add_argument("--model", required=True, help="a shipped model name, a model YAML file or inline fields")
    p.add_argument("--tp", type=lambda text: bounded_int(text, "--tp", MAX_COUNT), default=1,
                   help="tensor-parallel size (default 1)")
    p.add_argument("--micro-batch", type=lambda text: bounded_int(text, "--micro-batch", MAX_COUNT), default=1,
                   help="sequences per micro-batch (default 1)")
    p.add_argument("--seq", type=lambda text: bounded_int(text, "--seq", MAX_COUNT),
                   help="sequence length (default: the model's)")
    p.add_argument("--sequence-parallel", choices=("on", "off"), default="on",
                   help="sequence parallelism where tp > 1 (default on, as plan): the norms and residual adds run "
                        "on s / tp of the sequence")
    p.add_argument("--compute-profile", metavar="PROFILE.json",
                   help="a per-operation compute profile (synth-reduce calibrate); default: the shipped one of "
                        "--device")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    return p


def profile_of(args: argparse.Namespace) -> OperationProfile:
    if args.compute_profile:
        profile = compute_profile_argument(args.compute_profile)
        if not isinstance(profile, OperationProfile):
            raise SynthError(f"--compute-profile {args.compute_profile}: an efficiency curve (version 1) has no "
                             "operations; give a per-operation profile (version 2, synth-reduce calibrate)")
        if args.device and not (profile.applies_to(args.device) or profile.name.casefold() == args.device.casefold()):
            raise SynthError(f"--device {args.device}: the profile {args.compute_profile} is for "
                             f"{', '.join(profile.devices)}; drop --device or give that device")
        return profile
    if not args.device:
        raise SynthError("give --device NAME (a shipped profile) or --compute-profile PROFILE.json")
    return shipped_profile_for(args.device)


def run(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    model = load_model(args.model)
    if args.seq:
        model = replace(model, seq=args.seq)
    problem = model.parallelism_problem(args.tp, 1)
    if problem:
        raise SynthError(f"--tp {args.tp}: {problem}")
    profile = profile_of(args)
    shard = Shard(args.tp, args.micro_batch, model.seq, args.sequence_parallel == "on" and args.tp > 1)
    layer = layer_compute(profile, model, shard)
    flops = model.layer_forward_flops(shard.tokens) / args.tp
    document = compute_document(profile, model, shard, layer, flops)
    if args.json:
        print(json.dumps(document, indent=1))
        return 0
    print(f"{model.describe()}")
    print(f"one layer on one device of {profile.name or profile.source} ({', '.join(profile.devices)}): tp {args.tp}, "
          f"micro-batch {args.micro_batch}, sequence {model.seq}"
          f"{', sequence parallel' if shard.sequence_parallel else ''}; no recomputation")
    print(f"forward {format_seconds(layer.forward_s)}, backward {format_seconds(layer.backward_s)} "
          f"({document['forward_tflops']:.1f} and {document['backward_tflops']:.1f} TFLOP/s of the layer's "
          "matrix and attention FLOPs)")
    print(f"\n{'operation':<28} {'phase':<9} {'shape':<24} {'seconds':>10} {'share':>6}")
    total = layer.total_s
    for op in layer.ops:
        shape = "x".join(str(x) for x in op.shape)
        print(f"{op.name:<28} {op.phase:<9} {shape:<24} {format_seconds(op.seconds):>10} "
              f"{op.seconds / total:>6.1%}")
    return 0


def compute_document(profile: OperationProfile, model, shard: Shard, layer, forward_flops: float) -> dict[str, Any]:
    """What ``compute --json`` prints."""
    return {
        "profile": {"name": profile.name, "devices": list(profile.devices), "source": profile.source},
        "model": model.to_dict(),
        "tp": shard.tp,
        "micro_batch": shard.micro_batch,
        "seq": shard.seq,
        "sequence_parallel": shard.sequence_parallel,
        "recompute": "none",
        "forward_s": layer.forward_s,
        "backward_s": layer.backward_s,
        "forward_flops": forward_flops,
        "backward_flops": 2 * forward_flops,
        "forward_tflops": forward_flops / layer.forward_s / 1e12,
        "backward_tflops": 2 * forward_flops / layer.backward_s / 1e12,
        "operations": [op.to_dict() for op in layer.ops],
    }
