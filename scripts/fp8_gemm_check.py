"""FP8 against BF16 GEMMs on this GPU, side by side: a first-hand check of the
speed-up the planner's ``--dtype fp8`` takes from FBGEMM's H100 measurements
(``FP8_GEMM_SPEEDUP`` in synth/planner/optimes.py, data/fp8_gemm_h100.jsonl).

    python scripts/fp8_gemm_check.py [--out RECORDS.jsonl] [--iters 20]

For each shape (M, N, K): C = A[M,K] @ B[K,N] in bf16 (``torch.mm``) and in FP8
e4m3 with row-wise scales (``torch._scaled_mm``, scale per row of A and per
column of B, bf16 output), timed with CUDA events (mean of ``--iters`` after 5
warm-ups): the GEMM alone, and with the quantisation of both operands (amax,
scale, cast) included, FBGEMM's "scale + row gemm". The shapes are FBGEMM's
three and the GEMMs of transformer layers the planner prices (Llama 2 7B at
8,192 tokens, and small ones at 2,048). Each line also gives the FP8 result's
relative error against bf16 (a sanity check, not an accuracy claim). Exit 3
without a CUDA GPU or without ``torch._scaled_mm``.
"""

from __future__ import annotations

import argparse
import json
import sys

SHAPES = (  # (M, N, K), why
    ((8192, 8192, 8192), "FBGEMM #2546"),
    ((65536, 8192, 7168), "FBGEMM #2546"),
    ((65536, 3584, 8192), "FBGEMM #2546"),
    ((8192, 12288, 4096), "llama2-7b qkv, 8192 tokens"),
    ((8192, 4096, 4096), "llama2-7b projection, 8192 tokens"),
    ((8192, 22016, 4096), "llama2-7b gate+up, 8192 tokens"),
    ((8192, 4096, 11008), "llama2-7b down, 8192 tokens"),
    ((2048, 4096, 4096), "small: 2048 tokens, h 4096"),
    ((2048, 1024, 4096), "small: 2048 tokens, tp 4 slice"),
)
E4M3_MAX = 448.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write one JSON line per shape")
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    try:
        import torch
    except ImportError:
        print("fp8_gemm_check: needs torch with CUDA", file=sys.stderr)
        return 3
    if not torch.cuda.is_available() or not hasattr(torch, "_scaled_mm"):
        print("fp8_gemm_check: needs a CUDA GPU and torch._scaled_mm (Hopper or newer)", file=sys.stderr)
        return 3
    dev = torch.device("cuda")
    name = torch.cuda.get_device_name()

    def timed(fn) -> float:
        for _ in range(5):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / args.iters

    def quantise_rows(x):  # per row of x: scale = amax / 448, x / scale in e4m3
        scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / E4M3_MAX
        return (x.float() / scale).to(torch.float8_e4m3fn), scale

    out = open(args.out, "w") if args.out else None
    print(f"# {name}, torch {torch.__version__}, mean of {args.iters} after 5 warm-ups, CUDA events")
    print(f"{'M':>6} {'N':>6} {'K':>6} {'bf16 TF/s':>10} {'fp8 gemm TF/s':>14} {'fp8+eager q TF/s':>15} "
          f"{'x gemm':>7} {'x eager q':>9} {'rel err':>8}  shape")
    torch.manual_seed(0)

    def measure(m: int, n: int, k: int, why: str) -> dict:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=dev, dtype=torch.bfloat16)  # B^T, row-major: B column-major for _scaled_mm
        bf16_s = timed(lambda: torch.mm(a, b.t()))
        a8, sa = quantise_rows(a)
        b8, sb = quantise_rows(b)  # per row of B^T = per column of B

        def gemm():
            return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb.t().contiguous(), out_dtype=torch.bfloat16)

        def scaled():
            qa, qsa = quantise_rows(a)
            qb, qsb = quantise_rows(b)
            return torch._scaled_mm(qa, qb.t(), scale_a=qsa, scale_b=qsb.t().contiguous(), out_dtype=torch.bfloat16)

        gemm_s = timed(gemm)
        scaled_s = timed(scaled)
        ref = torch.mm(a, b.t()).float()
        err = float((gemm().float() - ref).norm() / ref.norm())
        flops = 2 * m * n * k
        return {"gpu": name, "torch": torch.__version__, "shape_mnk": [m, n, k], "why": why,
                "bf16_s": bf16_s, "fp8_rowwise_gemm_only_s": gemm_s, "fp8_rowwise_eager_quantised_s": scaled_s,
                "bf16_tflops": flops / bf16_s / 1e12, "fp8_rowwise_gemm_only_tflops": flops / gemm_s / 1e12,
                "fp8_rowwise_eager_quantised_tflops": flops / scaled_s / 1e12, "relative_error": err,
                "iters": args.iters}

    for (m, n, k), why in SHAPES:
        row = measure(m, n, k, why)
        torch.cuda.empty_cache()
        gemm_x = row["bf16_s"] / row["fp8_rowwise_gemm_only_s"]
        scaled_x = row["bf16_s"] / row["fp8_rowwise_eager_quantised_s"]
        print(f"{m:>6} {n:>6} {k:>6} {row['bf16_tflops']:>10.1f} {row['fp8_rowwise_gemm_only_tflops']:>14.1f} "
              f"{row['fp8_rowwise_eager_quantised_tflops']:>15.1f} {gemm_x:>6.2f}x {scaled_x:>8.2f}x "
              f"{row['relative_error']:>8.4f}  {why}", flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
