"""Write the per-operation profile of the H100 that torchtitan's December 2024
benchmark ran on, derived from the measured H100 SXM5 profile by the two
devices' stated memory bandwidths
(:func:`synth.planner.operations.at_memory_bandwidth`).

    python scripts/bandwidth_profile.py [--out profiles/h100-hbm2e-96gb-500w.compute.json]

The stated numbers: the H100 SXM5 80GB, whose profile was measured, 3.35 TB/s
(NVIDIA H100 Tensor Core GPU datasheet, "GPU memory bandwidth", H100 SXM); the
benchmark's H100, "96GB HBM2e with 2.4 TB/sec peak memory bandwidth" at "the
default 500W power limit" (pytorch/torchtitan
benchmarks/llama3_h100_202412_torchtitan.md, "Hardware"). Only the memory-bound
parts move: the elementwise passes and the GEMM's operand reads. The GEMM and
attention rates stay the SXM5's at 700 W, because the benchmark states its
GPU's compute peak as unknown ("between SXM and NVL, and we don't know its
exact value", its footnote 2); a prediction with this profile is therefore
fast by whatever the 500 W limit takes from the tensor cores.

The assumption that a device reaches the same fraction of its stated bandwidth
is checked on the two profiles measured here: the H200's ``add`` pass is 1.422
times the H100's, the stated ratio 4.8 / 3.35 = 1.433.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from synth.planner.compute import load_compute_profile, save_operation_profile  # noqa: E402
from synth.planner.operations import at_memory_bandwidth  # noqa: E402

MEASURED = REPO / "profiles" / "h100-sxm5-80gb.compute.json"
MEASURED_TBPS = 3.35  # NVIDIA H100 datasheet, H100 SXM
BENCHMARK_TBPS = 2.4  # torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Hardware
NAME = "h100-hbm2e-96gb-500w"
DEVICE = "NVIDIA H100 96GB HBM2e (500 W)"
OUT = REPO / "profiles" / f"{NAME}.compute.json"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(OUT), help="the profile to write (default: %(default)s)")
    args = p.parse_args()
    measured = load_compute_profile(str(MEASURED))
    source = (f"{MEASURED.relative_to(REPO)} at {BENCHMARK_TBPS} / {MEASURED_TBPS} TB/s of memory bandwidth "
              "(stated: torchtitan benchmarks/llama3_h100_202412_torchtitan.md; NVIDIA H100 datasheet); "
              "GEMM and attention rates the H100 SXM5's (the benchmark's peak is not stated); "
              "scripts/bandwidth_profile.py")
    profile = at_memory_bandwidth(measured, BENCHMARK_TBPS / MEASURED_TBPS, NAME, (DEVICE,), source)
    save_operation_profile(args.out, profile)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
