"""Fit a GPU's per-operation compute model (:mod:`synth.planner.operations`)
to per-operation timings, and measure those timings with PyTorch.

Records are JSON lines, one per operation timed (``data/calibration/h100-ops.jsonl``,
the H100 measurements the shipped profile was fitted on, is one such file):

* ``{"op": "gemm", "M", "K", "N", "fwd_s", "dgrad_s", "wgrad_s"}``: the
  forward ``A[M,K] @ B[K,N]``, the input gradient ``G[M,N] @ B^T`` (a GEMM of
  shape M, N, K) and the weight gradient ``A^T @ G`` (shape K, M, N);
* ``{"op": "attention", "batch", "heads", "seq", "head_dim", "causal", "fwd_s",
  "fwd_bwd_s"}``: the backward is ``fwd_bwd_s - fwd_s``;
* ``{"op": NAME, "elements", "fwd_s"}`` for the elementwise passes
  (``layer_norm_1024`` is the ``layer_norm`` pass).

The fit (:func:`fit_operation_profile`) is a small deterministic search per
family, minimising the mean absolute log error (relative errors, small and
large operations alike): for GEMMs over the fixed cost per call, with the
sustained rate solved on a fine grid; for attention the same per direction,
over the per-row cost; each elementwise pass gets the median seconds per element of its
bandwidth-bound sizes and its smallest measured time as its fixed cost.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..documents import json_lines
from ..errors import SynthError
from .operations import (
    ATTENTION_BACKWARD_FLOPS_RATIO,
    ELEMENTWISE_OPS,
    AttentionModel,
    ElementwiseModel,
    ElementwisePass,
    GemmModel,
    HostModel,
    OperationProfile,
    tiled_flops,
)

# the tile shapes a GEMM library chooses among (CUTLASS/cuBLAS Hopper kernels use these thread-block tiles)
DEFAULT_TILES = ((128, 256), (256, 128), (128, 128), (64, 256), (128, 64), (64, 128))
SPLIT_K_MIN = 256  # K pieces of split-K GEMMs: not identifiable from timings (fit_gemm)
ATTENTION_BLOCK = 128
ROW_BLOCKS_GRID = (0.0, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0)
_RATE_STEPS = 201  # rate grid: +-60% around the first guess, in log steps
_ELEMENTWISE_ALIASES = {"layer_norm_1024": "layer_norm"}


@dataclass(frozen=True)
class OpRecords:
    """Timings by family, as numpy columns."""

    gemm: np.ndarray  # rows (m, k, n, seconds): forward, dgrad and wgrad each as a GEMM
    attention: np.ndarray  # rows (batch, heads, seq, head_dim, causal, forward_s, backward_s)
    elementwise: dict[str, np.ndarray]  # pass -> rows (elements, seconds)
    devices: tuple[str, ...]  # the "gpu" names the records give

    @property
    def count(self) -> int:
        return len(self.gemm) // 3 + len(self.attention) + sum(len(v) for v in self.elementwise.values())


def _number(record: dict, key: str, where: str, integer: bool = False) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0 \
            or (integer and value != int(value)):
        kind = "an integer >= 1" if integer else "a number > 0"
        raise SynthError(f"{where}: field '{key}' must be {kind}, got {value!r}")
    return float(value)


def op_records(lines: Iterable[tuple[str, dict]]) -> OpRecords:
    """Records from ``(where, record)`` pairs; SynthError naming the line and
    field of the first bad one, or when a family has no record."""
    gemm, attention, devices = [], [], []
    elementwise: dict[str, list] = {}
    for where, r in lines:
        if not isinstance(r, dict) or not isinstance(r.get("op"), str):
            raise SynthError(f"{where}: expected an operation record with an 'op' field (gemm, attention, "
                             f"{', '.join(ELEMENTWISE_OPS)})")
        op = _ELEMENTWISE_ALIASES.get(r["op"], r["op"])
        if isinstance(r.get("gpu"), str) and r["gpu"] not in devices:
            devices.append(r["gpu"])
        if op == "gemm":
            m, k, n = (_number(r, f, where, integer=True) for f in ("M", "K", "N"))
            fwd, dgrad, wgrad = (_number(r, f, where) for f in ("fwd_s", "dgrad_s", "wgrad_s"))
            gemm += [(m, k, n, fwd), (m, n, k, dgrad), (k, m, n, wgrad)]
        elif op == "attention":
            b, h, s, d = (_number(r, f, where, integer=True) for f in ("batch", "heads", "seq", "head_dim"))
            fwd, both = _number(r, "fwd_s", where), _number(r, "fwd_bwd_s", where)
            if both <= fwd:
                raise SynthError(f"{where}: fwd_bwd_s ({both}) must exceed fwd_s ({fwd})")
            causal = r.get("causal", True)
            if not isinstance(causal, bool):
                raise SynthError(f"{where}: field 'causal' must be true or false, got {causal!r}")
            attention.append((b, h, s, d, float(causal), fwd, both - fwd))
        elif op in ELEMENTWISE_OPS:
            elementwise.setdefault(op, []).append((_number(r, "elements", where, integer=True),
                                                   _number(r, "fwd_s", where)))
        else:
            raise SynthError(f"{where}: unknown op '{r['op']}' (known: gemm, attention, "
                             f"{', '.join(ELEMENTWISE_OPS)}, layer_norm_1024)")
    missing = [name for name, rows in (("gemm", gemm), ("attention", attention)) if not rows]
    missing += [name for name in ELEMENTWISE_OPS if name not in elementwise]
    if missing:
        raise SynthError(f"operation records: none for {', '.join(missing)}; the fit needs every family "
                         "(synth-reduce calibrate measures them all)")
    return OpRecords(np.array(gemm), np.array(attention),
                     {k: np.array(v) for k, v in elementwise.items()}, tuple(devices))


def op_lines(path: str | Path) -> list[tuple[str, Any]]:
    """``(file:line, value)`` of each record of a JSON-lines file."""
    return [(where, value) for where, _, value in json_lines(path, "operation records")]


def read_op_records(path: str | Path) -> OpRecords:
    return op_records(op_lines(path))


# ---------------------------------------------------------------- fitting


def _log_error(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(np.log(predicted / measured))


def _fit_rate(work: np.ndarray, measured: np.ndarray, floors: Sequence[float]) -> tuple[float, float, float]:
    """(rate, floor, mean |log error|) minimising the error of
    ``max(floor, work / rate)`` over ``floors`` and a rate grid."""
    guess = float(np.median(work / measured))
    rates = guess * np.exp(np.linspace(-0.6, 0.6, _RATE_STEPS))
    best = (guess, 0.0, math.inf)
    for floor in floors:
        predicted = np.maximum(floor, work[None, :] / rates[:, None])
        errors = _log_error(predicted, measured[None, :]).mean(axis=1)
        i = int(np.argmin(errors))
        if errors[i] < best[2]:
            best = (float(rates[i]), float(floor), float(errors[i]))
    return best


def _floor_candidates(measured: np.ndarray) -> list[float]:
    """Fixed costs to try: 0 and the low quantiles of the measured times."""
    return [0.0] + sorted(set(float(q) for q in np.quantile(measured, np.linspace(0, 0.3, 16))))


def _errors(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    rel = np.abs(predicted / measured - 1)
    return {"points": int(len(measured)), "median_rel_error": float(np.median(rel)),
            "p90_rel_error": float(np.quantile(rel, 0.9)), "max_rel_error": float(rel.max())}


def fit_elementwise(records: OpRecords) -> ElementwiseModel:
    """Per pass: the median seconds per element over its sizes that take at
    least three times its smallest time (bandwidth-bound), and its smallest
    time as the fixed cost when that is above its bandwidth cost."""
    passes = []
    for name in ELEMENTWISE_OPS:
        rows = records.elementwise[name]
        elements, seconds = rows[:, 0], rows[:, 1]
        bound = seconds >= 3 * seconds.min()
        per_element = float(np.median((seconds / elements)[bound if bound.any() else slice(None)]))
        smallest = int(np.argmin(elements))
        floor = float(seconds[smallest]) if seconds[smallest] > elements[smallest] * per_element else 0.0
        passes.append(ElementwisePass(name, per_element, floor))
    return ElementwiseModel(tuple(passes))


def fit_gemm(records: OpRecords, units: int, bandwidth_Bps: float,
             tiles: tuple[tuple[int, int], ...] = DEFAULT_TILES) -> GemmModel:
    """The sustained rate and the fixed cost per call. The split-K piece is
    kept at :data:`SPLIT_K_MIN`: it only shapes GEMMs far below the fixed cost
    (fewer FLOPs than ``2 tm tn split_k_min units``), which no timing can tell
    apart (the H100 records fit equally at 64 to 1024)."""
    m, k, n, measured = records.gemm.T
    work = tiled_flops(m, k, n, units, tiles, SPLIT_K_MIN)
    rate, floor, _ = _fit_rate(work, measured, _floor_candidates(measured))
    return GemmModel(rate, units, tiles, SPLIT_K_MIN, bandwidth_Bps, floor)


def fit_attention(records: OpRecords, units: int) -> AttentionModel:
    """Forward and backward each: the rate and fixed cost, over a grid of the
    per-row cost (``row_blocks``), shared by both directions."""
    b, h, s, d, causal, forward, backward = records.attention.T
    causal_rows = causal.astype(bool)
    best: tuple[float, AttentionModel] | None = None
    for row_blocks in ROW_BLOCKS_GRID:
        shape = AttentionModel(1.0, 1.0, units, ATTENTION_BLOCK, row_blocks, 0.0, 0.0)
        work = np.where(causal_rows, shape.forward_gpu_s(b, h, s, d, True), shape.forward_gpu_s(b, h, s, d, False))
        forward_rate, forward_floor, forward_error = _fit_rate(work, forward, _floor_candidates(forward))
        backward_rate, backward_floor, backward_error = _fit_rate(work * ATTENTION_BACKWARD_FLOPS_RATIO, backward,
                                                                  _floor_candidates(backward))
        model = AttentionModel(forward_rate, backward_rate, units, ATTENTION_BLOCK, row_blocks, forward_floor,
                               backward_floor)
        if best is None or forward_error + backward_error < best[0]:
            best = (forward_error + backward_error, model)
    assert best is not None
    return best[1]


# a layer's phase counts as host-bound when its eager time is at least this multiple of the same
# work replayed as a CUDA graph (the GPU's own time): the host, not the GPU, sets its pace. The fit
# needs one such phase each, forward and backward, for the host's cost to show at all.
HOST_BOUND_RATIO = 1.5


def _issue_error(cost_s: float, gpu_s: np.ndarray, ahead_s: np.ndarray, kernels: np.ndarray,
                 measured_s: np.ndarray) -> float:
    """Mean |log error| of ``max(gpu_s, ahead_s + kernels * cost_s)`` against ``measured_s``."""
    return float(_log_error(np.maximum(gpu_s, ahead_s + kernels * cost_s), measured_s).mean())


def _fit_issue_cost(gpu_s: np.ndarray, ahead_s: np.ndarray, kernels: np.ndarray, measured_s: np.ndarray) -> float:
    """The seconds per launch minimising :func:`_issue_error`, over the costs
    where a record's host time meets its measured or its GPU time (where the
    error's slope changes); the smallest on a tie."""
    candidates = np.concatenate([(measured_s - ahead_s) / kernels, (gpu_s - ahead_s) / kernels])
    candidates = np.unique(candidates[candidates > 0])
    errors = [_issue_error(c, gpu_s, ahead_s, kernels, measured_s) for c in candidates]
    return float(candidates[int(np.argmin(errors))])


def fit_host(lines: Iterable[tuple[str, Any]]) -> tuple[HostModel, dict[str, Any]]:
    """The host's seconds per kernel launch, forward and backward, from
    whole-layer records (``kind`` "layer" with eager and CUDA-graph times and
    kernel counts, as ``scripts/layer_accuracy.py measure`` writes them; other
    records are skipped). The model is the planner's: work issued without a
    synchronisation lasts the larger of the GPU's time (the graph replay) and
    its kernels times the seconds per launch. The forward's cost minimises the
    mean |log error| of ``max(forward_graph_s, forward_kernels x forward cost)``
    against ``forward_s`` over every layer; the backward's, with the forward's
    fixed, that of ``max(forward_backward_graph_s, forward launches + backward
    launches)`` against ``forward_backward_s`` (a forward and its backward run
    back to back, the GPU catching up in one on what the host left it in the
    other). Layers the GPU bounds cap the cost (their eager time is not
    exceeded), host-bound ones set it. SynthError when no phase is host-bound
    (eager at least ``HOST_BOUND_RATIO`` x its graph replay): the cost does not
    show."""
    columns: list[tuple[float, ...]] = []
    for where, r in lines:
        if not isinstance(r, dict) or r.get("kind") != "layer" or "error" in r or "forward_graph_s" not in r:
            continue
        forward, both = _number(r, "forward_s", where), _number(r, "forward_backward_s", where)
        graph_forward, graph_both = _number(r, "forward_graph_s", where), _number(r, "forward_backward_graph_s", where)
        kernels_forward = _number(r, "forward_kernels", where, integer=True)
        kernels_both = _number(r, "forward_backward_kernels", where, integer=True)
        if kernels_both <= kernels_forward:
            raise SynthError(f"{where}: forward_backward_kernels ({kernels_both:g}) must exceed forward_kernels "
                             f"({kernels_forward:g})")
        columns.append((forward, both, graph_forward, graph_both, kernels_forward, kernels_both - kernels_forward))
    rows = np.array(columns).reshape(-1, 6)
    forward, both, graph_forward, graph_both, kernels_forward, kernels_backward = rows.T
    bound = {"forward": int((forward >= HOST_BOUND_RATIO * graph_forward).sum()),
             "backward": int((both - forward >= HOST_BOUND_RATIO * (graph_both - graph_forward)).sum())}
    missing = [phase for phase, count in bound.items() if not count]
    if missing:
        raise SynthError(f"layer records: no host-bound layer in the {' and '.join(missing)} of {len(rows)} layer "
                         f"record(s) with CUDA-graph times (eager at least {HOST_BOUND_RATIO:g} x the graph replay); "
                         "measure small layers too (scripts/layer_accuracy.py measure)")
    forward_s = _fit_issue_cost(graph_forward, np.zeros(len(rows)), kernels_forward, forward)
    backward_s = _fit_issue_cost(graph_both, kernels_forward * forward_s, kernels_backward, both)
    stats = {"layers": len(rows), "host_bound_forward": bound["forward"], "host_bound_backward": bound["backward"],
             "forward_median_rel_error": float(np.median(np.abs(
                 np.maximum(graph_forward, kernels_forward * forward_s) / forward - 1))),
             "forward_backward_median_rel_error": float(np.median(np.abs(
                 np.maximum(graph_both, kernels_forward * forward_s + kernels_backward * backward_s) / both - 1)))}
    return HostModel(forward_s, backward_s), stats


def fit_operation_profile(records: OpRecords, units: int, name: str, devices: Sequence[str],
                          source: str) -> OperationProfile:
    """The profile of ``records`` (GEMMs on ``units`` multiprocessors), with
    its residuals on its own records per family in ``fit``."""
    if isinstance(units, bool) or not isinstance(units, int) or units < 1:
        raise SynthError(f"--units {units!r}: the GPU's streaming multiprocessor count, an integer >= 1")
    elementwise = fit_elementwise(records)
    gemm = fit_gemm(records, units, elementwise.bandwidth_Bps)
    attention = fit_attention(records, units)
    profile = OperationProfile(name, tuple(devices), gemm, attention, elementwise, 0.0, source)
    return OperationProfile(name, tuple(devices), gemm, attention, elementwise, 0.0, source,
                            fit=residuals(profile, records))


def residuals(profile: OperationProfile, records: OpRecords) -> dict[str, Any]:
    """Relative errors of the profile on ``records``, per family."""
    m, k, n, measured = records.gemm.T
    b, h, s, d, causal, forward, backward = records.attention.T
    attn = profile.attention
    causal_rows = causal.astype(bool)
    fwd = np.where(causal_rows, attn.forward_s(b, h, s, d, True), attn.forward_s(b, h, s, d, False))
    bwd = np.where(causal_rows, attn.backward_s(b, h, s, d, True), attn.backward_s(b, h, s, d, False))
    out = {"gemm": _errors(profile.gemm.seconds(m, k, n), measured),
           "attention_forward": _errors(fwd, forward), "attention_backward": _errors(bwd, backward)}
    for name, rows in sorted(records.elementwise.items()):
        out[name] = _errors(profile.elementwise.seconds(name, rows[:, 0]), rows[:, 1])
    out["records"] = records.count
    return out


# ---------------------------------------------------------------- measuring


@dataclass(frozen=True)
class Grid:
    """The shapes to measure: GEMMs of transformer layers (hidden sizes x tensor
    parallel sizes x token counts), causal attention (sequences x heads x
    batches, head dim 128) and elementwise passes over element counts."""

    hiddens: tuple[int, ...]
    tensor_parallel: tuple[int, ...]
    tokens: tuple[int, ...]
    sequences: tuple[int, ...]
    heads: tuple[int, ...]
    batches: tuple[int, ...]
    head_dim: int
    elements: tuple[int, ...]
    iterations: int

    def gemm_shapes(self) -> list[tuple[int, int, int]]:
        shapes = set()
        for h in self.hiddens:
            for t in self.tensor_parallel:
                shapes |= {(h, 3 * h // t), (h // t, h), (h, 4 * h // t), (4 * h // t, h)}
        return [(m, k, n) for m in self.tokens for k, n in sorted(shapes)]


# the grid of data/calibration/h100-ops.jsonl (what the shipped H100 profile was fitted on)
GPU_GRID = Grid(hiddens=(1024, 2048, 4096, 6144, 8192, 12288, 16384), tensor_parallel=(1, 2, 4, 8),
                tokens=(2048, 8192, 32768), sequences=(1024, 2048, 4096, 8192), heads=(2, 4, 8, 16, 32, 64),
                batches=(1, 4), head_dim=128, elements=tuple(1 << e for e in (20, 22, 24, 26, 28)), iterations=10)
# a few seconds on a CPU: the mechanics, not a useful profile
CPU_GRID = Grid(hiddens=(64, 128), tensor_parallel=(1, 2), tokens=(64, 256), sequences=(64, 128), heads=(2, 4),
                batches=(1,), head_dim=32, elements=(1 << 12, 1 << 16, 1 << 20), iterations=3)


def measure(device: str, grid: Grid, emit: Callable[[dict[str, Any]], None],
            progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> int:
    """Time every operation of ``grid`` on ``device`` ("cuda" or "cpu") with
    PyTorch (bf16 on a GPU, fp32 on the CPU, where bf16 GEMMs are emulated),
    calling ``emit`` with one record per shape and ``progress`` with one line
    per family; returns the number of records. A shape's time is the mean of
    ``grid.iterations`` calls after two warm-up calls; on the CPU the least of
    three such means."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        raise SynthError("calibrate measures with PyTorch: pip install 'synth-reduce[torch]'") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise SynthError("calibrate: no CUDA GPU visible to PyTorch; run it on the GPU machine, or pass "
                         "--device cpu to try the mechanics")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    common = {"gpu": name, "torch": torch.__version__, "dtype": str(dtype).removeprefix("torch.")}

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    # on the CPU another process can take the core for part of a loop (a loaded machine, a test suite on two
    # workers): the least of three loops' means, as timeit does; a GPU's loop is timed once
    loops = 1 if device == "cuda" else 3

    def timed(fn: Callable[[], Any]) -> float:
        for _ in range(2):
            fn()
        synchronize()
        best = math.inf
        for _ in range(loops):
            start = time.perf_counter()
            for _ in range(grid.iterations):
                fn()
            synchronize()
            best = min(best, (time.perf_counter() - start) / grid.iterations)
        return best

    count = 0

    def put(record: dict[str, Any]) -> None:
        nonlocal count
        record.update(common)
        emit(record)
        count += 1

    started = time.monotonic()
    shapes = grid.gemm_shapes()
    for m, k, n in shapes:
        a, b, g = (torch.randn(*shape, device=device, dtype=dtype) for shape in ((m, k), (k, n), (m, n)))
        put({"op": "gemm", "M": m, "K": k, "N": n, "flops": 2 * m * k * n, "fwd_s": timed(lambda: a @ b),
             "dgrad_s": timed(lambda: g @ b.t()), "wgrad_s": timed(lambda: a.t() @ g)})
    progress(f"calibrate: {len(shapes)} GEMM shapes measured ({time.monotonic() - started:.1f} s)")
    cases = [(s, h, b) for s in grid.sequences for h in grid.heads for b in grid.batches]
    for s, h, b in cases:
        q, k_, v = (torch.randn(b, h, s, grid.head_dim, device=device, dtype=dtype, requires_grad=True)
                    for _ in range(3))

        def forward() -> None:
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k_, v, is_causal=True)

        def forward_backward() -> None:
            out = F.scaled_dot_product_attention(q, k_, v, is_causal=True)
            out.backward(torch.ones_like(out))

        # a pass's backward does more work than its forward: a pair that says otherwise was disturbed (another
        # process took the core during the forward's loops) and is measured again, a few times at most; the
        # fit refuses a pair that stays inconsistent
        for _ in range(4):
            forward_s, both_s = timed(forward), timed(forward_backward)
            if both_s > forward_s:
                break
        put({"op": "attention", "batch": b, "heads": h, "seq": s, "head_dim": grid.head_dim, "causal": True,
             "fwd_flops_full": 4 * b * h * s * s * grid.head_dim, "fwd_s": forward_s, "fwd_bwd_s": both_s})
    progress(f"calibrate: {len(cases)} attention shapes measured ({time.monotonic() - started:.1f} s)")
    for n in grid.elements:
        x, y = (torch.randn(n, device=device, dtype=dtype) for _ in range(2))
        weight = torch.ones(1024, device=device, dtype=dtype)
        rows = x.view(-1, 1024) if n % 1024 == 0 else x.view(1, -1)
        put({"op": "add", "elements": n, "fwd_s": timed(lambda: x + y)})
        put({"op": "gelu_tanh", "elements": n, "fwd_s": timed(lambda: F.gelu(x, approximate="tanh"))})
        put({"op": "silu_mul", "elements": n, "fwd_s": timed(lambda: F.silu(x) * y)})
        put({"op": "layer_norm", "elements": n,
             "fwd_s": timed(lambda: F.layer_norm(rows, rows.shape[-1:], weight[:rows.shape[-1]]))})
    progress(f"calibrate: {4 * len(grid.elements)} elementwise passes measured ({time.monotonic() - started:.1f} s)")
    return count
