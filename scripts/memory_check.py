"""Peak memory of single-GPU training steps, measured, beside the planner's
memory model (`synth-reduce plan ... --json`, ``memory``).

    python scripts/memory_check.py measure --out MEASURED.jsonl      # on a GPU machine
    python scripts/memory_check.py compare MEASURED.jsonl [--markdown]

``measure`` trains each case once the way the reference peaks were measured
(docs/planner.md): eager PyTorch, fp32 weights under bf16 autocast, fused AdamW,
``scaled_dot_product_attention`` (flash under bf16), global batch 8 sequences
of the model's length accumulated in micro-batches, GPT-3 350M/760M/1.3B at
micro-batch 8 and 2.7B at micro-batch 4, then full recomputation, the unfused
attention, and four layers of Llama 3 8B at sequence 8192 (the network of
``scripts/layer_accuracy.py``). A first step creates the optimizer's states;
then, per case, one JSON line:

* ``states_bytes``: allocated after that step, gradients still held
  (weights, gradients and AdamW's two moments);
* ``peak_bytes``: ``torch.cuda.max_memory_allocated`` over a second step
  (gradients freed at its start, as ``zero_grad`` does);
* ``reserved_bytes``: the caching allocator's peak reservation (what
  fragmentation adds on top of the peak);
* ``device_used_bytes``: the device's used memory after the step
  (``mem_get_info``: the CUDA context and libraries too).

``compare`` (anywhere) asks the planner for the same configuration (one
device of the GPU's topology, ``tp=dp=pp=1``, the measured micro-batch,
``--memory-margin 0``, ``--framework eager``: the measured recipe) and prints, per
case, the model's weights + gradients + optimizer beside ``states_bytes``, its
activations beside ``peak_bytes - states_bytes``, and its total beside the
peak, the reservation and the device's use. docs/planner.md ("Memory per device") holds the results.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from synth.planner.modelspec import load_model  # noqa: E402

# (model, micro-batch, variant): the four reference measurements, then the planner's other memory options
# (--recompute full: every layer checkpointed; --attention unfused: the math attention, scores stored);
# global batch 8 sequences of the model's length
CASES = (("gpt3-350m", 8, "flash"), ("gpt3-760m", 8, "flash"), ("gpt3-1.3b", 8, "flash"), ("gpt3-2.7b", 4, "flash"),
         ("gpt3-1.3b", 8, "full-recompute"), ("gpt3-2.7b", 8, "full-recompute"), ("gpt3-350m", 2, "unfused"),
         ("gpt3-760m", 2, "unfused"))
# Llama 3 8B's layer (RMSNorm, rotary, grouped-query attention, SwiGLU, untied head) with 4 of its 32 layers: its
# fp32 states (16 bytes per parameter) fit one 80 GB GPU; sequence 8192, micro-batches 1 and 2
MODELS = {"llama3-8b-4layers": "layers=4,hidden=4096,heads=32,kv_heads=8,ffn=14336,gated_mlp=true,"
                               "tied_embeddings=false,seq=8192,vocab=128256"}
# GPT-3 XL as its records were measured: 24 heads of hidden // heads = 85 dimensions (attention 2040 wide, the
# network's 1,314,149,824 parameters its records state), not the model file's d_head 128 (3072 wide)
MODELS["gpt3-1.3b"] = "layers=24,hidden=2048,heads=24,head_dim=85,seq=2048,vocab=50257"
CASES += (("llama3-8b-4layers", 1, "flash"), ("llama3-8b-4layers", 2, "flash"),
          ("llama3-8b-4layers", 2, "full-recompute"))
PLAN_OPTIONS = {"flash": (), "full-recompute": ("--recompute", "full"), "unfused": ("--attention", "unfused")}


GLOBAL_BATCH = 8
# the topology whose device stands for each measured GPU (compare)
TOPOLOGY_OF_GPU = {"H100": "dgx-h100", "H200": "hgx-h200"}


def model_spec(name: str) -> str:
    """What --model takes for a case's model: a shipped name, or the inline fields of :data:`MODELS`."""
    return MODELS.get(name, name)


def measure_case(name: str, micro_batch: int, variant: str) -> dict:
    """One case's memory (module docstring); the CUDA caches are emptied first."""
    import contextlib
    import gc

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.checkpoint import checkpoint

    sys.path.insert(0, str(REPO / "scripts"))
    from layer_accuracy import build_network

    model = load_model(model_spec(name))
    gc.collect()
    torch.cuda.empty_cache()
    net = build_network(model, "cuda", torch.float32)
    if variant == "full-recompute":  # each layer keeps its input; its inside is recomputed in the backward
        for layer in net.layers:
            layer.forward = (lambda f: lambda x: checkpoint(f, x, use_reentrant=False))(layer.forward)

    def attention():  # a fresh context each time (sdpa_kernel's is single-use)
        return sdpa_kernel(SDPBackend.MATH) if variant == "unfused" else contextlib.nullcontext()

    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-5, fused=True)
    count = GLOBAL_BATCH // micro_batch
    generator = torch.Generator(device="cuda").manual_seed(0)
    tokens = torch.randint(0, model.vocab, (count, micro_batch, model.seq + 1), device="cuda", generator=generator)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        for i in range(count):
            with attention():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = net(tokens[i, :, :-1])
                loss = F.cross_entropy(logits.float().view(-1, model.vocab), tokens[i, :, 1:].reshape(-1))
                loss.backward()
            del logits, loss
        optimizer.step()

    started = time.perf_counter()
    step()
    gc.collect()  # what the step left in reference cycles (checkpointed layers' closures) is not a state
    torch.cuda.synchronize()
    states = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    row = {"kind": "memory", "model": name, "micro_batch": micro_batch, "variant": variant,
           "global_batch": GLOBAL_BATCH, "seq": model.seq, "parameters": sum(p.numel() for p in net.parameters()),
           "states_bytes": states, "peak_bytes": torch.cuda.max_memory_allocated(),
           "reserved_bytes": torch.cuda.max_memory_reserved(), "device_used_bytes": total - free,
           "device_total_bytes": total, "seconds": round(time.perf_counter() - started, 2)}
    return row  # the network, optimizer and tokens go with this frame; the next case empties the caches


def measure(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("memory_check: no CUDA GPU visible to PyTorch: run measure on a GPU machine")
    common = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "recipe": "fp32 weights, bf16 autocast, fused AdamW, scaled_dot_product_attention",
              "date": time.strftime("%Y-%m-%d")}
    with open(args.out, "w") as out:
        for name, micro_batch, variant in CASES:
            try:
                row = measure_case(name, micro_batch, variant)
            except torch.OutOfMemoryError as error:
                row = {"kind": "memory", "model": name, "micro_batch": micro_batch, "variant": variant,
                       "error": str(error)[:200]}
                torch.cuda.empty_cache()
            row.update(common)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"memory_check: {name} micro-batch {micro_batch} {variant}: "
                  f"{row.get('peak_bytes', 0) / 2**30:.1f} GiB peak", file=sys.stderr, flush=True)
    return 0


def topology_of(gpu: str) -> str:
    for key, topology in TOPOLOGY_OF_GPU.items():
        if key in gpu:
            return topology
    raise SystemExit(f"memory_check: no topology for GPU '{gpu}': add it to TOPOLOGY_OF_GPU")


def predicted(row: dict) -> dict:
    """The planner's memory breakdown (bytes) for the measured case."""
    command = [sys.executable, "-m", "synth.cli", "plan", "--topology", topology_of(row["gpu"]), "--scale",
               "node=1,gpu=1", "--model", model_spec(row["model"]), "--global-batch", str(row["global_batch"]),
               "--axes", "tp=1,dp=1,pp=1", "--micro-batch", str(row["micro_batch"]), "--memory-margin", "0",
               "--no-verify", "--json", "--framework", "eager", *PLAN_OPTIONS[row.get("variant", "flash")]]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"memory_check: {' '.join(command[2:])} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)["configurations"][0]["memory"]


def compare(args: argparse.Namespace) -> int:
    rows = [json.loads(line) for line in Path(args.measured).read_text().splitlines() if line.strip()]
    gib = 2**30
    header = ("model", "micro-batch", "states: measured", "model", "activations: measured", "model",
              "peak: measured", "model total", "error", "reserved", "model reserved", "device used")
    lines = []
    for row in rows:
        if "error" in row:
            lines.append((row["model"], str(row["micro_batch"]), row["error"][:40]) + ("",) * 9)
            continue
        m = predicted(row)
        states = m["weights"] + m["gradients"] + m["optimizer"]
        lines.append((row["model"], str(row["micro_batch"]), f"{row['states_bytes'] / gib:.1f} GiB",
                      f"{states / gib:.1f} GiB", f"{(row['peak_bytes'] - row['states_bytes']) / gib:.1f} GiB",
                      f"{m['activations'] / gib:.1f} GiB", f"{row['peak_bytes'] / gib:.1f} GiB",
                      f"{m['total'] / gib:.1f} GiB", f"{(m['total'] / row['peak_bytes'] - 1) * 100:+.1f}%",
                      f"{row['reserved_bytes'] / gib:.1f} GiB", f"{m['reserved'] / gib:.1f} GiB",
                      f"{row['device_used_bytes'] / gib:.1f} GiB"))
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + " --- |" * len(header))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
        for line in (header, *lines):
            print("  ".join(cell.rjust(w) for cell, w in zip(line, widths)))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="train each case on this machine's GPU and record its memory")
    m.add_argument("--out", required=True, metavar="MEASURED.jsonl")
    c = sub.add_parser("compare", help="the planner's memory model beside each measurement")
    c.add_argument("measured", metavar="MEASURED.jsonl")
    c.add_argument("--markdown", action="store_true", help="a markdown table")
    args = p.parse_args()
    return measure(args) if args.command == "measure" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
