"""Whole transformer layers and whole single-GPU training steps in eager
PyTorch, measured, and the per-operation compute model's predictions of them.

    python scripts/layer_accuracy.py measure --out MEASURED.jsonl [--budget-s 240] [--device cuda|cpu]
    python scripts/layer_accuracy.py compare MEASURED.jsonl [--compute-profile P.json ...] [--markdown]

``measure`` (on a GPU machine; ``--device cpu`` runs tiny shapes to try the
mechanics) builds each model's layer as one tensor-parallel rank holds it
(the shapes of ``synth.planner.layercompute``, no communication): LayerNorm
or RMSNorm, the qkv GEMM, rotary positions for gated (Llama) models written
the usual eager way, causal ``scaled_dot_product_attention`` (grouped-query
where the model has fewer kv heads), the output projection, the residual
adds, and a GELU (tanh) or fused gate+up SwiGLU MLP, in bf16. It times the
training forward (autograd recording) and forward+backward of each layer
(CUDA events, mean of 10 after 3 warm-ups, weight gradients cleared between
runs); ``backward_s`` is their difference. Then whole steps of a small
model on one GPU (embedding, every layer, final norm, logits, fp32
cross-entropy, then fp32 master weights updated by fused Adam and copied
back to bf16) at every micro-batch size that divides a fixed global batch,
with the optimizer's share timed apart. One JSON line per measurement.

``compare`` (anywhere) predicts each measurement with the planner's own
functions (``layer_compute`` for layers; ``stage_compute`` per micro-batch
plus ``optimizer_s`` for steps, as ``plan`` composes a single-device step)
and prints the relative errors and whether each step group's micro-batch
ranking matches. docs/planner.md ("Accuracy on whole layers and steps")
holds the results.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synth.planner.modelspec import load_model  # noqa: E402
from synth.planner.transformer import Transformer  # noqa: E402

# (model, tensor-parallel sizes) for layers; every (micro-batch, sequence) below for each
LAYER_MODELS = ("gpt3-2.7b", "gpt3-6.7b", "megatron-18.4b", "megatron-39.1b", "gpt3-175b",
                "llama2-7b", "llama2-13b", "llama2-70b")
LAYER_TP = (1, 2, 4, 8)
LAYER_BATCHES = ((1, 2048), (4, 2048), (1, 8192))
# (model, layers kept, sequence, global batch in sequences) for whole steps
STEP_MODELS = (("megatron-1.7b", 24, 2048, 8), ("llama2-7b", 6, 4096, 4))
GRAPHS = {"working": True}  # CUDA graph replays are tried until one fails
# tiny models for --device cpu, named by their inline fields so that compare can load them back
CPU_LAYER_MODELS = tuple(dataclasses.replace(load_model(spec), name=spec) for spec in (
    "layers=2,hidden=64,heads=4,seq=128,vocab=1000",
    "layers=2,hidden=64,heads=4,kv_heads=2,ffn=160,gated_mlp=true,tied_embeddings=false,seq=128,vocab=1000"))


def _torch():
    import torch
    import torch.nn.functional as F
    return torch, F


def build_layer(model: Transformer, tp: int, device: str, dtype):
    """One tensor-parallel rank's layer of ``model`` (a ``torch.nn.Module``
    taking and returning ``[batch, seq, hidden]``)."""
    torch, F = _torch()
    h, heads = model.hidden, model.heads
    head_dim = model.head_dimension  # the attention is heads x head_dim wide, as the planner counts it
    q_heads, kv_heads = heads // tp, model.kv_heads // tp
    gated = model.gated_mlp
    bias = not gated

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            norm = torch.nn.RMSNorm if gated else torch.nn.LayerNorm
            self.norm1, self.norm2 = norm(h), norm(h)
            self.qkv = torch.nn.Linear(h, (q_heads + 2 * kv_heads) * head_dim, bias=bias)
            self.proj = torch.nn.Linear(q_heads * head_dim, h, bias=bias)
            self.up = torch.nn.Linear(h, (2 if gated else 1) * model.ffn // tp, bias=bias)
            self.down = torch.nn.Linear(model.ffn // tp, h, bias=bias)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, s, q_heads + 2 * kv_heads, head_dim).split(
                [q_heads, kv_heads, kv_heads], dim=2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            if gated:
                cos, sin = _rotary_tables(s, head_dim, x.device, x.dtype)
                q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != q_heads)
            x = x + self.proj(o.transpose(1, 2).reshape(b, s, q_heads * head_dim))
            u = self.up(self.norm2(x))
            if gated:
                gate, up = u.chunk(2, dim=-1)
                a = F.silu(gate) * up
            else:
                a = F.gelu(u, approximate="tanh")
            return x + self.down(a)

    with torch.device(device):  # initialised where it runs: a CPU initialisation of billions of weights takes seconds
        return Layer().to(dtype=dtype)


@functools.lru_cache(maxsize=16)
def _rotary_tables(seq: int, head_dim: int, device, dtype):
    """cos and sin of the rotary angles, computed once per shape (as a
    model computes them once per step for all its layers)."""
    torch, _ = _torch()
    inverse = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inverse)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _rotate(x, cos, sin):
    torch, _ = _torch()
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Timer:
    """Median over ``repeats`` of the mean seconds of ``fn`` over
    ``iterations`` back-to-back runs (after ``warmup`` runs), by CUDA events
    on a GPU and the wall clock on the CPU."""

    def __init__(self, device: str, iterations: int, warmup: int, repeats: int = 3):
        self.device, self.iterations, self.warmup, self.repeats = device, iterations, warmup, repeats

    def __call__(self, fn) -> float:
        torch, _ = _torch()
        for _ in range(self.warmup):
            fn()
        return float(np.median([self._once(torch, fn) for _ in range(self.repeats)]))

    def _once(self, torch, fn) -> float:
        if self.device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(self.iterations):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3 / self.iterations
        began = time.perf_counter()
        for _ in range(self.iterations):
            fn()
        return (time.perf_counter() - began) / self.iterations


def count_kernels(fn) -> int:
    """GPU kernels (and copies) one call of ``fn`` runs, by the PyTorch profiler."""
    torch, _ = _torch()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def measure_host(device: str) -> dict:
    """Seconds the host takes to issue one small eager operation: back-to-back
    in-place adds on one element (the GPU finishes each faster than the next
    is issued) and small linear layers."""
    torch, F = _torch()
    a = torch.zeros(8, 8, device=device)
    timer = Timer(device, 2000, 200)
    return {"kind": "host", "add_s": timer(lambda: a.add_(1)), "linear_s": timer(lambda: F.linear(a, a))}


def _runs(layer, x, grad):
    """The two timed runs of a layer: its training forward, and forward plus
    backward with the weight and input gradients cleared first."""
    params = list(layer.parameters())

    def forward():
        layer(x)

    def forward_backward():
        for p in params:
            p.grad = None
        x.grad = None
        layer(x).backward(grad)

    return forward, forward_backward


def measure_layer(layer, model: Transformer, tp: int, micro_batch: int, seq: int, device: str, timer: Timer) -> dict:
    """Eager forward and forward+backward of ``layer`` on one micro-batch;
    on a GPU also its kernel counts and the same runs replayed as CUDA graphs
    (the GPU's own time, without the host issuing each kernel)."""
    torch, _ = _torch()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(micro_batch, seq, model.hidden, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    forward, forward_backward = _runs(layer, x, grad)
    for _ in range(2):  # every buffer of the backward allocated before anything is timed
        forward_backward()
    forward_s = timer(forward)
    total_s = timer(forward_backward)
    row = {"kind": "layer", "model": model.name, "tp": tp, "micro_batch": micro_batch, "seq": seq,
           "forward_s": forward_s, "backward_s": total_s - forward_s, "forward_backward_s": total_s}
    if device != "cuda":
        return row
    row["forward_kernels"] = count_kernels(forward)
    row["forward_backward_kernels"] = count_kernels(forward_backward)
    if not GRAPHS["working"]:
        return row
    try:
        graphed = torch.cuda.make_graphed_callables(build_layer(model, tp, device, dtype), (x,))
        graph_forward, graph_forward_backward = _runs(graphed, x, grad)
        row["forward_graph_s"] = timer(graph_forward)
        row["forward_backward_graph_s"] = timer(graph_forward_backward)
    except Exception as error:  # noqa: BLE001 (recorded: the eager numbers stand without it)
        row["graph_error"] = f"{type(error).__name__}: {str(error)[:160]}"
        GRAPHS["working"] = False  # a failed capture can leave the stream unusable for more
    return row


def build_network(model: Transformer, device: str, dtype):
    """The whole model on one device: embedding (and learned positions for
    GPT models), ``model.layers`` layers, final norm and the logits GEMM
    (tied to the embedding when the model ties them)."""
    torch, _ = _torch()

    class Network(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(model.vocab, model.hidden)
            self.positions = None if model.gated_mlp else torch.nn.Embedding(model.seq, model.hidden)
            self.layers = torch.nn.ModuleList(build_layer(model, 1, device, dtype) for _ in range(model.layers))
            self.norm = (torch.nn.RMSNorm if model.gated_mlp else torch.nn.LayerNorm)(model.hidden)
            self.head = torch.nn.Linear(model.hidden, model.vocab, bias=False)
            if model.tied_embeddings:
                self.head.weight = self.embedding.weight

        def forward(self, tokens):
            x = self.embedding(tokens)
            if self.positions is not None:
                x = x + self.positions.weight[: tokens.shape[1]]
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    with torch.device(device):
        return Network().to(dtype=dtype)


def measure_steps(model: Transformer, global_batch: int, device: str, steps: int, warmup: int) -> list[dict]:
    """One training step of ``model`` at each micro-batch size dividing
    ``global_batch`` (micro-batches accumulate their weight gradients)."""
    torch, F = _torch()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    net = build_network(model, device, dtype)
    params = list(net.parameters())
    master = [p.detach().float().clone().requires_grad_(True) for p in params]
    optimizer = torch.optim.Adam(master, lr=1e-5, fused=device == "cuda")
    parameters = sum(p.numel() for p in params)
    generator = torch.Generator(device=device).manual_seed(0)
    rows: list[dict] = []
    for micro_batch in [b for b in (1, 2, 4, 8, 16) if global_batch % b == 0 and b <= global_batch]:
        count = global_batch // micro_batch
        tokens = torch.randint(0, model.vocab, (count, micro_batch, model.seq + 1), device=device,
                               generator=generator)

        def optimizer_step():
            for m, p in zip(master, params):
                m.grad = p.grad.float()
            optimizer.step()
            with torch.no_grad():
                torch._foreach_copy_([p.data for p in params], [m.data for m in master])

        def step():
            for p in params:
                p.grad = None
            for i in range(count):
                logits = net(tokens[i, :, :-1])
                loss = F.cross_entropy(logits.float().view(-1, model.vocab), tokens[i, :, 1:].reshape(-1))
                loss.backward()
            optimizer_step()

        row = {"kind": "step", "model": model.name, "layers": model.layers, "seq": model.seq,
               "global_batch": global_batch, "micro_batch": micro_batch, "micro_batches": count,
               "parameters": parameters}
        try:
            # a step contains its optimizer step: a pair that says otherwise was disturbed (another process
            # took the core) and is measured again, a few times at most; compare shows what stays inconsistent
            for attempt in range(4):
                row["step_s"] = Timer(device, steps, warmup if attempt == 0 else 1)(step)
                row["optimizer_s"] = Timer(device, steps, 1)(optimizer_step)
                if row["step_s"] > row["optimizer_s"]:
                    break
        except torch.OutOfMemoryError:
            row["error"] = "out of memory"
        rows.append(row)
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def measure(args: argparse.Namespace) -> int:
    torch, _ = _torch()
    started = time.monotonic()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("layer_accuracy: no CUDA GPU visible to PyTorch (use --device cpu to try the mechanics)")
    common = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
              "dtype": "bfloat16" if device == "cuda" else "float32"}
    out = open(args.out, "w")

    def emit(row: dict) -> None:
        row.update(common)
        out.write(json.dumps(row) + "\n")
        out.flush()

    def over_budget() -> bool:
        return time.monotonic() - started > args.budget_s

    if device == "cuda":
        layer_cases = [(load_model(name), tp, b, s) for name in LAYER_MODELS for tp in LAYER_TP
                       for b, s in LAYER_BATCHES]
        step_cases = [(dataclasses.replace(load_model(name), layers=layers, seq=seq), batch)
                      for name, layers, seq, batch in STEP_MODELS]
        timer = Timer(device, 5, 3)
    else:
        layer_cases = [(m, tp, b, s) for m in CPU_LAYER_MODELS for tp in (1, 2) for b, s in ((1, 32), (2, 64))]
        step_cases = [(dataclasses.replace(m, seq=32), 4) for m in CPU_LAYER_MODELS]
        timer = Timer(device, 2, 1)
    GRAPHS["working"] = not args.no_graphs
    chosen = set(args.models.split(",")) if args.models else None
    emit(measure_host(device))
    for model, batch in [] if args.skip_steps else [c for c in step_cases if not chosen or c[0].name in chosen]:
        for row in measure_steps(model, batch, device, 3 if device == "cuda" else 1, 2 if device == "cuda" else 1):
            emit(row)
        print(f"layer_accuracy: steps of {model.name} measured ({time.monotonic() - started:.0f} s)",
              file=sys.stderr, flush=True)
    if device == "cuda":
        torch.cuda.empty_cache()
    done = failures = 0
    built = None
    for model, tp, b, s in layer_cases[args.from_layer:]:
        if model.parallelism_problem(tp, 1) or (chosen and model.name not in chosen):
            continue
        if over_budget():
            print(f"layer_accuracy: budget of {args.budget_s:g} s reached after {done} layers", file=sys.stderr)
            break
        try:
            if built is None or built[0] != (model.name, tp):
                print(f"layer_accuracy: {model.name} tp={tp} ({time.monotonic() - started:.0f} s)", file=sys.stderr,
                      flush=True)
                built = None
                if device == "cuda":
                    torch.cuda.empty_cache()
                built = ((model.name, tp), build_layer(model, tp, device, torch.bfloat16 if device == "cuda"
                                                       else torch.float32))
            emit(measure_layer(built[1], model, tp, b, s, device, timer))
        except Exception as error:  # noqa: BLE001 (an out-of-memory or a broken graph capture: recorded, go on)
            emit({"kind": "layer", "model": model.name, "tp": tp, "micro_batch": b, "seq": s,
                  "error": f"{type(error).__name__}: {str(error)[:160]}"})
            failures += 1
            if failures >= 3:
                print("layer_accuracy: three layers failed; stopping the layers", file=sys.stderr)
                break
        done += 1
    built = None
    if device == "cuda":
        torch.cuda.empty_cache()
    print(f"layer_accuracy: {done} layers measured ({time.monotonic() - started:.0f} s)", file=sys.stderr,
          flush=True)
    out.close()
    return 0


def _relative(predicted: float, measured: float) -> float:
    return predicted / measured - 1


def _summary(errors: list[float]) -> str:
    if not errors:
        return "- | - | 0"
    a = np.abs(np.array(errors))
    return f"{np.median(a):.1%} | {np.quantile(a, 0.9):.1%} | {len(a)}"


def _in_grid(model: Transformer, tp: int, tokens: int) -> bool:
    """Whether every GEMM of the layer is a shape of the calibration grid
    (``GPU_GRID``: 4h MLPs of its hiddens at its token counts)."""
    from synth.planner.calibration import GPU_GRID
    shapes = set(GPU_GRID.gemm_shapes())
    h, kv, f, t = model.hidden, model.kv_dim, model.ffn, tp
    gemms = [(h, (h + 2 * kv) // t), (h // t, h), (h, (2 if model.gated_mlp else 1) * f // t), (f // t, h)]
    return all((tokens, k, n) in shapes for k, n in gemms)


def predict_step(profile, model: Transformer, micro_batch: int, global_batch: int) -> tuple[float, float]:
    """(step seconds, optimizer seconds) of one device, as ``plan`` composes
    them for tp = dp = pp = 1: micro-batches times one micro-batch's
    compute, plus the optimizer step."""
    from synth.planner.stepmodel import Configuration, Training, compute_estimate
    from synth.topology import Device
    config = Configuration(tp=1, dp=1, pp=1, micro_batch=micro_batch)
    training = Training(global_batch=global_batch, cross_entropy="eager", framework="eager-master")  # measure_steps
    estimate = compute_estimate(model, training, config, Device("measured", 80, 989), profile)
    return (config.micro_batches(training) * estimate.micro_batch_s + estimate.optimizer_s + estimate.accumulate_s,
            estimate.optimizer_s)


def compare(args: argparse.Namespace) -> int:
    from synth.errors import SynthError
    from synth.planner.calibration import fit_host
    from synth.planner.compute import load_compute_profile, shipped_profile_for
    from synth.planner.layercompute import layer_compute
    from synth.planner.optimes import Shard
    from synth.planner.operations import HostModel, OperationProfile
    rows = [json.loads(line) for line in open(args.measured) if line.strip()]
    gpus = sorted({r["gpu"] for r in rows})
    profiles = ([load_compute_profile(p) for p in args.compute_profile] if args.compute_profile
                else [shipped_profile_for(g) for g in gpus])
    for profile in profiles:
        if not isinstance(profile, OperationProfile):
            raise SystemExit(f"compare: {profile.name} is not a per-operation profile (compute-profile version 2)")
    models = {name: load_model(name) for name in sorted({r["model"] for r in rows if "model" in r})}
    print(f"measured on {', '.join(gpus)} ({args.measured}); predicted by the per-operation model")
    for profile in profiles:
        print(f"\n### profile {profile.name}\n")
        print("| layers | phase | median error | p90 error | layers |")
        print("| --- | --- | --- | --- | --- |")
        groups: dict[tuple[str, str], list[float]] = {}
        worst: list[tuple[float, str]] = []
        for r in rows:
            if r["kind"] != "layer" or "error" in r:
                continue
            model = models[r["model"]]
            predicted = layer_compute(profile, model, Shard(r["tp"], r["micro_batch"], r["seq"]))
            grid = "GEMMs in the grid" if _in_grid(model, r["tp"], r["micro_batch"] * r["seq"]) else \
                "GEMMs not in the grid"
            family = "Llama (RMSNorm, rotary, SwiGLU)" if model.gated_mlp else "GPT (LayerNorm, GELU)"
            for phase, p, m in (("forward", predicted.forward_s, r["forward_s"]),
                                ("backward", predicted.backward_s, r["backward_s"]),
                                ("forward+backward", predicted.total_s, r["forward_backward_s"])):
                e = _relative(p, m)
                for key in (("all", phase), (family, phase), (grid, phase)):
                    groups.setdefault(key, []).append(e)
            if "forward_backward_graph_s" in r:  # the GPU's time against the model without host issue
                gpu_only = layer_compute(dataclasses.replace(profile, host=HostModel()), model,
                                         Shard(r["tp"], r["micro_batch"], r["seq"]))
                groups.setdefault(("all, GPU time only: CUDA graph replays against the model without host issue",
                                   "forward+backward"), []).append(
                    _relative(gpu_only.total_s, r["forward_backward_graph_s"]))
                if phase == "forward+backward":
                    worst.append((e, f"{r['model']} tp={r['tp']} b={r['micro_batch']} s={r['seq']}: "
                                     f"predicted {p * 1e3:.2f} ms, measured {m * 1e3:.2f} ms"))
        order = ["all", "GEMMs in the grid", "GEMMs not in the grid", "GPT (LayerNorm, GELU)",
                 "Llama (RMSNorm, rotary, SwiGLU)"]
        for (group, phase), errors in sorted(groups.items(), key=lambda kv: (
                order.index(kv[0][0]) if kv[0][0] in order else len(order),
                ("forward", "backward", "forward+backward").index(kv[0][1]))):
            print(f"| {group} | {phase} | {_summary(errors)} |")
        gated = {name: m.gated_mlp for name, m in models.items()}
        for scored, fitted_on in ((True, False), (False, True)):
            lines = [(f"line {i + 1}", r) for i, r in enumerate(rows) if r["kind"] == "layer"
                     and gated[r["model"]] == fitted_on]
            try:
                host, _ = fit_host(lines)
            except SynthError as error:
                print(f"\n(no held-out host fit: {error})")
                continue
            held = dataclasses.replace(profile, host=host)
            errors = [_relative(layer_compute(held, models[r["model"]], Shard(r["tp"], r["micro_batch"], r["seq"]))
                                .total_s, r["forward_backward_s"])
                      for r in rows if r["kind"] == "layer" and "error" not in r and gated[r["model"]] == scored]
            family = "Llama" if scored else "GPT"
            print(f"| {family}, host cost fitted on the {'GPT' if scored else 'Llama'} layers only "
                  f"({host.forward_launch_s * 1e6:.1f} / {host.backward_launch_s * 1e6:.1f} us per launch) | "
                  f"forward+backward | {_summary(errors)} |")
        print("\nlargest errors (forward+backward): " + "; ".join(
            f"{text} ({e:+.0%})" for e, text in sorted(worst, key=lambda w: -abs(w[0]))[:4]))
        print("\n| step | micro-batch | measured | predicted | error | optimizer measured | predicted |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        by_group: dict[str, list[tuple[int, float, float]]] = {}
        step_errors = []
        for r in rows:
            if r["kind"] != "step" or "error" in r:
                continue
            model = dataclasses.replace(models[r["model"]], layers=r["layers"], seq=r["seq"])
            if model.parameters != r["parameters"]:
                raise SystemExit(f"compare: {r['model']} measured {r['parameters']} parameters, the model counts "
                                 f"{model.parameters}")
            step_s, opt_s = predict_step(profile, model, r["micro_batch"], r["global_batch"])
            e = _relative(step_s, r["step_s"])
            step_errors.append(e)
            label = f"{r['model']} ({r['layers']} layers, s={r['seq']}, {r['global_batch']} sequences)"
            by_group.setdefault(label, []).append((r["micro_batch"], r["step_s"], step_s))
            print(f"| {label} | {r['micro_batch']} | {r['step_s'] * 1e3:.1f} ms | {step_s * 1e3:.1f} ms | {e:+.1%} | "
                  f"{r['optimizer_s'] * 1e3:.1f} ms | {opt_s * 1e3:.1f} ms |")
        if step_errors:
            print(f"\nsteps: median error {np.median(np.abs(step_errors)):.1%}, largest {max(map(abs, step_errors)):.1%}")
        for label, points in by_group.items():
            measured_order = [b for b, _, _ in sorted(points, key=lambda p: p[1])]
            predicted_order = [b for b, _, _ in sorted(points, key=lambda p: p[2])]
            verdict = "same" if measured_order == predicted_order else "differs"
            print(f"micro-batch ranking, {label}: measured {measured_order}, predicted {predicted_order} ({verdict})")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="time layers and steps with PyTorch (a GPU machine)")
    m.add_argument("--out", required=True, metavar="MEASURED.jsonl")
    m.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    m.add_argument("--from-layer", type=int, default=0, help="skip the first N layer cases (resume a cut run)")
    m.add_argument("--models", help="measure these models' layers only (comma-separated names)")
    m.add_argument("--no-graphs", action="store_true", help="time eager runs only (no CUDA graph replays)")
    m.add_argument("--skip-steps", action="store_true", help="measure layers only")
    m.add_argument("--budget-s", type=float, default=240.0, help="stop starting new measurements after this")
    c = sub.add_parser("compare", help="predict each measurement and print the errors")
    c.add_argument("measured", metavar="MEASURED.jsonl")
    c.add_argument("--compute-profile", action="append", default=[], metavar="PROFILE.json",
                   help="a profile to predict with (repeatable; default: the shipped profile for the GPU)")
    args = p.parse_args()
    return measure(args) if args.command == "measure" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
