"""Ring attention's kernel calls on this GPU against the planner's model of
them: a first-hand check of how ``--axes cp=...`` prices attention
(``attention_ops`` in synth/planner/layercompute.py).

    python scripts/ring_attention_check.py measure --out RECORDS.jsonl   # on a GPU (about 1 min)
    python scripts/ring_attention_check.py compare RECORDS.jsonl [--profile P.compute.json]

With context parallelism ``cp`` (Transformer Engine's load-balanced ring
attention) each device runs, per pass, the causal attention of its own
``s / cp`` queries and keys and then ``cp - 1`` ring steps of ``s / cp``
queries against ``s / (2 cp)`` keys, every pair computed. ``measure`` times
those two calls, and the whole sequence's causal attention for reference, with
``scaled_dot_product_attention`` (flash) in bf16, forward and forward+backward
(CUDA events, mean of ``--iters`` after 3 warm-ups; the method of the
calibration grid, ``synth.planner.calibration``), one record per call:

    {"config", "model", "tp", "seq", "cp", "call": "own" | "step" | "whole",
     "batch", "heads", "head_dim", "queries", "keys", "causal", "fwd_s", "fwd_bwd_s", "gpu", "torch"}

``compare`` prices each call with the profile (default: the shipped profile
of the GPU named in the records) and each configuration's ring pass
(``own + (cp - 1) x step``) with ``attention_ops``, the planner's own code,
and prints measured against predicted. A standalone backward call, as timed
here, also pays autograd's fixed cost (the profile's ``backward_floor_s``
against ``forward_floor_s``), which the planner counts once per micro-batch:
the pass's backward is compared with the calls priced standalone, and the
planner's in-layer figure is printed beside it. Exit 3 from ``measure`` without a
CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (model, tp, seq, cp, why): heads per device = model heads / tp, head dim = hidden / heads
CONFIGS = (
    ("llama3-405b", 8, 131072, 16, "Meta's Llama 3 405B long-context stage (tp 8, cp 16, 128K)"),
    ("llama3-405b", 8, 8192, 2, "405B at 8K, cp 2"),
    ("llama3-405b", 8, 8192, 8, "405B at 8K, cp 8 (the cp-searched pick's cp)"),
    ("llama3-70b", 8, 32768, 4, "70B at 32K, cp 4"),
    ("llama3-8b", 1, 32768, 8, "8B at 32K, cp 8"),
    ("llama3-8b", 2, 16384, 16, "8B at 16K, cp 16: short calls"),
)


def measure(out_path: str, iters: int) -> int:
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("ring_attention_check: needs torch with CUDA", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("ring_attention_check: needs a CUDA GPU", file=sys.stderr)
        return 3
    from synth.planner.modelspec import load_model

    dev, dt = "cuda", torch.bfloat16
    gpu = torch.cuda.get_device_name()

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        return a.elapsed_time(b) / iters / 1e3

    def call(heads: int, head_dim: int, queries: int, keys: int, causal: bool) -> tuple[float, float]:
        q = torch.randn(1, heads, queries, head_dim, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(1, heads, keys, head_dim, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(1, heads, keys, head_dim, device=dev, dtype=dt, requires_grad=True)
        with torch.no_grad():
            fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))

        def fwd_bwd():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            o.backward(torch.ones_like(o))
        both = timed(fwd_bwd)
        return fwd, both  # the tensors are freed on return

    print(f"# {gpu}, torch {torch.__version__}, bf16 flash attention, mean of {iters} after 3 warm-ups",
          file=sys.stderr)
    with open(out_path, "w") as out:
        for name, tp, seq, cp, why in CONFIGS:
            model = load_model(name)
            heads, head_dim = model.heads // tp, model.hidden // model.heads
            local = seq // cp
            for kind, queries, keys, causal in (("own", local, local, True), ("step", local, local // 2, False),
                                                ("whole", seq, seq, True)):
                fwd, both = call(heads, head_dim, queries, keys, causal)
                torch.cuda.empty_cache()
                row = {"config": why, "model": name, "tp": tp, "seq": seq, "cp": cp, "call": kind, "batch": 1,
                       "heads": heads, "head_dim": head_dim, "queries": queries, "keys": keys, "causal": causal,
                       "fwd_s": fwd, "fwd_bwd_s": both, "gpu": gpu, "torch": torch.__version__}
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(f"{why}: {kind} {queries}x{keys} fwd {fwd * 1e3:.3f} ms fwd+bwd {both * 1e3:.3f} ms",
                      file=sys.stderr, flush=True)
    return 0


def compare(records_path: str, profile_path: str | None) -> int:
    from synth.errors import SynthError
    from synth.planner.compute import default_compute, load_compute_profile
    from synth.planner.layercompute import attention_ops
    from synth.planner.optimes import Shard
    from synth.planner.operations import OperationProfile
    from synth.planner.modelspec import load_model

    rows = [json.loads(line) for line in Path(records_path).read_text().splitlines() if line.strip()]
    if not rows:
        raise SynthError(f"{records_path}: no records")
    profile = load_compute_profile(profile_path) if profile_path else default_compute(rows[0]["gpu"])
    if not isinstance(profile, OperationProfile):
        raise SynthError(f"no per-operation profile for '{rows[0]['gpu']}': pass --profile P.compute.json")
    a = profile.attention
    print(f"# measured on {rows[0]['gpu']} (torch {rows[0]['torch']}); model: {profile.name} ({profile.source})")
    print(f"{'call':<34} {'fwd ms':>8} {'model':>8} {'ratio':>6} {'bwd ms':>8} {'model':>8} {'ratio':>6}")
    by_config: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in rows:
        by_config[(r["model"], r["tp"], r["seq"], r["cp"])][r["call"]] = r
        shape = (r["batch"], r["heads"], r["queries"], r["head_dim"])
        keys = None if r["call"] != "step" else r["keys"]
        fwd_m = max(a.forward_floor_s, float(a.forward_gpu_s(*shape, r["causal"], keys)))
        bwd_m = max(a.backward_floor_s, float(a.backward_gpu_s(*shape, r["causal"], keys)))
        bwd = r["fwd_bwd_s"] - r["fwd_s"]
        label = f"{r['model']} cp{r['cp']} {r['call']} {r['queries']}x{r['keys']}"
        print(f"{label:<34} {r['fwd_s'] * 1e3:>8.3f} {fwd_m * 1e3:>8.3f} {fwd_m / r['fwd_s']:>6.2f} "
              f"{bwd * 1e3:>8.3f} {bwd_m * 1e3:>8.3f} {bwd_m / bwd:>6.2f}")
    print()
    print("ring pass (own + (cp-1) x step) against attention_ops, and against the whole sequence / cp")
    print(f"{'configuration':<34} {'fwd ms':>8} {'model':>8} {'ratio':>6} {'bwd ms':>8} {'model':>8} {'ratio':>6} "
          f"{'in-layer':>9} {'whole/cp':>9} {'ring/(whole/cp)':>15}")
    for (name, tp, seq, cp), calls in by_config.items():
        if "own" not in calls or "step" not in calls:
            continue
        own, step = calls["own"], calls["step"]
        fwd = own["fwd_s"] + (cp - 1) * step["fwd_s"]
        both = own["fwd_bwd_s"] + (cp - 1) * step["fwd_bwd_s"]
        ops = {op.phase: op.seconds for op in attention_ops(profile, load_model(name), Shard(tp, 1, seq, cp=cp))}
        standalone = sum(n * max(a.backward_floor_s, float(a.backward_gpu_s(1, own["heads"], own["queries"],
                                                                           own["head_dim"], causal, keys)))
                         for n, causal, keys in ((1, True, None), (cp - 1, False, step["keys"])))
        whole = calls.get("whole")
        whole_cp = whole["fwd_bwd_s"] / cp if whole else float("nan")
        label = f"{name} tp{tp} s{seq} cp{cp}"
        print(f"{label:<34} {fwd * 1e3:>8.3f} {ops['forward'] * 1e3:>8.3f} {ops['forward'] / fwd:>6.2f} "
              f"{(both - fwd) * 1e3:>8.3f} {standalone * 1e3:>8.3f} {standalone / (both - fwd):>6.2f} "
              f"{ops['backward'] * 1e3:>9.3f} {whole_cp * 1e3:>9.3f} {both / whole_cp:>15.2f}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="time the calls on this GPU")
    m.add_argument("--out", required=True, help="JSON lines, one per call")
    m.add_argument("--iters", type=int, default=10)
    c = sub.add_parser("compare", help="measured against the planner's model")
    c.add_argument("records")
    c.add_argument("--profile", help="a compute profile (default: the shipped one of the records' GPU)")
    args = p.parse_args()
    if args.command == "measure":
        return measure(args.out, args.iters)
    from synth.errors import SynthError
    try:
        return compare(args.records, args.profile)
    except SynthError as exc:
        print(f"ring_attention_check: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
