"""The per-operation compute model: operation timing against independent
references, the fit recovering known parameters, the shipped H100 profile
(re-fitted from its data, held-out accuracy), the layer and stage composition,
the planner using the same numbers, and the compute / calibrate / fit commands."""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import usage_error

from synth.cli import main
from synth.errors import SynthError
from synth.planner.activations import Recompute
from synth.planner.calibration import (
    CPU_GRID,
    DEFAULT_TILES,
    fit_host,
    fit_operation_profile,
    op_lines,
    op_records,
    read_op_records,
)
from synth.planner.compute import (
    DEFAULT_COMPUTE,
    EfficiencyCurve,
    default_compute,
    load_compute_profile,
    operation_profile_document,
    save_operation_profile,
    shipped_profile_for,
)
from synth.planner.layercompute import EAGER_LAUNCHES, layer_compute, layer_launches, recompute_ops
from synth.planner.optimes import Shard
from synth.planner.stagecompute import head_compute, micro_batch_fixed_s, stage_compute
from synth.planner.modelspec import load_model, parse_inline_model
from synth.planner.operations import (
    AttentionModel,
    ElementwiseModel,
    ElementwisePass,
    GemmModel,
    HostModel,
    OperationProfile,
    tiled_flops,
)
from synth.planner.configurations import plan_job
from synth.planner.request import JobRequest
from synth.planner.stepfit import RecordCosts, fit_micro_batch_cost, predicted_step_s
from synth.planner.stepmodel import Configuration, Sharding, Training, compute_estimate, stage_parameters, step_shape
from synth.planner.steprecords import StepRecord, write_step_records
from synth.synthesis.placement import Axis, AxisRange, enumerate_placements
from synth.topology import load_topology

REPO = Path(__file__).resolve().parents[2]
H100_RECORDS = REPO / "data" / "calibration" / "h100-ops.jsonl"
H100_PROFILE = REPO / "profiles" / "h100-sxm5-80gb.compute.json"
H100_LAYERS = REPO / "data" / "calibration" / "h100-layers.jsonl"
TILES = ((128, 256), (256, 128), (64, 128))


def known_profile(micro_batch_s: float = 0.0) -> OperationProfile:
    """A profile with round parameters (not fitted to anything)."""
    return OperationProfile(
        "known", ("Known GPU",),
        GemmModel(5e14, 100, DEFAULT_TILES, 256, 2e12, 2e-5),
        AttentionModel(4e14, 3e14, 100, 128, 2.0, 3e-5, 1e-4),
        ElementwiseModel((ElementwisePass("add", 3e-12, 8e-6), ElementwisePass("gelu_tanh", 2e-12, 8e-6),
                          ElementwisePass("silu_mul", 5e-12, 1.6e-5), ElementwisePass("layer_norm", 3e-12, 1.5e-5))),
        micro_batch_s, "test")


# ---------------------------------------------------------------- operations against references


def _scheduled_flops(m: int, k: int, n: int, units: int, tm: int, tn: int, split_k_min: int) -> float:
    """Reference: every (tile, K piece) work item listed and dealt to the units
    one by one; the busiest unit's FLOPs x units."""
    tiles = [(i, j) for i in range(math.ceil(m / tm)) for j in range(math.ceil(n / tn))]
    split = 1
    while len(tiles) * (split + 1) <= units and k // (split + 1) >= split_k_min:
        split += 1
    piece = math.ceil(k / split)
    load = [0.0] * units
    for item in range(len(tiles) * split):
        load[item % units] += 2 * tm * tn * piece
    return max(load) * units


@pytest.mark.parametrize("seed", range(3))
def test_tiled_flops_against_a_work_item_schedule(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        m, k, n = (int(x) for x in rng.integers(1, 5000, size=3))
        units, split_k_min = int(rng.integers(1, 140)), int(rng.choice([64, 128, 512]))
        tile = TILES[int(rng.integers(len(TILES)))]
        want = _scheduled_flops(m, k, n, units, *tile, split_k_min)
        assert float(tiled_flops(m, k, n, units, (tile,), split_k_min)) == want, (m, k, n, units, tile)
    # the best tile is chosen, and full waves of whole tiles cost exactly 2 m k n
    assert float(tiled_flops(256 * 10, 4096, 128 * 10, 100, TILES, 256)) == 2 * 2560 * 4096 * 1280
    assert float(tiled_flops(300, 999, 700, 7, TILES, 128)) == min(
        _scheduled_flops(300, 999, 700, 7, *t, 128) for t in TILES)
    # one shape (the planner's memoised path) gives the array path's value to the bit, at shapes
    # whose products pass 2**53 too
    rng = np.random.default_rng(7)
    shapes = rng.integers(1, 1 << 21, size=(200, 3))
    shapes[:20] *= 64
    whole = tiled_flops(shapes[:, 0], shapes[:, 1], shapes[:, 2], 132, DEFAULT_TILES, 256)
    assert [tiled_flops(int(m), int(k), int(n), 132, DEFAULT_TILES, 256) for m, k, n in shapes] == list(whole)


def test_gemm_time_is_the_slower_of_compute_and_memory_and_never_below_its_floor():
    g = known_profile().gemm
    m, k, n = 8192, 8192, 8192
    assert float(g.gpu_s(m, k, n)) == pytest.approx(2 * m * k * n / 5e14 * (
        float(tiled_flops(m, k, n, 100, DEFAULT_TILES, 256)) / (2 * m * k * n)))
    skinny = (65536, 1, 65536)  # no reuse: its bytes bound it
    assert float(g.gpu_s(*skinny)) == pytest.approx(2 * (65536 + 65536 + 65536**2) / 2e12)
    assert float(g.seconds(1, 1, 1)) == 2e-5


def test_attention_work_counts_block_pairs():
    a = replace(known_profile().attention, row_blocks=0.0, units=1)
    d, block = 128, 128
    # one unit: every pair of a causal s = 4 blocks (10 pairs), or all 16 without the mask
    assert float(a.critical_flops(1, 1, 512, d, True)) == 10 * 4 * block * block * d
    assert float(a.critical_flops(1, 1, 512, d, False)) == 16 * 4 * block * block * d
    many = replace(a, units=1000)  # more units than rows: the longest row, 4 blocks
    assert float(many.critical_flops(1, 1, 512, d, True)) == 4 * 4 * block * block * d
    assert float(a.backward_gpu_s(2, 3, 1024, d)) == pytest.approx(
        2.5 * float(a.critical_flops(2, 3, 1024, d)) / 3e14)


def test_profile_documents_round_trip_and_older_ones_lack_the_host_model():
    from synth.planner.operations import operation_profile_from_dict
    profile = replace(known_profile(), host=HostModel(4e-5, 5e-5))
    doc = json.loads(json.dumps(operation_profile_document(profile)))
    assert operation_profile_from_dict(doc) == profile
    del doc["host"]  # written before the host model existed
    assert operation_profile_from_dict(doc) == known_profile()


def test_profile_fields_are_checked_with_their_names():
    good = operation_profile_document(replace(known_profile(), host=HostModel(4e-5, 5e-5)))
    for change, message in (
            (lambda d: d["gemm"].update(rate_flops=-1), "gemm.rate_flops must be a number > 0"),
            (lambda d: d["gemm"].update(tiles=[]), "gemm.tiles must be a non-empty list"),
            (lambda d: d["gemm"].pop("units"), "'gemm' lacks units"),
            (lambda d: d["attention"].update(extra=1), "'attention' has unknown field(s) extra"),
            (lambda d: d["elementwise"].pop("add"), "elementwise has no 'add' pass"),
            (lambda d: d.update(devices=[]), "'devices' must be a non-empty list"),
            (lambda d: d.update(micro_batch_s=float("nan")), "micro_batch_s must be a number >= 0"),
            (lambda d: d.update(host=[]), "'host' must be an object (forward_launch_s, backward_launch_s)"),
            (lambda d: d["host"].pop("backward_launch_s"), "'host' lacks backward_launch_s"),
            (lambda d: d["host"].update(forward_launch_s=-1e-6), "host.forward_launch_s must be a number >= 0")):
        doc = json.loads(json.dumps(good))
        change(doc)
        from synth.planner.operations import operation_profile_from_dict
        with pytest.raises(SynthError, match=message.replace("(", r"\(").replace(")", r"\)")):
            operation_profile_from_dict(doc)


# ---------------------------------------------------------------- the fit


def _records_of(profile: OperationProfile) -> list[tuple[str, dict]]:
    """Noise-free records of the calibration grid's shapes, timed by ``profile``."""
    out = []
    shapes = {(h, 3 * h // t) for h in (1024, 4096, 8192) for t in (1, 2, 8)} | {
        (4 * h // t, h) for h in (1024, 4096, 8192) for t in (1, 2, 8)}
    g = profile.gemm
    small = [(512, 256, 512), (256, 512, 256), (512, 384, 1024), (1024, 768, 256)]  # at the floor
    for m, k, n in [(m, k, n) for m, (k, n) in itertools.product((512, 2048, 8192), sorted(shapes))] + small:
        out.append({"op": "gemm", "M": m, "K": k, "N": n, "fwd_s": float(g.seconds(m, k, n)),
                    "dgrad_s": float(g.seconds(m, n, k)), "wgrad_s": float(g.seconds(k, m, n)), "gpu": "Known GPU"})
    a = profile.attention
    for s, h, b in itertools.product((512, 1024, 4096, 8192), (1, 2, 8, 32), (1, 4)):
        forward = float(a.forward_s(b, h, s, 128))
        out.append({"op": "attention", "batch": b, "heads": h, "seq": s, "head_dim": 128, "causal": True,
                    "fwd_s": forward, "fwd_bwd_s": forward + float(a.backward_s(b, h, s, 128))})
    for op, n in itertools.product(("add", "gelu_tanh", "silu_mul", "layer_norm"), (1 << 16, 1 << 22, 1 << 26)):
        out.append({"op": op, "elements": n, "fwd_s": float(profile.elementwise.seconds(op, n))})
    return [(f"line {i + 1}", r) for i, r in enumerate(out)]


def test_the_fit_recovers_a_known_profile():
    truth = known_profile()
    fitted = fit_operation_profile(op_records(_records_of(truth)), 100, "again", ["Known GPU"], "test")
    assert fitted.gemm.split_k_min == 256
    assert fitted.gemm.floor_s == pytest.approx(2e-5)
    assert fitted.gemm.rate_flops == pytest.approx(5e14, rel=0.01)  # the rate grid's step is 0.6 %
    assert fitted.attention.row_blocks == 2.0
    assert fitted.attention.forward_rate_flops == pytest.approx(4e14, rel=0.01)
    assert fitted.attention.backward_rate_flops == pytest.approx(3e14, rel=0.01)
    assert fitted.attention.forward_floor_s == pytest.approx(3e-5)
    assert fitted.attention.backward_floor_s == pytest.approx(1e-4)
    for p in truth.elementwise.passes:
        got = fitted.elementwise.of(p.name)
        assert got.seconds_per_element == pytest.approx(p.seconds_per_element) and got.floor_s == p.floor_s
    assert fitted.fit["gemm"]["median_rel_error"] < 0.005


def test_bad_operation_records_name_the_line_and_field(tmp_path):
    from synth.errors import SynthError

    lines = _records_of(known_profile())
    bad = [(w, dict(r)) for w, r in lines]
    bad[3][1]["K"] = 0
    with pytest.raises(SynthError, match=r"line 4: field 'K' must be an integer >= 1, got 0"):
        op_records(bad)
    with pytest.raises(SynthError, match="none for attention"):
        op_records([x for x in lines if x[1]["op"] != "attention"])
    with pytest.raises(SynthError, match="unknown op 'conv'"):
        op_records(lines + [("line 999", {"op": "conv"})])


H200_RECORDS = REPO / "data" / "calibration" / "h200-ops.jsonl"
H200_PROFILE = REPO / "profiles" / "h200-sxm-141gb.compute.json"
H200_LAYERS = REPO / "data" / "calibration" / "h200-layers.jsonl"


@pytest.mark.parametrize("profile_path, records, layers", [(H100_PROFILE, H100_RECORDS, H100_LAYERS),
                                                           (H200_PROFILE, H200_RECORDS, H200_LAYERS)],
                         ids=["h100", "h200"])
def test_the_shipped_profiles_are_the_fits_of_their_data(profile_path, records, layers):
    """Stale when the fit changes: regenerate with the commands in
    data/calibration/README.md."""
    shipped = load_compute_profile(profile_path)
    again = fit_operation_profile(read_op_records(records), 132, shipped.name, shipped.devices, shipped.source)
    host, stats = fit_host(op_lines(layers))
    again = replace(again, host=host, fit={**again.fit, "host": stats})
    assert again == shipped
    assert again.fit == shipped.fit


def test_each_shipped_profile_applies_to_its_gpus_names():
    """The measured nvidia-smi name and the topology's device name select the
    same profile; the H100 and H200 profiles stay apart."""
    assert shipped_profile_for("NVIDIA H200") == shipped_profile_for("NVIDIA H200 SXM 141GB") == \
        load_compute_profile(H200_PROFILE)
    assert shipped_profile_for("NVIDIA H100 80GB HBM3") == load_compute_profile(H100_PROFILE)
    assert default_compute(load_topology("hgx-h200").device.name) == load_compute_profile(H200_PROFILE)
    assert default_compute(load_topology("dgx-h100").device.name) == load_compute_profile(H100_PROFILE)


def test_h100_gemms_at_a_token_count_left_out_of_the_fit():
    """Fit on the GEMMs at 2048 and 32768 tokens, score the 8192 ones (and
    the other families as fitted): the tile model carries over."""
    lines = [(w, r) for w, _, r in _json_lines(H100_RECORDS)]
    train = op_records([(w, r) for w, r in lines if r.get("M") != 8192])
    held = op_records([(w, r) for w, r in lines if r.get("M") in (None, 8192)])
    profile = fit_operation_profile(train, 132, "h100", ["H100"], "test")
    m, k, n, measured = held.gemm.T
    rel = np.abs(profile.gemm.seconds(m, k, n) / measured - 1)
    assert np.median(rel) < 0.06 and np.quantile(rel, 0.9) < 0.2, (np.median(rel), np.quantile(rel, 0.9))


def _json_lines(path: Path):
    from synth.documents import json_lines

    return json_lines(path, "operation records")


# ---------------------------------------------------------------- composition


def test_a_layer_is_the_sum_of_its_operations_written_out():
    """Every operation of a GPT and a Llama layer at tp 2, written out by hand
    from the model's shapes, timed one by one."""
    p = known_profile()
    for spec, gated in (("layers=2,hidden=512,heads=8,seq=256,vocab=1000", False),
                        ("layers=2,hidden=512,heads=8,kv_heads=2,ffn=1376,gated_mlp=true,seq=256,vocab=1000", True)):
        model = parse_inline_model(spec)
        b, t, s, h = 3, 2, 256, 512
        T, f, kv = b * s, model.ffn, 512 * model.kv_heads // 8
        gemms = [(T, h, (h + 2 * kv) // t), (T, h // t, h), (T, h, (2 if gated else 1) * f // t), (T, f // t, h)]
        g, a, e = p.gemm, p.attention, p.elementwise
        forward = sum(float(g.seconds(*x)) for x in gemms) + float(a.forward_s(b, 8 // t, s, 64))
        forward += 2 * float(e.seconds("layer_norm", T * h)) + 2 * float(e.seconds("add", T * h))
        forward += float(e.seconds("silu_mul" if gated else "gelu_tanh", T * f // t))
        backward = sum(float(g.seconds(M, N, K)) + float(g.seconds(K, M, N)) for M, K, N in gemms)
        backward += max(a.forward_floor_s, float(a.backward_gpu_s(b, 8 // t, s, 64)))
        backward += 2 * float(e.seconds("layer_norm", 2 * T * h)) + 2 * float(e.seconds("add", T * h))
        backward += float(e.seconds("silu_mul" if gated else "gelu_tanh", 2 * T * f // t))
        if gated:
            forward += float(e.seconds("silu_mul", T * (h + kv) // t))
            backward += float(e.seconds("silu_mul", 2 * T * (h + kv) // t))
        layer = layer_compute(p, model, Shard(t, b, s))
        assert layer.forward_s == pytest.approx(forward, rel=1e-12)
        assert layer.backward_s == pytest.approx(backward, rel=1e-12)


def test_compute_sequence_parallel_option(capsys):
    """compute's --sequence-parallel (default on where tp > 1), as plan's."""
    docs = {}
    for flag in ("on", "off"):
        assert main(["compute", "--device", "h100-sxm5-80gb", "--model", "llama2-7b", "--tp", "4",
                     "--sequence-parallel", flag, "--json"]) == 0
        docs[flag] = json.loads(capsys.readouterr().out)
    assert docs["on"]["sequence_parallel"] is True and docs["off"]["sequence_parallel"] is False
    norm = {flag: next(op for op in doc["operations"] if op["name"] == "norm1") for flag, doc in docs.items()}
    assert norm["off"]["shape"] == [4 * norm["on"]["shape"][0]]
    assert main(["compute", "--device", "h100-sxm5-80gb", "--model", "llama2-7b", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["sequence_parallel"] is False  # tp 1: nothing to split over


def test_sequence_parallelism_splits_the_norms_and_residuals_only():
    """With sequence parallelism a tensor-parallel rank runs the two norms and
    the two residual adds (and the final norm) on T h / t values; every other
    operation is the same."""
    p = known_profile()
    model = parse_inline_model("layers=2,hidden=512,heads=8,seq=256,vocab=1000")
    plain, sp = (layer_compute(p, model, Shard(4, 2, 256, flag)) for flag in (False, True))
    T, h = 2 * 256, 512
    split = {"norm1", "norm1.backward", "norm2", "norm2.backward", "residual1", "residual1.backward",
             "residual2", "residual2.backward"}
    for a, b in zip(plain.ops, sp.ops, strict=True):
        assert a.name == b.name
        if a.name in split:
            factor = 2 if a.name.startswith("norm") and a.name.endswith("backward") else 1  # the backward's passes
            assert a.shape == (T * h,) and b.shape == (T * h // 4,)
            assert b.seconds == float(p.elementwise.seconds("layer_norm" if a.name.startswith("norm") else "add",
                                                            factor * T * h // 4))
        else:
            assert a == b
    heads = [head_compute(p, model, Shard(4, 2, 256, flag)) for flag in (False, True)]
    assert heads[0].ops[0].shape == (T * h,) and heads[1].ops[0].shape == (T * h // 4,)


def _layer_rows(path: Path = H100_LAYERS) -> list[dict]:
    return [r for _, _, r in _json_lines(path) if r.get("kind") == "layer" and "error" not in r]


@pytest.mark.parametrize("layers", [H100_LAYERS, H200_LAYERS], ids=["h100", "h200"])
def test_eager_launch_counts_match_the_profiler(layers):
    """The table's kernels per layer against the PyTorch profiler's counts in
    the H100 and H200 layer records: the table counts the host-bound shapes
    (one sequence of 2048 at tp 8) exactly for GPT and Llama-7B, and larger
    shapes launch at most a few more (biases outside the GEMM epilogue,
    split-K reductions, grouped-query copies)."""
    assert layer_launches(load_model("gpt3-2.7b")) == (11, 28)
    assert layer_launches(load_model("llama2-7b")) == (22, 43)
    assert sum(f for f, _ in EAGER_LAUNCHES.values()) > 0
    rows = _layer_rows(layers)
    assert len(rows) == 96
    for r in rows:
        forward, backward = layer_launches(load_model(r["model"]))
        measured_forward = r["forward_kernels"]
        measured_backward = r["forward_backward_kernels"] - measured_forward
        where = f"{r['model']} tp={r['tp']} {r['micro_batch']}x{r['seq']}"
        assert 0 <= measured_forward - forward <= 4, where
        assert -2 <= measured_backward - backward <= 8, where
        if r["tp"] == 8 and r["micro_batch"] * r["seq"] == 2048 and r["model"] in ("gpt3-2.7b", "llama2-7b"):
            assert measured_forward == forward, where


def test_host_issue_bounds_each_phase_of_a_small_layer():
    """A layer phase lasts max(GPU operations, launches x host seconds per
    launch): a tiny layer is host-bound (its phases are exactly the launch
    costs), a large one is untouched, and recomputation repeats the forward's
    host time."""
    host = HostModel(forward_launch_s=4e-5, backward_launch_s=5e-5)
    p = replace(known_profile(), host=host)
    for spec in ("layers=2,hidden=256,heads=4,seq=128,vocab=1000",
                 "layers=2,hidden=256,heads=4,kv_heads=2,ffn=688,gated_mlp=true,seq=128,vocab=1000"):
        model = parse_inline_model(spec)
        forward_launches, backward_launches = layer_launches(model)
        small = layer_compute(p, model, Shard(1, 1, 128))
        gpu = layer_compute(known_profile(), model, Shard(1, 1, 128))
        assert gpu.forward_s < forward_launches * 4e-5 and gpu.backward_s < backward_launches * 5e-5
        assert small.forward_s == pytest.approx(forward_launches * 4e-5, rel=1e-12)
        assert small.backward_s == pytest.approx(backward_launches * 5e-5, rel=1e-12)
        assert [op.name for op in small.ops if op.name == "host_issue"] == ["host_issue"] * 2
        full = recompute_ops(p, model, Shard(1, 1, 128), Recompute.FULL, small)
        assert full.total_s == pytest.approx(small.forward_s, rel=1e-12)
    big = parse_inline_model("layers=2,hidden=8192,heads=64,seq=4096,vocab=1000")
    assert layer_compute(p, big, Shard(1, 1, 4096)) == layer_compute(known_profile(), big, Shard(1, 1, 4096))


def _layer_record(forward_s, both_s, graph_forward_s, graph_both_s, kernels=(10, 30)) -> dict:
    return {"kind": "layer", "model": "m", "forward_s": forward_s, "forward_backward_s": both_s,
            "forward_graph_s": graph_forward_s, "forward_backward_graph_s": graph_both_s,
            "forward_kernels": kernels[0], "forward_backward_kernels": kernels[1]}


def _issued(kernels: tuple[int, int], graph_s: tuple[float, float], launch_s: tuple[float, float]) -> dict:
    """A layer record as a host issuing each kernel at ``launch_s`` (forward,
    backward) ahead of a GPU taking ``graph_s`` (forward, backward) would time
    it: a forward alone lasts the larger of its GPU and host times, a forward
    with its backward the larger of their sums."""
    host_forward, host_backward = kernels[0] * launch_s[0], kernels[1] * launch_s[1]
    return _layer_record(max(graph_s[0], host_forward), max(sum(graph_s), host_forward + host_backward),
                         graph_s[0], sum(graph_s), (kernels[0], sum(kernels)))


def test_the_host_fit_recovers_the_launch_costs_the_records_were_issued_at():
    """Records built from known costs (40 us forward, 55 us backward) over
    small host-bound layers, large GPU-bound ones and layers near the edge
    (the forward GPU-bound, the backward's host time showing only in the sum):
    the fit returns those costs."""
    costs = (4e-5, 5.5e-5)
    shapes = [((11, 28), (1e-4, 3e-4)), ((22, 43), (2e-4, 5e-4)), ((13, 30), (3e-4, 6e-4)),  # host-bound
              ((11, 28), (6e-4, 8e-4)), ((22, 43), (1.0e-3, 1.2e-3)), ((12, 30), (5e-4, 7e-4)),  # near the edge
              ((15, 36), (5e-3, 1.1e-2)), ((26, 49), (9e-3, 2e-2))]  # GPU-bound
    rows = [(str(i), _issued(kernels, graph, costs)) for i, (kernels, graph) in enumerate(shapes)]
    rows += [("step", {"kind": "step", "step_s": 1.0}), ("host", {"kind": "host", "add_s": 1e-5})]
    host, stats = fit_host(rows)
    assert (host.forward_launch_s, host.backward_launch_s) == (pytest.approx(4e-5, rel=1e-9),
                                                               pytest.approx(5.5e-5, rel=1e-9))
    assert stats["layers"] == 8 and stats["forward_backward_median_rel_error"] == pytest.approx(0, abs=1e-12)
    # a disturbed host-bound record (its eager times doubled) moves neither cost
    disturbed = dict(rows[0][1], forward_s=2 * rows[0][1]["forward_s"],
                     forward_backward_s=2 * rows[0][1]["forward_backward_s"])
    host, _ = fit_host([("d", disturbed)] + rows[1:])
    assert (host.forward_launch_s, host.backward_launch_s) == (pytest.approx(4e-5, rel=1e-9),
                                                               pytest.approx(5.5e-5, rel=1e-9))


def test_the_host_fit_needs_a_host_bound_phase_and_refuses_bad_records():
    rows = [("a", _layer_record(4e-4, 1.4e-3, 1e-4, 3e-4)),  # host-bound both ways
            ("d", _layer_record(9e-3, 2.7e-2, 8e-3, 2.5e-2))]  # GPU-bound
    _, stats = fit_host(rows)
    assert (stats["layers"], stats["host_bound_forward"], stats["host_bound_backward"]) == (2, 1, 1)
    with pytest.raises(SynthError, match=r"no host-bound layer in the forward and backward of 1 layer record"):
        fit_host(rows[1:])
    with pytest.raises(SynthError, match=r"^x: forward_backward_kernels \(10\) must exceed forward_kernels \(10\)"):
        fit_host([("x", _layer_record(4e-4, 1.4e-3, 1e-4, 3e-4, (10, 10)))])
    with pytest.raises(SynthError, match="^y: field 'forward_graph_s' must be a number > 0, got -1"):
        fit_host([("y", {**_layer_record(4e-4, 1.4e-3, 1e-4, 3e-4), "forward_graph_s": -1})])


def test_h100_llama_layers_with_the_host_cost_fitted_on_gpt_layers():
    """Held out: the host cost fitted on the GPT layers of the H100 records,
    the Llama layers (SwiGLU widths, grouped-query attention, rotary: no GEMM
    of theirs in the calibration grid) predicted from the shipped operation
    profile, against eager PyTorch: the issue's targets (10% median, 25% p90)."""
    rows = _layer_rows()
    gated = {name: load_model(name).gated_mlp for name in {r["model"] for r in rows}}
    host, _ = fit_host([(str(i), r) for i, r in enumerate(rows) if not gated[r["model"]]])
    profile = replace(load_compute_profile(H100_PROFILE), host=host)
    errors = np.array([layer_compute(profile, load_model(r["model"]), Shard(r["tp"], r["micro_batch"], r["seq"]))
                       .total_s / r["forward_backward_s"] - 1 for r in rows if gated[r["model"]]])
    assert len(errors) == 36
    assert np.median(np.abs(errors)) < 0.10 and np.quantile(np.abs(errors), 0.9) < 0.25


def test_stages_add_embedding_head_recomputation_and_the_fixed_cost():
    p = known_profile(micro_batch_s=1e-3)
    model = load_model("gpt3-125m")
    shard = Shard(1, 2, model.seq)
    layer = layer_compute(p, model, shard)
    middle = stage_compute(p, model, shard, 3, Recompute.NONE, False, False)
    assert middle.total_s == pytest.approx(3 * layer.total_s + 1e-3)
    full = stage_compute(p, model, shard, 3, Recompute.FULL, False, False)
    assert full.total_s == pytest.approx(middle.total_s + 3 * layer.forward_s)
    # selective: the attention core's forward again in each layer's backward, nothing else
    selective = stage_compute(p, model, shard, 3, Recompute.SELECTIVE, False, False)
    core_s = max(p.attention.forward_floor_s,
                 p.attention.forward_gpu_s(2, model.heads, model.seq, model.hidden // model.heads))
    assert core_s > p.attention.forward_floor_s  # above the floor: the shape's own time
    assert selective.total_s == pytest.approx(middle.total_s + 3 * core_s)
    assert selective.forward_s == pytest.approx(middle.forward_s)
    last = stage_compute(p, model, shard, 3, Recompute.NONE, False, True)
    head = head_compute(p, model, shard)
    assert last.total_s == pytest.approx(middle.total_s + head.total_s)
    logits = shard.tokens * model.vocab
    assert [op.seconds for op in head.ops if op.name == "loss"] == [pytest.approx(14 * logits / (6 / 3e-12))]
    assert micro_batch_fixed_s(known_profile()) == pytest.approx(1e-4 - 3e-5)  # from the attention floors


def test_the_planner_uses_the_same_numbers_as_compute(tmp_path, capsys):
    """pp = 1: the plan's compute per micro-batch is the compute command's
    layer times the layers, plus embedding, head and the fixed cost; the
    optimizer step is the plan's own term."""
    save_operation_profile(tmp_path / "p.json", known_profile())
    assert main(["compute", "--compute-profile", str(tmp_path / "p.json"), "--model", "gpt3-125m", "--tp", "2",
                 "--micro-batch", "2", "--json"]) == 0
    layer = json.loads(capsys.readouterr().out)
    assert {"forward_s", "backward_s", "operations"} <= set(layer)
    assert sum(op["seconds"] for op in layer["operations"]) == pytest.approx(layer["forward_s"] + layer["backward_s"])
    model = load_model("gpt3-125m")
    training, config = Training(16), Configuration(2, 8, 1, 2)
    topology = load_topology("dgx-a100").scaled({"node": 2})
    estimate = compute_estimate(model, training, config, topology.device, known_profile())
    shard = Shard(2, 2, model.seq, sequence_parallel=True)  # both default to sequence parallelism at tp 2
    assert layer["sequence_parallel"] is True
    from synth.planner.stagecompute import embedding_compute
    want = (model.layers * (layer["forward_s"] + layer["backward_s"]) + embedding_compute(known_profile(), model, shard)
            .total_s + head_compute(known_profile(), model, shard).total_s + micro_batch_fixed_s(known_profile()))
    assert estimate.micro_batch_s == pytest.approx(want, rel=1e-12)
    request = JobRequest(topology, topology.device, model, training, (AxisRange("tp", 2, 2), AxisRange("dp", 8, 8)),
                         (2,), compute=known_profile())
    best = plan_job(request).candidates[0]
    assert best.step.compute_s == pytest.approx(config.micro_batches(training) * want, rel=1e-12)
    # Megatron-LM (the default framework): Adam on the fp32 master weights (28 bytes per parameter), their
    # copy to the bf16 weights (6), the fp32 main-gradient buffer zeroed (4) and, before each bucket's reduction
    # over dp 8, its NaN check's norm (4) and its scaling by 1/8 (8), at the add bandwidth
    assert best.step.optimizer_s == pytest.approx((28 + 6 + 4 + 4 + 8) * model.parameters / 2 / (6 / 3e-12))


def test_the_slowest_stage_sets_the_pace_and_zero_shards_the_optimizer():
    model, p = load_model("gpt3-125m"), known_profile()
    device = load_topology("dgx-a100").device
    plain = compute_estimate(model, Training(64), Configuration(1, 4, 4, 1), device, p)
    shard = Shard(1, 1, model.seq)
    stages = [stage_compute(p, model, shard, 3, Recompute.NONE, first, last).total_s
              for first, last in ((True, False), (False, True), (False, False))]
    assert plain.micro_batch_s == max(stages)
    sharded = compute_estimate(model, Training(64, sharding=Sharding.ZERO1), Configuration(1, 4, 4, 1), device, p)
    # the distributed optimizer updates a quarter of the stage; Megatron-LM zeroes the whole gradient buffer (4
    # bytes a parameter), takes each bucket's norm (4) and scales it by 1/dp (8)
    zero_s = (4 + 4 + 8) * max(stage_parameters(model, (3, 3, 3, 3)).values()) / (6 / 3e-12)
    assert sharded.optimizer_s - zero_s == pytest.approx((plain.optimizer_s - zero_s) / 4, rel=0.05)
    assert plain.efficiency == pytest.approx(step_shape(model, Training(64), Configuration(1, 4, 4, 1))
                                             .flops_per_micro_batch / (device.peak_flops * plain.micro_batch_s))


def test_h100_topologies_plan_with_the_shipped_profile_and_others_with_the_curve(capsys):
    assert isinstance(default_compute("NVIDIA H100 SXM5 80GB"), OperationProfile)
    assert default_compute("NVIDIA A100 80GB SXM4") is DEFAULT_COMPUTE
    assert shipped_profile_for("h100-sxm5-80gb") == shipped_profile_for("nvidia h100 80gb hbm3")
    assert main(["plan", "--topology", "dgx-h100", "--scale", "node=1", "--model", "gpt3-1.3b", "--global-batch",
                 "16", "--top", "1", "--no-verify", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["compute_profile"]["name"] == "h100-sxm5-80gb"
    assert doc["configurations"][0]["breakdown"]["optimizer"] > 0
    assert main(["plan", "--topology", "dgx-h100", "--scale", "node=1", "--model", "gpt3-1.3b", "--global-batch",
                 "16", "--top", "1", "--no-verify"]) == 0
    out = capsys.readouterr().out
    assert "compute per operation (h100-sxm5-80gb" in out and " optim " in out


# ---------------------------------------------------------------- the fit of the fixed cost on steps


def test_fit_on_step_records_recovers_the_fixed_cost_per_micro_batch(tmp_path, capsys):
    truth = known_profile(micro_batch_s=2.5e-3)
    topology = load_topology("dgx-a100").scaled({"node": 2})
    costs = RecordCosts()
    model = load_model("layers=4,hidden=256,heads=8,seq=128,vocab=1000")
    records = []
    for tp, b in itertools.product((1, 2, 8), (1, 4)):
        placement = enumerate_placements(topology, (Axis("tp", tp), Axis("dp", 16 // tp)))[0]
        record = StepRecord(model, Training(64), placement, Configuration(tp, 16 // tp, 1, b), 1.0)
        records.append(replace(record, step_s=predicted_step_s(record, truth, costs)))
    assert fit_micro_batch_cost(records, known_profile(), costs).micro_batch_s == pytest.approx(2.5e-3, rel=1e-6)
    path = tmp_path / "steps.jsonl"
    write_step_records(path, records)
    save_operation_profile(tmp_path / "base.json", known_profile())
    assert main(["fit", str(path), "--compute-profile", str(tmp_path / "base.json"), "-o",
                 str(tmp_path / "fitted.json")]) == 0
    assert "fixed cost per micro-batch" in capsys.readouterr().out
    fitted = load_compute_profile(tmp_path / "fitted.json")
    assert fitted.micro_batch_s == pytest.approx(2.5e-3, rel=1e-6)
    assert fitted.fit["steps"]["step_max_rel_error"] < 1e-6


# ---------------------------------------------------------------- commands and their errors


def test_compute_command_text_and_errors(cli, tmp_path):
    code, out, _ = cli("compute", "--device", "h100-sxm5-80gb", "--model", "llama2-7b", "--tp", "8")
    assert code == 0 and "one layer on one device of h100-sxm5-80gb" in out and "mlp_up.wgrad" in out
    unknown = usage_error(cli, "compute", "--device", "nosuchgpu", "--model", "gpt3-125m")
    assert unknown.startswith("--device nosuchgpu: no shipped per-operation compute profile (shipped: ")
    assert "h100-sxm5-80gb (NVIDIA H100 80GB HBM3" in unknown
    assert "give --device NAME" in usage_error(cli, "compute", "--model", "gpt3-125m")
    assert usage_error(cli, "compute", "--device", "h100-sxm5-80gb", "--model", "gpt3-125m", "--tp", "5") == (
        "--tp 5: tp=5 does not divide the model's heads (12)")
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"schema": "synth-reduce/compute-profile", "version": 1, "efficiency_max": 0.5,
                                 "half_flops": 0}))
    assert "an efficiency curve (version 1) has no operations" in usage_error(
        cli, "compute", "--compute-profile", curve, "--model", "gpt3-125m")
    save_operation_profile(tmp_path / "k.json", known_profile())
    assert "is for Known GPU; drop --device or give that device" in usage_error(
        cli, "compute", "--compute-profile", tmp_path / "k.json", "--device", "h100-sxm5-80gb", "--model", "gpt3-125m")


def test_calibrate_from_records_and_its_errors(cli, tmp_path):
    out = tmp_path / "h100.compute.json"
    code, text, _ = cli("calibrate", "--records", H100_RECORDS, "--units", "132", "--out", out)
    assert code == 0 and "fitted 302 operation records" in text and "gemm" in text and "host:" not in text
    assert load_compute_profile(out).name == "h100" and load_compute_profile(out).host == HostModel()
    code, text, _ = cli("calibrate", "--records", H100_RECORDS, "--units", "132", "--out", out,
                        "--layer-records", H100_LAYERS)
    shipped = load_compute_profile(H100_PROFILE).host
    assert code == 0 and (f"host: {shipped.forward_launch_s * 1e6:.1f} us per kernel launch forward, "
                          f"{shipped.backward_launch_s * 1e6:.1f} backward (fitted on 96 layers, 9 and 9 of their phases "
                          "host-bound)") in text
    assert load_compute_profile(out).host == load_compute_profile(H100_PROFILE).host
    assert "no host-bound layer" in usage_error(cli, "calibrate", "--records", H100_RECORDS, "--units", "132",
                                                "--out", out, "--layer-records", H100_RECORDS)
    assert "--units N: the records do not say how many streaming multiprocessors" in usage_error(
        cli, "calibrate", "--records", H100_RECORDS, "--out", out)
    assert "does not exist" in usage_error(cli, "calibrate", "--records", H100_RECORDS, "--units", "132", "--out",
                                           tmp_path / "missing" / "p.json")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"op": "gemm", "M": 1}\n')
    assert usage_error(cli, "calibrate", "--records", bad, "--units", "132", "--out", out) == (
        f"{bad}:1: field 'K' must be an integer >= 1, got None")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_calibrate_on_the_cpu_measures_and_fits(tmp_path):
    """The measuring path end to end on a tiny grid (PyTorch on the CPU): a
    progress line per family on stderr, the records kept, a profile that
    loads and prices a layer."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    out, records = tmp_path / "cpu.compute.json", tmp_path / "ops.jsonl"
    done = subprocess.run([sys.executable, "-m", "synth.cli", "calibrate", "--device", "cpu", "--out", str(out),
                           "--records-out", str(records)], capture_output=True, text=True, cwd=REPO, timeout=280,
                          # one intra-op thread: the suite's two workers share the machine's cores
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    progress = [line for line in done.stderr.splitlines() if line.startswith("calibrate: ")]
    assert len(progress) == 4 and "GEMM shapes measured" in progress[1], done.stderr
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) == len(CPU_GRID.gemm_shapes()) + 4 + 4 * len(CPU_GRID.elements)
    profile = load_compute_profile(out)
    assert isinstance(profile, OperationProfile) and profile.devices == ("cpu",)
    layer = layer_compute(profile, load_model("layers=2,hidden=128,heads=4,seq=64,vocab=100"), Shard(1, 1, 64))
    assert layer.forward_s > 0 and layer.backward_s > layer.forward_s / 10


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_layer_accuracy_script_measures_on_the_cpu_and_compares(tmp_path):
    """scripts/layer_accuracy.py's mechanics on tiny models: every layer and
    step record written, the measured networks holding exactly the model's
    parameters (compare refuses otherwise), and the comparison's tables."""
    import subprocess
    import sys
    out = tmp_path / "layers.jsonl"
    script = REPO / "scripts" / "layer_accuracy.py"
    done = subprocess.run([sys.executable, str(script), "measure", "--device", "cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["kind"] for r in rows].count("host") == 1
    assert sum(r["kind"] == "layer" and "error" not in r for r in rows) == 8
    steps = [r for r in rows if r["kind"] == "step"]
    assert len(steps) == 6 and all(r["step_s"] > r["optimizer_s"] > 0 for r in steps)
    for r in steps:
        model = replace(load_model(r["model"]), layers=r["layers"], seq=r["seq"])
        assert r["parameters"] == model.parameters
    done = subprocess.run([sys.executable, str(script), "compare", str(out), "--compute-profile", str(H100_PROFILE)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| all | forward+backward |" in done.stdout
    assert done.stdout.count("micro-batch ranking, ") == 2


# ---------------------------------------------------------------- FP8 GEMMs


def test_fp8_speedup_is_the_median_of_the_transcribed_measurements():
    """FP8_GEMM_SPEEDUP is the median, over data/fp8_gemm_h100.jsonl's shapes,
    of FP8 (row-wise scaled, scaling included) over BF16 TFLOP/s."""
    from synth.planner.optimes import FP8_GEMM_SPEEDUP

    rows = [json.loads(line) for line in (REPO / "data" / "fp8_gemm_h100.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all("FBGEMM pull request #2546" in r["source"] for r in rows)
    ratios = sorted(r["fp8_rowwise_scaled_tflops"] / r["bf16_tflops"] for r in rows)
    assert FP8_GEMM_SPEEDUP == ratios[1]


@pytest.mark.parametrize("spec", [
    "layers=2,hidden=256,heads=4,seq=128,vocab=1000",
    "layers=2,hidden=256,heads=4,kv_heads=2,ffn=688,mlp=swiglu,seq=128,vocab=1000,experts=4,top_k=2,expert_ffn=128,"
    "shared_experts=1"])
def test_fp8_runs_the_layers_gemms_faster_and_nothing_else(spec):
    """With --dtype fp8 every GEMM of a layer (dense, shared and routed
    experts) runs its tiles at FP8_GEMM_SPEEDUP x the 16-bit rate and reads
    its operands at one byte a value, while the call's fixed cost stays (by
    hand: max(floor, tile FLOPs / FP8 rate, bytes / bandwidth)); attention,
    elementwise passes, the router and the logits are unchanged."""
    from synth.planner.optimes import FP8_GEMM_SPEEDUP

    p, model = known_profile(), parse_inline_model(spec)
    moe = model.moe is not None
    for shard in (Shard(2, 2, 128, ep=2 if moe else 1), Shard(2, 64, 128, ep=2 if moe else 1)):
        plain = layer_compute(p, model, shard, moe)
        fp8 = layer_compute(p, model, replace(shard, fp8=True), moe)
        assert [op.name for op in plain.ops] == [op.name for op in fp8.ops]
        gemms = 0
        for a, b in zip(plain.ops, fp8.ops):
            is_gemm = a.name.split(".")[0] in ("qkv", "attention_projection", "mlp_up", "mlp_down", "shared_up",
                                               "shared_down", "expert_up", "expert_down")
            gemms += is_gemm
            if not is_gemm:
                assert b.seconds == a.seconds
                continue
            m, k, n = b.shape  # each call's shape; count calls (the device's experts)
            tiles = float(tiled_flops(m, k, n, 100, DEFAULT_TILES, 256))
            fp8_bytes_s = (m * k + k * n + 2 * m * n) / 2e12  # FP8 operands, a 16-bit product
            assert b.seconds == pytest.approx(b.count * max(2e-5, tiles / (5e14 * FP8_GEMM_SPEEDUP), fp8_bytes_s))
            assert a.seconds == pytest.approx(a.count * max(2e-5, tiles / 5e14, 2 * (m * k + k * n + m * n) / 2e12))
        assert gemms == (18 if moe else 12)  # QKV, projection and the MLP's two or the experts' four, x3
    head = head_compute(p, model, Shard(2, 64, 128, fp8=True))
    assert head == head_compute(p, model, Shard(2, 64, 128))  # the logits GEMM stays 16-bit


def test_fp8_gains_where_the_tiles_bound_a_gemm():
    """A layer of hidden 4096 at 8,192 tokens: every GEMM is bound by its
    tiles, and FP8 divides each by FP8_GEMM_SPEEDUP; at 256 tokens of hidden
    256 the calls' fixed cost bounds them and FP8 gains nothing."""
    from synth.planner.optimes import FP8_GEMM_SPEEDUP

    p = known_profile()
    big = parse_inline_model("layers=2,hidden=4096,heads=32,seq=2048,vocab=1000")
    small = parse_inline_model("layers=2,hidden=256,heads=4,seq=128,vocab=1000")
    for model, shard, gain in ((big, Shard(1, 4, 2048), FP8_GEMM_SPEEDUP), (small, Shard(2, 2, 128), 1.0)):
        plain, fp8 = layer_compute(p, model, shard), layer_compute(p, model, replace(shard, fp8=True))
        ratios = [a.seconds / b.seconds for a, b in zip(plain.ops, fp8.ops) if a.seconds != b.seconds or
                  a.name.split(".")[0] in ("qkv", "attention_projection", "mlp_up", "mlp_down")]
        assert len(ratios) == 12 and ratios == pytest.approx([gain] * 12)


def test_fp8_with_the_efficiency_curve_by_hand():
    """With the curve, the layers' GEMM FLOPs (3 x forward, and once more when
    fully recomputed) go FP8_GEMM_SPEEDUP times faster, the rest (attention
    core, logits) as in BF16; memory is BF16's; an A100 has no FP8."""
    from synth.planner.optimes import FP8_GEMM_SPEEDUP
    from synth.planner.stepmodel import memory_per_device

    model = load_model("gpt3-1.3b")
    curve = EfficiencyCurve(0.5, 0.0)
    # without a memory bandwidth: the FLOPs alone (the bandwidth-bound passes, synth/planner/curvepasses.py,
    # do not change with the GEMMs' dtype)
    device = replace(load_topology("dgx-h100").device, memory_bandwidth_GBps=None)
    config = Configuration(1, 1, 1, 2)
    for recompute in (Recompute.NONE, Recompute.FULL):
        bf16 = compute_estimate(model, Training(8, recompute=recompute), config, device, curve)
        fp8 = compute_estimate(model, Training(8, dtype="fp8", recompute=recompute), config, device, curve)
        T, L, h, s, V = 2 * 2048, model.layers, model.hidden, 2048, model.vocab
        q = 24 * 128  # the attention's width: Table 2.1's 24 heads of d_head 128 (models/gpt3-1.3b.yaml)
        gemm = 2 * T * L * model.layer_matrix_params
        total = 3 * (gemm + L * 4 * T * s * q + 2 * T * h * V) + (gemm + L * 4 * T * s * q if recompute is
                                                                   Recompute.FULL else 0)
        share = (3 * gemm + (gemm if recompute is Recompute.FULL else 0)) / total
        assert fp8.micro_batch_s == pytest.approx(bf16.micro_batch_s * (1 - share + share / FP8_GEMM_SPEEDUP))
        assert memory_per_device(model, Training(8, dtype="fp8", recompute=recompute), config) == memory_per_device(
            model, Training(8, recompute=recompute), config)
    topology = load_topology("dgx-a100")
    with pytest.raises(SynthError, match="--dtype fp8: topology 'dgx-a100' has GPUs of compute capability 8.0, "
                                         "without FP8 tensor cores"):
        JobRequest(topology, topology.device, model, Training(8, dtype="fp8"), (AxisRange("dp"),))


def _attention_by_hand(b, h, queries, d, causal=True, keys=None):
    """known_profile's attention (block 128, 100 units, 2 row blocks, 4e14 and
    3e14 FLOP/s, the backward 2.5x the forward's FLOPs): forward and backward
    GPU seconds of ``queries`` against ``keys`` (None: self-attention)."""
    q_blocks = math.ceil(queries / 128)
    k_blocks = q_blocks if keys is None else math.ceil(keys / 128)
    pairs = (q_blocks * (q_blocks + 1) / 2 if causal else q_blocks * q_blocks) if keys is None else q_blocks * k_blocks
    critical = max(math.ceil(b * h * (pairs + 2 * q_blocks) / 100), k_blocks + 2) * 4 * 128 * 128 * d
    return critical * 100 / 4e14, critical * 2.5 * 100 / 3e14


@pytest.mark.parametrize("cp", [2, 4])
def test_context_parallel_per_operation_compute(cp):
    """With cp each device runs b s / cp tokens through the GEMMs and
    elementwise passes, and ring attention's cp calls per pass (by hand): the
    causal attention of its own s / cp queries and keys, then per ring step
    its s / cp queries against s / (2 cp) keys, each above the floor; their
    block pairs are 1 / cp of the whole sequence's causal ones."""
    p, model = known_profile(), parse_inline_model("layers=2,hidden=256,heads=4,seq=1024,vocab=1000")
    split = layer_compute(p, model, Shard(1, 2, 1024, cp=cp))
    shorter = layer_compute(p, model, Shard(1, 1, 2048 // cp))  # the same b s / cp tokens in one sequence
    local = 1024 // cp
    diagonal, step = _attention_by_hand(2, 4, local, 64), _attention_by_hand(2, 4, local, 64, keys=local // 2)
    floor = p.attention.forward_floor_s
    expected = {"attention": max(floor, diagonal[0]) + (cp - 1) * max(floor, step[0]),
                "attention.backward": max(floor, diagonal[1]) + (cp - 1) * max(floor, step[1])}
    blocks, key_blocks, whole = local // 128, local // 256, 1024 // 128
    assert blocks * (blocks + 1) / 2 + (cp - 1) * blocks * key_blocks == whole * (whole + 1) / 2 / cp
    for a, c in zip(split.ops, shorter.ops):
        if a.name in expected:
            assert a.seconds == pytest.approx(expected[a.name])
        elif a.name != "host_issue":
            assert a.seconds == pytest.approx(c.seconds), a.name


def test_the_h200_fp8_records_bound_the_planners_fp8_speed_up():
    """data/calibration/h200-fp8.jsonl (scripts/fp8_gemm_check.py): each
    record's TFLOP/s are its FLOPs over its seconds, and on the large shapes
    (FBGEMM's and the 8,192-token layer GEMMs) the FP8 GEMM alone is faster than
    the planner's FP8 speed-up with scaling included (FP8_GEMM_SPEEDUP), which
    it must leave room for; the small tensor-parallel slice is not (docs say so)."""
    from synth.planner.optimes import FP8_GEMM_SPEEDUP

    rows = [r for _, _, r in _json_lines(REPO / "data" / "calibration" / "h200-fp8.jsonl")]
    assert len(rows) == 9
    for r in rows:
        m, n, k = r["shape_mnk"]
        for kind in ("bf16", "fp8_rowwise_gemm_only", "fp8_rowwise_eager_quantised"):
            assert r[f"{kind}_tflops"] == pytest.approx(2 * m * n * k / r[f"{kind}_s"] / 1e12, rel=1e-9)
        gemm_speed_up = r["bf16_s"] / r["fp8_rowwise_gemm_only_s"]
        if m >= 8192:
            assert gemm_speed_up > FP8_GEMM_SPEEDUP, r["why"]
    assert min(r["bf16_s"] / r["fp8_rowwise_gemm_only_s"] for r in rows) < 1  # the 2048 x 1024 x 4096 slice


def test_the_h200_ring_attention_records_agree_with_the_planners_ring_pass():
    """data/calibration/h200-ring-attention.jsonl (scripts/ring_attention_check.py
    on an H200): each configuration's calls have the shapes of Transformer
    Engine's load-balanced ring (own: s / cp causal; step: s / cp queries
    against s / (2 cp) keys; whole: s causal), and its measured forward pass,
    own + (cp - 1) steps, is within 15% of attention_ops with the shipped H200
    profile (the measured ratios were 0.96-1.14; docs/planner.md)."""
    from synth.planner.compute import default_compute
    from synth.planner.layercompute import attention_ops
    from synth.planner.modelspec import load_model

    rows = [r for _, _, r in _json_lines(REPO / "data" / "calibration" / "h200-ring-attention.jsonl")]
    configs: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        configs.setdefault((r["model"], r["tp"], r["seq"], r["cp"]), {})[r["call"]] = r
    assert len(configs) == 6 and all(set(calls) == {"own", "step", "whole"} for calls in configs.values())
    profile = default_compute(rows[0]["gpu"])
    assert profile.name == "h200-sxm-141gb"
    for (name, tp, seq, cp), calls in configs.items():
        model = load_model(name)
        for call, queries, keys, causal in (("own", seq // cp, seq // cp, True), ("step", seq // cp, seq // (2 * cp),
                                                                                  False), ("whole", seq, seq, True)):
            r = calls[call]
            assert (r["queries"], r["keys"], r["causal"]) == (queries, keys, causal)
            assert (r["heads"], r["head_dim"]) == (model.heads // tp, model.hidden // model.heads)
        measured_s = calls["own"]["fwd_s"] + (cp - 1) * calls["step"]["fwd_s"]
        forward = [op for op in attention_ops(profile, model, Shard(tp, 1, seq, cp=cp)) if op.phase == "forward"]
        assert forward[0].seconds == pytest.approx(measured_s, rel=0.15), (name, seq, cp)


def test_the_ring_attention_script_compares_and_names_a_missing_profile(tmp_path):
    """scripts/ring_attention_check.py compare on the committed records: a row
    per call and per ring pass; records of a GPU no shipped profile names are
    refused with the option to pass."""
    import subprocess
    import sys
    script, records = REPO / "scripts" / "ring_attention_check.py", REPO / "data/calibration/h200-ring-attention.jsonl"
    done = subprocess.run([sys.executable, str(script), "compare", str(records)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    passes = done.stdout.split("ring pass")[1].splitlines()[2:]
    assert len([line for line in passes if line.strip()]) == 6
    assert len([line for line in done.stdout.split("ring pass")[0].splitlines() if " cp" in line]) == 18
    other = tmp_path / "other.jsonl"
    other.write_text(records.read_text().replace("NVIDIA H200", "Some GPU"))
    done = subprocess.run([sys.executable, str(script), "compare", str(other)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("ring_attention_check: no per-operation profile for 'Some GPU': "
                                   "pass --profile P.compute.json")
